//! One remote cluster: its connection loop ([`runner`]) running as a task, and its stores
//! ([`stores`]), which the loop hands back when it stops so that the next run (a changed
//! config file, a fixed one) continues with them, or so that they can be drained.
//!
//! The cluster's lifecycle — when a loop starts, restarts, stops or drains — is decided by
//! [`crate::mesh_state::MeshState`]; a [`RemoteClusterHandle`] is what carries it out.

pub mod heartbeat;
pub mod prefixes;
pub mod runner;
pub mod stores;

use std::sync::Arc;

use actix::Recipient;
use meshwork_kvstore::{EtcdBackend, KvstoreMetrics, WatchStoreManager};
use meshwork_types::ClusterConfig;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use self::prefixes::ClusterPrefixes;
use self::runner::{ConnectionState, MeshSettings, Runner};
use self::stores::{ClusterStores, StoreStatuses};
use crate::cluster_ids::ReserveClusterId;
use crate::config_dir::RemoteClusterConfig;
use crate::events::ClusterRef;
use crate::status::ClusterStatus;

/// Why a cluster's stores are drained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainReason {
    /// The cluster was removed from the config directory.
    Removed,
    /// The remote announced another cluster ID: new stores replace these.
    IdChanged,
}

/// What a remote cluster's loop fills with the remote's entries: the agent's stores, which
/// forward to its consumers ([`ClusterStores`]), or kvstoremesh's cache of the remote in the
/// local etcd. The loop (connection, cluster config, ID reservation, canaries, backoff) is
/// the same for both.
pub trait StoreSet: Send + Sync + Unpin + Sized + 'static {
    /// What every cluster's stores are built with (where they send).
    type Sinks: Clone + Send + Sync + Unpin + 'static;

    /// Stores for `cluster` with ID `cluster_id` (0: the remote announces none).
    fn new(
        cluster: ClusterRef,
        cluster_id: u32,
        settings: &MeshSettings,
        metrics: &KvstoreMetrics,
        sinks: &Self::Sinks,
    ) -> Self;

    /// The cluster ID the stores validate against.
    fn cluster_id(&self) -> u32;

    /// The stores' live status.
    fn statuses(&self) -> Arc<StoreStatuses>;

    /// A connection retrieved and validated `config`; called before every [`Self::register`].
    fn connected(&self, config: &ClusterConfig) -> impl Future<Output = ()> + Send {
        let _ = config;
        async {}
    }

    /// Registers the stores with `manager`, to watch through `backend` at `prefixes`.
    fn register(
        &self,
        manager: &mut WatchStoreManager,
        backend: &EtcdBackend,
        prefixes: &ClusterPrefixes,
    );

    /// Withdraws everything the stores hold, for `reason`. Called only when no watch runs.
    fn drain(&self, reason: DrainReason) -> impl Future<Output = ()> + Send;
}

/// What every remote cluster's loop shares.
pub struct LoopContext<S: StoreSet = ClusterStores> {
    /// Agent-wide settings.
    pub settings: MeshSettings,
    /// Where the stores send.
    pub sinks: S::Sinks,
    /// Cluster ID reservations.
    pub ids: Recipient<ReserveClusterId>,
    /// Store metrics.
    pub metrics: KvstoreMetrics,
}

impl<S: StoreSet> Clone for LoopContext<S> {
    fn clone(&self) -> Self {
        Self {
            settings: self.settings.clone(),
            sinks: self.sinks.clone(),
            ids: self.ids.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

/// A running connection loop of one remote cluster.
pub struct RemoteClusterHandle<S: StoreSet = ClusterStores> {
    cluster: ClusterRef,
    etcd_endpoints: String,
    cancel: CancellationToken,
    task: JoinHandle<Option<S>>,
    state: watch::Receiver<ConnectionState>,
}

impl<S: StoreSet> RemoteClusterHandle<S> {
    /// Starts the loop of `cluster` as `config` says, continuing with `stores` (those an
    /// earlier loop of the same incarnation handed back) and with the connection state that
    /// loop reported (failures keep counting).
    pub fn spawn(
        cluster: ClusterRef,
        config: RemoteClusterConfig,
        shared: &LoopContext<S>,
        stores: Option<S>,
        previous: Option<ConnectionState>,
    ) -> Self {
        tracing::info!(cluster = %cluster.name, endpoints = ?config.etcd.endpoints, "connecting to remote cluster");
        let etcd_endpoints = config.etcd.endpoints.join(",");
        let (state, receiver) = watch::channel(previous.unwrap_or_default());
        let runner = Runner {
            cluster: cluster.clone(),
            config,
            settings: shared.settings.clone(),
            sinks: shared.sinks.clone(),
            ids: shared.ids.clone(),
            metrics: shared.metrics.clone(),
            state,
        };
        let cancel = CancellationToken::new();
        let task = tokio::spawn(runner.run(stores, cancel.clone()));
        Self {
            cluster,
            etcd_endpoints,
            cancel,
            task,
            state: receiver,
        }
    }

    /// Stops the loop; resolves to its stores and last state once it has stopped.
    pub fn stop(self) -> impl Future<Output = Stopped<S>> + Send + 'static {
        self.cancel.cancel();
        let state = self.state;
        let task = self.task;
        async move {
            let stores = task.await.unwrap_or_else(|err| {
                // The loop panicked: its stores are lost, which a new loop will re-list.
                tracing::error!(%err, "remote cluster loop ended abnormally");
                None
            });
            let state = state.borrow().clone();
            Stopped { stores, state }
        }
    }

    /// The loop's connection state now.
    pub fn state(&self) -> ConnectionState {
        self.state.borrow().clone()
    }

    /// The cluster's status now.
    pub fn status(&self) -> ClusterStatus {
        status_of(
            &self.cluster.name,
            &self.etcd_endpoints,
            &self.state.borrow(),
        )
    }
}

/// What a stopped loop leaves behind.
pub struct Stopped<S: StoreSet = ClusterStores> {
    /// The stores, to continue with or to drain.
    pub stores: Option<S>,
    /// Its last connection state.
    pub state: ConnectionState,
}

/// The status of `name` (its etcd at `etcd_endpoints`) in connection state `state`.
pub fn status_of(name: &str, etcd_endpoints: &str, state: &ConnectionState) -> ClusterStatus {
    ClusterStatus {
        name: name.to_owned(),
        etcd_endpoints: etcd_endpoints.to_owned(),
        connected: state.connected,
        cluster_id: state.cluster_id,
        config_required: state.config_required,
        config_retrieved: state.config_retrieved,
        failures: state.failures,
        last_failure: state.last_failure,
        last_error: state.last_error.clone(),
        last_heartbeat: state.last_heartbeat,
        cached: state.cached,
        listed: state
            .stores
            .as_ref()
            .map(|s| s.listed())
            .unwrap_or_default(),
        entries: state
            .stores
            .as_ref()
            .map(|s| s.entries())
            .unwrap_or_default(),
    }
}
