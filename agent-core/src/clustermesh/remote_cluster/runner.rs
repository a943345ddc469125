//! One remote cluster's connection loop: connect, fetch and validate the cluster config,
//! reserve the cluster ID, run the stores behind the canary manager, and watch the cluster
//! config as the watchdog. Any failure disconnects, counts, and reconnects after a backoff
//! (at most 30 s); a changed cluster ID drains the stores and starts over.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use actix::Recipient;
use backon::{BackoffBuilder, ExponentialBuilder};
use std::sync::Mutex;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::prefixes::ClusterPrefixes;
use super::stores::{ClusterStores, Sinks};
use crate::clustermesh::cluster_ids::{IdInUse, ReserveClusterId};
use crate::clustermesh::config_dir::RemoteClusterConfig;
use crate::kvstore::{
    EtcdBackend, KvstoreError, KvstoreMetrics, WatchEvent, WatchStoreManager, keys,
};
use crate::types::{ClusterConfig, ClusterConfigError};

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
}

impl MeshSettings {
    /// Cilium's defaults for `local_cluster`.
    pub fn new(local_cluster: impl Into<String>) -> Self {
        Self {
            local_cluster: local_cluster.into(),
            max_connected_clusters: crate::types::DEFAULT_MAX_CONNECTED_CLUSTERS,
            connect_timeout: Duration::from_secs(10),
            min_retry_delay: Duration::from_secs(1),
            max_retry_delay: Duration::from_secs(30),
        }
    }
}

/// What the connection loop reports about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
}

