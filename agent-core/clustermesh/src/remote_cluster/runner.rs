//! One remote cluster's connection loop: connect, fetch and validate the cluster config,
//! reserve the cluster ID, run the stores behind the canary manager, and watch the cluster
//! config as the watchdog. Any failure disconnects, counts, and reconnects after a backoff
//! (at most 30 s); a changed cluster ID drains the stores and starts over.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use actix::Recipient;
use backon::{BackoffBuilder, ExponentialBuilder};
use meshwork_kvstore::shared::SharedBackends;
use meshwork_kvstore::{
    EtcdBackend, KvstoreError, KvstoreMetrics, ListPage, TxnRead, WatchEvent, WatchStoreManager,
    keys,
};
use meshwork_types::{ClusterConfig, ClusterConfigError};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::heartbeat::{self, HeartbeatSettings};
use super::prefixes::ClusterPrefixes;
use super::stores::{ClusterStores, StoreStatuses};
use super::{DrainReason, StoreSet};
use crate::cluster_ids::{ReserveClusterId, ReserveError};
use crate::config_dir::RemoteClusterConfig;
use crate::events::ClusterRef;
use crate::timeline::{Step, TimelineRecorder};

/// Most canaries read along with the cluster config (a remote has one per prefix, five at
/// most); more than that, and the canary store lists them itself.
const CANARIES_READ_AHEAD: i64 = 64;

/// The first read of a connection to `cluster`: `cilium/.has-cluster-config`, the cluster
/// config and the heartbeat (in that order in [`TxnRead::values`]) and the canaries, in one
/// round trip and one read transaction on the server, at the revision the watchdog and the
/// canary store then watch from. 250 remotes behind kvstoremesh all read the one local etcd
/// at once, each a transaction etcd spends about 0.4 ms of CPU on: a shared connection sends
/// the reads that overlap together (`EtcdBackend::with_batched_reads`). etcd refuses a
/// transaction whole when the user may not read one of its keys.
pub async fn read_cluster_config(
    backend: &EtcdBackend,
    cluster: &str,
) -> Result<TxnRead, KvstoreError> {
    let key = format!("{}/{cluster}", keys::CLUSTER_CONFIG_PREFIX);
    backend
        .get_all_and_list(
            &[keys::HAS_CLUSTER_CONFIG_KEY, &key, keys::HEARTBEAT_KEY],
            &keys::synced_prefix(cluster),
            CANARIES_READ_AHEAD,
        )
        .await
}

/// Settings shared by every remote cluster of the agent.
#[derive(Debug, Clone)]
pub struct MeshSettings {
    /// Our own cluster's name.
    pub local_cluster: String,
    /// `--max-connected-clusters` (255 or 511).
    pub max_connected_clusters: u32,
    /// How long one connection attempt may take.
    pub connect_timeout: Duration,
    /// First delay before reconnecting.
    pub min_retry_delay: Duration,
    /// Longest delay between reconnects (Cilium: 30 s).
    pub max_retry_delay: Duration,
    /// The etcd clients, one per distinct etcd config: remotes read through kvstoremesh
    /// (every one at the local etcd) share one connection.
    pub backends: SharedBackends,
    /// When a remote's heartbeat is stale and how many stale checks reconnect.
    pub heartbeat: HeartbeatSettings,
    /// Where each connection is recorded (the agent's restart timeline; none by default).
    pub timeline: TimelineRecorder,
}

impl MeshSettings {
    /// Cilium's defaults for `local_cluster`.
    pub fn new(local_cluster: impl Into<String>) -> Self {
        Self {
            local_cluster: local_cluster.into(),
            max_connected_clusters: meshwork_types::DEFAULT_MAX_CONNECTED_CLUSTERS,
            connect_timeout: Duration::from_secs(10),
            min_retry_delay: Duration::from_secs(1),
            max_retry_delay: Duration::from_secs(30),
            backends: SharedBackends::default(),
            heartbeat: HeartbeatSettings::default(),
            timeline: TimelineRecorder::default(),
        }
    }
}

