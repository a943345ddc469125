//! kvstoremesh, started: the config directory and its watcher, the mesh of remotes (the
//! agent's [`ClusterMesh`] over [`CacheStores`]), the cache writer and readiness.
//!
//! ```text
//! --clustermesh-config DIR ─▶ ConfigDirWatcher ─ClusterConfigEvent─▶ ClusterMesh<CacheStores>
//!   per remote: Runner (connect, cluster config, ID, canaries) ─▶ four WatchStore<Validated<D>, CacheMirror>
//!     connected ─CacheOp::Config──────────┐        changes, first list-dones ─Vec<CacheOp>─┐
//!                                         ▼                                                ▼
//!                               CacheWriter (lease Writer over the local etcd) ─ canary written ─▶ Readiness ─▶ /readyz
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, Addr};
use meshwork_clustermesh::config_dir::{ConfigDirError, ConfigDirWatcher, StopWatching};
use meshwork_clustermesh::mesh::{ClusterMesh, GetMeshStatus, ShutdownMesh};
use meshwork_clustermesh::metrics::MeshMetrics;
use meshwork_clustermesh::remote_cluster::heartbeat::HeartbeatSettings;
use meshwork_clustermesh::remote_cluster::runner::MeshSettings;
use meshwork_clustermesh::status::ClusterStatus;
use meshwork_kvstore::{EtcdBackend, KvstoreError};
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::api::StatusApi;
use crate::keys::CacheOp;
use crate::metrics::CacheMetrics;
use crate::readiness::{self, Readiness};
use crate::stores::{CacheSinks, CacheStores, drain_removed};
use crate::writer::CacheWriter;

/// How long the cache writer's own connection to the local etcd may take.
const WRITER_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How kvstoremesh runs (Cilium's kvstoremesh flags).
#[derive(Debug, Clone)]
pub struct Settings {
    /// The local cluster (a remote of the same name is refused).
    pub cluster_name: String,
    /// The local cluster's ID (no remote may use it).
    pub cluster_id: u32,
    /// 255 or 511.
    pub max_connected_clusters: u32,
    /// One file per remote cluster, as the agent's.
    pub config_dir: PathBuf,
    /// TTL of the leases the cache is written under.
    pub lease_ttl: Duration,
    /// A remote that does not connect within this is not waited for (`--per-cluster-ready-timeout`).
    pub per_cluster_ready_timeout: Duration,
    /// Ready regardless after this (`--global-ready-timeout`).
    pub global_ready_timeout: Duration,
    /// Between deleting a removed remote's config and its entries (`--cache-removal-grace`).
    pub removal_grace: Duration,
    /// When a remote's heartbeat is stale, and how many stale checks reconnect.
    pub heartbeat: HeartbeatSettings,
}

impl Settings {
    /// Cilium's defaults for `cluster_name` (ID `cluster_id`) reading `config_dir`.
    pub fn new(
        cluster_name: impl Into<String>,
        cluster_id: u32,
        config_dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            cluster_name: cluster_name.into(),
            cluster_id,
            max_connected_clusters: meshwork_types::DEFAULT_MAX_CONNECTED_CLUSTERS,
            config_dir: config_dir.into(),
            lease_ttl: Duration::from_secs(15 * 60),
            per_cluster_ready_timeout: Duration::from_secs(15),
            global_ready_timeout: Duration::from_secs(10 * 60),
            removal_grace: Duration::from_secs(3 * 60),
            heartbeat: HeartbeatSettings::default(),
        }
    }
}