/// Why a connection attempt ended.
#[derive(Debug, thiserror::Error)]
pub enum RemoteClusterError {
    /// etcd is unreachable or failed.
    #[error("{0}")]
    Kvstore(#[from] KvstoreError),
    /// The remote says a config is required but has none.
    #[error("cluster configuration expected but not found (cilium/cluster-config/{0})")]
    ConfigMissing(String),
    /// The config does not decode.
    #[error("invalid cluster configuration: {0}")]
    ConfigMalformed(String),
    /// The config is not acceptable for this agent.
    #[error("invalid cluster configuration: {0}")]
    ConfigInvalid(#[from] ClusterConfigError),
    /// Another remote cluster holds the ID.
    #[error("{0}")]
    IdInUse(#[from] IdInUse),
    /// The config was deleted while required.
    #[error("cluster configuration was removed")]
    ConfigRemoved,
    /// The mesh is gone (agent shutting down).
    #[error("the cluster mesh stopped")]
    MeshGone,
}

enum Ended {
    Cancelled,
    Restart(&'static str),
}

/// Everything the loop of one remote cluster needs.
pub struct Runner {
    /// The cluster's config file content.
    pub config: RemoteClusterConfig,
    /// Agent-wide settings.
    pub settings: MeshSettings,
    /// Where the stores send.
    pub sinks: Sinks,
    /// Cluster ID reservations.
    pub ids: Recipient<ReserveClusterId>,
    /// Store metrics.
    pub metrics: KvstoreMetrics,
    /// The stores, kept across connections (replaced when the ID changes).
    pub stores: Arc<Mutex<Option<Arc<ClusterStores>>>>,
    /// Published state.
    pub state: Arc<watch::Sender<ConnectionState>>,
}

impl Runner {
    /// Runs until `cancel` fires.
    pub async fn run(self, cancel: CancellationToken) {
        let name = self.config.name.clone();
        let mut backoff = self.backoff();
        loop {
            if cancel.is_cancelled() {
                break;
            }
            match self.connection(&cancel).await {
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
    }

    fn backoff(&self) -> impl Iterator<Item = Duration> + use<> {
        ExponentialBuilder::default()
            .with_min_delay(self.settings.min_retry_delay)
            .with_max_delay(self.settings.max_retry_delay)
            .with_jitter()
            .without_max_times()
            .build()
    }

    async fn connection(&self, cancel: &CancellationToken) -> Result<Ended, RemoteClusterError> {
        let name = &self.config.name;
        let backend = tokio::select! {
            () = cancel.cancelled() => return Ok(Ended::Cancelled),
            backend = EtcdBackend::connect(&self.config.etcd, self.settings.connect_timeout) => backend?,
        };
        // What the previous connection retrieved is not known to hold any more.
        self.state.send_modify(|s| {
            s.connected = true;
            s.config_retrieved = false;
            s.cluster_id = 0;
        });
        let (config, revision) = self.fetch_config(&backend).await?;
        self.state.send_modify(|s| {
            s.cluster_id = config.id;
            s.config_retrieved = s.config_required || config.id != 0;
        });
        if config.id != 0 {
            self.ids
                .send(ReserveClusterId {
                    cluster: name.clone(),
                    id: config.id,
                })
                .await
                .map_err(|_| RemoteClusterError::MeshGone)??;
        }
        self.state.send_modify(|s| s.last_error = None);
        let stores = self.stores_for(config.id).await;

        let connection = cancel.child_token();
        let mut manager = if config.capabilities.synced_canaries {
            WatchStoreManager::sync(backend.clone(), name.clone(), self.metrics.clone())
        } else {
            WatchStoreManager::immediate(name.clone())
        };
        let prefixes = ClusterPrefixes::new(name, config.capabilities.cached);
        stores.register(&mut manager, &backend, &prefixes);
        let manager = tokio::spawn(manager.run(connection.clone()));
        let ended = self.watch_config(&backend, &config, revision, cancel).await;
        connection.cancel();
        let _ = manager.await;
        self.state.send_modify(|s| s.connected = false);
        ended
    }

    /// Reads and validates the cluster config; returns it and the revision it was read at.
    async fn fetch_config(
        &self,
        backend: &EtcdBackend,
    ) -> Result<(ClusterConfig, i64), RemoteClusterError> {
        let name = &self.config.name;
        let required = backend.get(keys::HAS_CLUSTER_CONFIG_KEY).await?.is_some();
        self.state.send_modify(|s| s.config_required = required);
        let key = format!("{}/{name}", keys::CLUSTER_CONFIG_PREFIX);
        let revision = backend.revision(&key).await?;
        let Some((value, _)) = backend.get(&key).await? else {
            if required {
                return Err(RemoteClusterError::ConfigMissing(name.clone()));
            }
            // Old remotes without a config: no ID, no capabilities.
            return Ok((ClusterConfig::default(), revision));
        };
        let config = ClusterConfig::from_json(&value)
            .map_err(|e| RemoteClusterError::ConfigMalformed(e.to_string()))?;
        config.validate_remote(self.settings.max_connected_clusters)?;
        Ok((config, revision))
    }

    /// The stores for `cluster_id`: the existing ones, or new ones after draining the old.
    async fn stores_for(&self, cluster_id: u32) -> Arc<ClusterStores> {
        let (stores, replaced) = {
            let mut slot = self
                .stores
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(stores) = slot.as_ref().filter(|s| s.cluster_id() == cluster_id) {
                return Arc::clone(stores);
            }
            let stores = Arc::new(ClusterStores::new(
                &self.config.name,
                cluster_id,
                self.settings.max_connected_clusters,
                &self.metrics,
                self.sinks.clone(),
            ));
            (Arc::clone(&stores), slot.replace(stores))
        };
        if let Some(old) = replaced {
            tracing::info!(cluster = %self.config.name, old = old.cluster_id(), new = cluster_id,
                "cluster ID changed: draining what the cluster contributed");
            old.drain().await;
        }
        stores
    }

    /// The watchdog: follows the cluster config. A change of ID or capabilities restarts the
    /// connection; a broken watch is a failure.
    async fn watch_config(
        &self,
        backend: &EtcdBackend,
        current: &ClusterConfig,
        revision: i64,
        cancel: &CancellationToken,
    ) -> Result<Ended, RemoteClusterError> {
        let key = format!("{}/{}", keys::CLUSTER_CONFIG_PREFIX, self.config.name);
        let mut watch = backend.watch(&key, revision + 1).await?;
        loop {
            let batch = tokio::select! {
                () = cancel.cancelled() => return Ok(Ended::Cancelled),
                batch = watch.next() => batch?,
            };
            let Some(events) = batch else {
                return Err(KvstoreError::WatchClosed(key).into());
            };
            for event in events {
                match event {
                    WatchEvent::Put { key: k, value } if k == key.as_bytes() => {
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
                    WatchEvent::Delete { key: k }
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