/// What the connection loop reports about itself.
#[derive(Debug, Clone, Default)]
pub struct ConnectionState {
    /// The etcd connection is up.
    pub connected: bool,
    /// The retrieved cluster ID.
    pub cluster_id: u32,
    /// `cilium/.has-cluster-config` exists.
    pub config_required: bool,
    /// The config was retrieved and validated.
    pub config_retrieved: bool,
    /// Failures so far.
    pub failures: u64,
    /// When the last one happened.
    pub last_failure: Option<SystemTime>,
    /// What keeps the cluster from being ready now.
    pub last_error: Option<String>,
    /// The current stores' live status (none before the first connection got an ID).
    pub stores: Option<Arc<StoreStatuses>>,
    /// When the remote last wrote its heartbeat (the time it wrote, or when the write was
    /// seen if that does not parse); none before one was read.
    pub last_heartbeat: Option<SystemTime>,
    /// The remote is read from a kvstoremesh cache (its config says `cached`).
    pub cached: bool,
}

/// Why a connection attempt ended.
#[derive(Debug, thiserror::Error)]
pub enum RemoteClusterError {
    /// etcd is unreachable or failed.
    #[error(transparent)]
    Kvstore(#[from] KvstoreError),
    /// The remote says a config is required but has none.
    #[error("cluster configuration expected but not found (cilium/cluster-config/{0})")]
    ConfigMissing(String),
    /// The config does not decode.
    #[error("invalid cluster configuration: {0}")]
    ConfigMalformed(String),
    /// The config is not acceptable for this agent.
    #[error("invalid cluster configuration: {0}")]
    ConfigInvalid(ClusterConfigError),
    /// The ID could not be reserved (another remote cluster holds it).
    #[error(transparent)]
    Reserve(#[from] ReserveError),
    /// The config was deleted while required.
    #[error("cluster configuration was removed")]
    ConfigRemoved,
    /// The mesh is gone (agent shutting down).
    #[error("the cluster mesh stopped")]
    MeshGone,
    /// The remote's heartbeat went stale too many checks in a row.
    #[error("{0}")]
    Quorum(String),
}

// The cause is in the message: converting does not also make it the error's source, so no
// chain prints it twice.
impl From<ClusterConfigError> for RemoteClusterError {
    fn from(error: ClusterConfigError) -> Self {
        Self::ConfigInvalid(error)
    }
}

enum Ended {
    Cancelled,
    Restart(&'static str),
}

/// Everything the loop of one remote cluster needs.
pub struct Runner<S: StoreSet = ClusterStores> {
    /// The cluster (incarnation) the loop connects.
    pub cluster: ClusterRef,
    /// The cluster's config file content.
    pub config: RemoteClusterConfig,
    /// Agent-wide settings.
    pub settings: MeshSettings,
    /// Where the stores send.
    pub sinks: S::Sinks,
    /// Cluster ID reservations.
    pub ids: Recipient<ReserveClusterId>,
    /// Store metrics.
    pub metrics: KvstoreMetrics,
    /// Published state.
    pub state: watch::Sender<ConnectionState>,
}

impl<S: StoreSet> Runner<S> {
    /// Runs until `cancel` fires, with the stores an earlier run of this cluster left (kept
    /// across connections; replaced when the cluster ID changes). Returns the stores.
    pub async fn run(self, mut stores: Option<S>, cancel: CancellationToken) -> Option<S> {
        let name = self.config.name.clone();
        let mut backoff = self.backoff();
        loop {
            if cancel.is_cancelled() {
                break;
            }
            match self.connection(&mut stores, &cancel).await {
                Ok(Ended::Cancelled) => break,
                Ok(Ended::Restart(why)) => {
                    tracing::info!(cluster = %name, why, "reconnecting to the remote cluster");
                    backoff = self.backoff();
                }
                Err(err) => {
                    tracing::warn!(cluster = %name, %err, "remote cluster connection failed; retrying");
                    self.state.send_modify(|s| {
                        s.connected = false;
                        s.failures += 1;
                        s.last_failure = Some(SystemTime::now());
                        s.last_error = Some(err.to_string());
                    });
                    let delay = backoff.next().unwrap_or(self.settings.max_retry_delay);
                    tokio::select! {
                        () = cancel.cancelled() => break,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
        self.state.send_modify(|s| s.connected = false);
        stores
    }

    fn backoff(&self) -> impl Iterator<Item = Duration> + use<S> {
        ExponentialBuilder::default()
            .with_min_delay(self.settings.min_retry_delay)
            .with_max_delay(self.settings.max_retry_delay)
            .with_jitter()
            .without_max_times()
            .build()
    }

    async fn connection(
        &self,
        stores: &mut Option<S>,
        cancel: &CancellationToken,
    ) -> Result<Ended, RemoteClusterError> {
        let backends = &self.settings.backends;
        let shared = tokio::select! {
            () = cancel.cancelled() => return Ok(Ended::Cancelled),
            shared = backends.connect(&self.config.etcd, self.settings.connect_timeout) => shared?,
        };
        let ended = self.session(&shared.backend, stores, cancel).await;
        if ended.is_err() {
            // The next connect opens a new connection; other remotes on it find out alone.
            backends.evict(&self.config.etcd, shared.generation).await;
        }
        ended
    }

    /// One session over a connected `backend`: the cluster config, the stores, the watchdog.
    async fn session(
        &self,
        backend: &EtcdBackend,
        stores: &mut Option<S>,
        cancel: &CancellationToken,
    ) -> Result<Ended, RemoteClusterError> {
        let name = &self.config.name;
        // What the previous connection retrieved is not known to hold any more.
        self.state.send_modify(|s| {
            s.connected = true;
            s.config_retrieved = false;
            s.cluster_id = 0;
            s.last_heartbeat = None;
        });
        let (config, revision, canaries) = self.fetch_config(backend).await?;
        self.state.send_modify(|s| {
            s.cluster_id = config.id;
            s.config_retrieved = s.config_required || config.id != 0;
            s.cached = config.capabilities.cached;
        });
        if config.id != 0 {
            self.ids
                .send(ReserveClusterId {
                    cluster: self.cluster.clone(),
                    id: config.id,
                })
                .await
                .map_err(|_| RemoteClusterError::MeshGone)??;
        }
        self.state.send_modify(|s| s.last_error = None);
        let stores = self.stores_for(stores, config.id).await;
        stores.connected(&config).await;
        let cluster = Arc::clone(&self.cluster.name);
        self.settings.timeline.record(Step::Connected { cluster });

        let connection = cancel.child_token();
        let mut manager = if config.capabilities.synced_canaries {
            let manager =
                WatchStoreManager::sync(backend.clone(), name.clone(), self.metrics.clone());
            match canaries {
                Some(page) => manager.with_listed_canaries(page),
                None => manager,
            }
        } else {
            WatchStoreManager::immediate(name.clone())
        };
        let prefixes = ClusterPrefixes::new(name, config.capabilities.cached);
        stores.register(&mut manager, backend, &prefixes);
        let manager = tokio::spawn(manager.run(connection.clone()));
        let ended = self.watch_config(backend, &config, revision, cancel).await;
        connection.cancel();
        let _ = manager.await;
        self.state.send_modify(|s| s.connected = false);
        ended
    }

    /// Reads and validates the cluster config; returns it, the revision it was read at, and
    /// the remote's canaries at that revision (when there are few enough to read at once).
    async fn fetch_config(
        &self,
        backend: &EtcdBackend,
    ) -> Result<(ClusterConfig, i64, Option<ListPage>), RemoteClusterError> {
        let name = &self.config.name;
        let TxnRead {
            mut values,
            listed,
            revision,
        } = read_cluster_config(backend, name).await?;
        if let Some(beat) = values.pop().flatten() {
            let at = heartbeat::written_or_now(&beat, name);
            self.state.send_modify(|s| s.last_heartbeat = Some(at));
        }
        let value = values.pop().flatten();
        let required = values.pop().flatten().is_some();
        self.state.send_modify(|s| s.config_required = required);
        let Some(value) = value else {
            if required {
                return Err(RemoteClusterError::ConfigMissing(name.clone()));
            }
            // Old remotes without a config: no ID, no capabilities.
            return Ok((ClusterConfig::default(), revision, None));
        };
        let config = ClusterConfig::from_json(&value)
            .map_err(|e| RemoteClusterError::ConfigMalformed(e.to_string()))?;
        config.validate_remote(self.settings.max_connected_clusters)?;
        Ok((config, revision, listed))
    }

    /// The stores for `cluster_id`: the existing ones, or new ones after draining the old.
    async fn stores_for<'s>(&self, slot: &'s mut Option<S>, cluster_id: u32) -> &'s S {
        if slot.as_ref().is_some_and(|s| s.cluster_id() != cluster_id)
            && let Some(old) = slot.take()
        {
            tracing::info!(cluster = %self.config.name, old = old.cluster_id(), new = cluster_id,
                "cluster ID changed: draining what the cluster contributed");
            old.drain(DrainReason::IdChanged).await;
        }
        let stores = slot.get_or_insert_with(|| {
            S::new(
                self.cluster.clone(),
                cluster_id,
                &self.settings,
                &self.metrics,
                &self.sinks,
            )
        });
        let statuses = stores.statuses();
        self.state.send_modify(|s| s.stores = Some(statuses));
        stores
    }

    /// The watchdog: follows the cluster config and the heartbeat. A change of ID or
    /// capabilities restarts the connection; a broken watch or a stale heartbeat is a
    /// failure.
    async fn watch_config(
        &self,
        backend: &EtcdBackend,
        current: &ClusterConfig,
        revision: i64,
        cancel: &CancellationToken,
    ) -> Result<Ended, RemoteClusterError> {
        let key = format!("{}/{}", keys::CLUSTER_CONFIG_PREFIX, self.config.name);
        // One key: Cilium's `remote` role grants this cluster's config key alone.
        let mut watch = backend.watch_key(&key, revision + 1).await?;
        let heartbeat = heartbeat::follow(
            backend,
            revision + 1,
            self.settings.heartbeat,
            heartbeat::Reporting {
                cluster: &self.config.name,
                state: &self.state,
                metrics: &self.metrics,
            },
        );
        tokio::pin!(heartbeat);
        loop {
            let batch = tokio::select! {
                () = cancel.cancelled() => return Ok(Ended::Cancelled),
                err = &mut heartbeat => return Err(err),
                batch = watch.next() => batch?,
            };
            let Some(events) = batch else {
                return Err(KvstoreError::WatchClosed(key).into());
            };
            for event in events {
                match event {
                    WatchEvent::Put { key: k, value, .. } if k == key.as_bytes() => {
                        let Ok(config) = ClusterConfig::from_json(&value) else {
                            tracing::warn!(cluster = %self.config.name, "ignoring a malformed cluster config update");
                            continue;
                        };
                        if config.id != current.id {
                            return Ok(Ended::Restart("cluster ID changed"));
                        }
                        if config.capabilities != current.capabilities {
                            return Ok(Ended::Restart("capabilities changed"));
                        }
                    }
                    WatchEvent::Delete { key: k, .. }
                        if k == key.as_bytes() && self.state.borrow().config_required =>
                    {
                        return Err(RemoteClusterError::ConfigRemoved);
                    }
                    _ => {}
                }
            }
        }
    }
}