/// Why kvstoremesh could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The config directory cannot be read.
    #[error("reading the clustermesh config directory: {0}")]
    ConfigDir(#[from] ConfigDirError),
    /// The local etcd failed while the cache was adopted.
    #[error("reading the cache in the local etcd: {0}")]
    Adopt(#[from] KvstoreError),
    /// The mesh actor is gone.
    #[error("the cluster mesh stopped while starting")]
    MeshGone,
    /// The cache writer's thread or runtime could not be made.
    #[error("starting the cache writer: {0}")]
    Runtime(String),
}

/// A running kvstoremesh.
pub struct KvstoreMesh {
    mesh: Addr<ClusterMesh<CacheStores>>,
    watcher: Addr<ConfigDirWatcher>,
    mesh_metrics: Arc<MeshMetrics>,
    metrics: CacheMetrics,
    ready: watch::Receiver<bool>,
    stop_writer: CancellationToken,
    writer: JoinHandle<()>,
    /// `--clustermesh-config`, for the status API.
    config_dir: PathBuf,
}

impl KvstoreMesh {
    /// Starts kvstoremesh over the local etcd `backend`; its metrics go to `registry`.
    /// Must run inside an actix system.
    pub async fn start(
        backend: EtcdBackend,
        settings: Settings,
        registry: &mut Registry,
    ) -> Result<Self, StartError> {
        let started = Instant::now();
        let (state, events) =
            ConfigDirWatcher::read_initial(&settings.config_dir, &settings.cluster_name)?;
        let remotes: Vec<Arc<str>> = state.clusters().map(Arc::from).collect();
        let (metrics, mesh_metrics, kvstore_metrics) = CacheMetrics::register(registry);
        let (readiness_tx, readiness_rx) = mpsc::unbounded_channel();
        // Boxed: adopting reads the whole cache, a large future to carry inline.
        let writer = Box::pin(CacheWriter::adopt(
            backend,
            &remotes,
            settings.lease_ttl,
            readiness_tx.clone(),
            metrics.clone(),
        ))
        .await?
        .heartbeat_every(settings.heartbeat.interval);
        let orphans: Vec<Arc<str>> = writer.orphans().cloned().collect();
        let (ops, ops_rx) = mpsc::unbounded_channel();
        let stop_writer = CancellationToken::new();
        let writer = spawn_writer(writer, ops_rx, stop_writer.clone()).await?;

        let (ready_tx, ready) = watch::channel(false);
        let readiness = Readiness::new(
            remotes.iter().cloned(),
            started,
            settings.per_cluster_ready_timeout,
            settings.global_ready_timeout,
        );
        tokio::spawn(readiness::run(readiness, readiness_rx, ready_tx));
        let mut bootstrap = ready.clone();
        let bootstrap_seconds = metrics.bootstrap_seconds.clone();
        tokio::spawn(async move {
            if bootstrap.wait_for(|ready| *ready).await.is_ok() {
                bootstrap_seconds.set(started.elapsed().as_secs_f64());
            }
        });

        let mesh_settings = MeshSettings {
            max_connected_clusters: settings.max_connected_clusters,
            heartbeat: settings.heartbeat,
            ..MeshSettings::new(&settings.cluster_name)
        };
        let sinks = CacheSinks {
            ops,
            readiness: readiness_tx,
            removal_grace: settings.removal_grace,
        };
        for orphan in orphans {
            let sinks = sinks.clone();
            tokio::spawn(async move { drain_removed(orphan, &sinks).await });
        }
        let mesh = ClusterMesh::<CacheStores>::with_stores(
            mesh_settings,
            settings.cluster_id,
            None,
            sinks,
            kvstore_metrics,
        )
        .start();
        for event in events {
            mesh.send(event).await.map_err(|_| StartError::MeshGone)?;
        }
        let watcher = ConfigDirWatcher::new(state, mesh.clone().recipient()).start();
        tracing::info!(remotes = remotes.len(), "kvstoremesh running");
        Ok(Self {
            mesh,
            watcher,
            mesh_metrics: Arc::new(mesh_metrics),
            metrics,
            ready,
            stop_writer,
            writer,
            config_dir: settings.config_dir,
        })
    }

    /// Turns `true` once every remote known at start is cached (see [`readiness`]).
    pub fn ready(&self) -> watch::Receiver<bool> {
        self.ready.clone()
    }

    /// Every remote's status, sorted by name (its stores are the cache's sources).
    pub async fn status(&self) -> Vec<ClusterStatus> {
        self.mesh.send(GetMeshStatus).await.unwrap_or_default()
    }

    /// The remote-cluster metrics, refreshed from [`Self::status`] before a scrape.
    pub fn mesh_metrics(&self) -> Arc<MeshMetrics> {
        Arc::clone(&self.mesh_metrics)
    }

    /// The status API, reporting `local_endpoints` as the local etcd's.
    pub fn status_api(&self, local_endpoints: impl Into<String>) -> StatusApi {
        StatusApi {
            mesh: self.mesh.clone(),
            ready: self.ready.clone(),
            metrics: self.metrics.clone(),
            local_endpoints: local_endpoints.into(),
            // Absolute: meshctl may run elsewhere than kvstoremesh's working directory.
            config_dir: std::path::absolute(&self.config_dir)
                .unwrap_or_else(|_| self.config_dir.clone())
                .to_string_lossy()
                .into_owned(),
        }
    }

    /// A handle to ask for status from elsewhere (the metrics refresh, the status API).
    pub fn mesh(&self) -> Addr<ClusterMesh<CacheStores>> {
        self.mesh.clone()
    }

    /// Stops watching, stops every remote (nothing is drained: the cache stays for the
    /// next kvstoremesh to adopt), then writes what has arrived.
    pub async fn shutdown(self) {
        self.watcher.do_send(StopWatching);
        let _ = self.mesh.send(ShutdownMesh).await;
        self.stop_writer.cancel();
        let _ = self.writer.await;
    }
}

/// Runs the cache writer on a thread and runtime of its own, over a connection of its own:
/// a start's thousand stores decoding pages on the shared workers kept the writer's replies
/// waiting in their queue (writes of a few hundred keys took 1.4 s while the remotes were
/// read), so the cache was written only after the remotes were read, not while.
async fn spawn_writer(
    mut writer: CacheWriter,
    ops: mpsc::UnboundedReceiver<Vec<CacheOp>>,
    stop: CancellationToken,
) -> Result<JoinHandle<()>, StartError> {
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let thread = std::thread::Builder::new()
        .name("cache-writer".to_owned())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(err) => {
                    let _ = started_tx.send(Err(StartError::Runtime(err.to_string())));
                    return;
                }
            };
            runtime.block_on(async move {
                match writer
                    .writer_backend()
                    .reconnect(WRITER_CONNECT_TIMEOUT)
                    .await
                {
                    Ok(backend) => writer.set_backend(backend),
                    Err(err) => {
                        let _ = started_tx.send(Err(StartError::Adopt(err)));
                        return;
                    }
                }
                let _ = started_tx.send(Ok(()));
                writer.run(ops, stop).await;
            });
        })
        .map_err(|err| StartError::Runtime(err.to_string()))?;
    started.await.map_err(|_| StartError::MeshGone)??;
    Ok(tokio::task::spawn_blocking(move || {
        let _ = thread.join();
    }))
}
