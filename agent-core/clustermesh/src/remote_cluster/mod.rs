//! One remote cluster: its connection loop ([`runner`]) running as a task, and its stores
//! ([`stores`]), which the loop hands back when it stops so that the next run (a changed
//! config file, a fixed one) continues with them, or so that they can be drained.
//!
//! The cluster's lifecycle — when a loop starts, restarts, stops or drains — is decided by
//! [`crate::mesh_state::MeshState`]; a [`RemoteClusterHandle`] is what carries it out.

pub mod prefixes;
pub mod runner;
pub mod stores;

use actix::Recipient;
use meshwork_kvstore::KvstoreMetrics;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use self::runner::{ConnectionState, MeshSettings, Runner};
use self::stores::ClusterStores;
use crate::cluster_ids::ReserveClusterId;
use crate::config_dir::RemoteClusterConfig;
use crate::events::{ClusterRef, Sinks};
use crate::status::ClusterStatus;

/// What every remote cluster's loop shares.
#[derive(Clone)]
pub struct LoopContext {
    /// Agent-wide settings.
    pub settings: MeshSettings,
    /// Where the stores send.
    pub sinks: Sinks,
    /// Cluster ID reservations.
    pub ids: Recipient<ReserveClusterId>,
    /// Store metrics.
    pub metrics: KvstoreMetrics,
}

/// A running connection loop of one remote cluster.
pub struct RemoteClusterHandle {
    cluster: ClusterRef,
    etcd_endpoints: String,
    cancel: CancellationToken,
    task: JoinHandle<Option<ClusterStores>>,
    state: watch::Receiver<ConnectionState>,
}

impl RemoteClusterHandle {
    /// Starts the loop of `cluster` as `config` says, continuing with `stores` (those an
    /// earlier loop of the same incarnation handed back) and with the connection state that
    /// loop reported (failures keep counting).
    pub fn spawn(
        cluster: ClusterRef,
        config: RemoteClusterConfig,
        shared: &LoopContext,
        stores: Option<ClusterStores>,
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
    pub fn stop(self) -> impl Future<Output = Stopped> + Send + 'static {
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
pub struct Stopped {
    /// The stores, to continue with or to drain.
    pub stores: Option<ClusterStores>,
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
