//! The `RemoteCluster` actor: one per remote cluster, a thin shell around its connection
//! loop ([`runner`]) and its stores ([`stores`]).
//!
//! - `Reconfigure`: the config file changed — the same cluster object reconnects with the new
//!   config; stores and latches are kept.
//! - `Disconnect`: the config file became invalid — like Cilium, close the connection until
//!   the file is fixed; stores, latches and the cluster ID are kept, so nothing is drained
//!   and the fixed file reconnects to exactly the difference.
//! - `Remove`: the config file is gone — stop, then drain everything the cluster contributed.
//! - `Shutdown`: the agent stops — stop and drain nothing (the datapath keeps its state).
//!
//! These four handlers are atomic: each finishes stopping the runner before the next message
//! is handled, so quick changes apply in order and never leave a runner behind.

pub mod prefixes;
pub mod runner;
pub mod stores;

use std::sync::{Arc, Mutex};

use actix::{
    Actor, ActorContext, ActorFutureExt, AtomicResponse, Context, Handler, Message, MessageResult,
    Recipient, WrapFuture,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use self::runner::{ConnectionState, MeshSettings, Runner};
use self::stores::{ClusterStores, Sinks};
use super::cluster_ids::ReserveClusterId;
use super::config_dir::RemoteClusterConfig;
use super::status::ClusterStatus;
use crate::kvstore::KvstoreMetrics;

/// A remote cluster.
pub struct RemoteCluster {
    config: RemoteClusterConfig,
    settings: MeshSettings,
    sinks: Sinks,
    ids: Recipient<ReserveClusterId>,
    metrics: KvstoreMetrics,
    stores: Arc<Mutex<Option<Arc<ClusterStores>>>>,
    state: Arc<watch::Sender<ConnectionState>>,
    running: Option<(CancellationToken, JoinHandle<()>)>,
}

impl RemoteCluster {
    /// A remote cluster that connects as `config` says once started.
    pub fn new(
        config: RemoteClusterConfig,
        settings: MeshSettings,
        sinks: Sinks,
        ids: Recipient<ReserveClusterId>,
        metrics: KvstoreMetrics,
    ) -> Self {
        Self {
            config,
            settings,
            sinks,
            ids,
            metrics,
            stores: Arc::default(),
            state: Arc::new(watch::Sender::new(ConnectionState::default())),
            running: None,
        }
    }

    fn start_runner(&mut self) {
        let cancel = CancellationToken::new();
        let runner = Runner {
            config: self.config.clone(),
            settings: self.settings.clone(),
            sinks: self.sinks.clone(),
            ids: self.ids.clone(),
            metrics: self.metrics.clone(),
            stores: Arc::clone(&self.stores),
            state: Arc::clone(&self.state),
        };
        let task = tokio::spawn(runner.run(cancel.clone()));
        self.running = Some((cancel, task));
    }

    /// Stops the runner; the returned future ends when it has stopped.
    fn stop_runner(&mut self) -> impl Future<Output = ()> + use<> {
        let running = self.running.take();
        async move {
            if let Some((cancel, task)) = running {
                cancel.cancel();
                let _ = task.await;
            }
        }
    }

    /// Stops the runner, then runs `then` on the actor: the response of a lifecycle handler,
    /// atomic so that the next lifecycle message waits for it.
    fn stop_runner_then(
        &mut self,
        then: impl FnOnce(&mut Self, &mut Context<Self>) + 'static,
    ) -> AtomicResponse<Self, ()> {
        let stopped = self.stop_runner();
        AtomicResponse::new(Box::pin(
            stopped
                .into_actor(self)
                .map(move |(), actor, ctx| then(actor, ctx)),
        ))
    }

    fn status(&self) -> ClusterStatus {
        let state = self.state.borrow().clone();
        let stores = self
            .stores
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        ClusterStatus {
            name: self.config.name.clone(),
            endpoints: self.config.etcd.endpoints.join(","),
            connected: state.connected,
            cluster_id: state.cluster_id,
            config_required: state.config_required,
            config_retrieved: state.config_retrieved,
            failures: state.failures,
            last_failure: state.last_failure,
            last_error: state.last_error,
            synced: stores.as_ref().map(|s| s.synced()).unwrap_or_default(),
            entries: stores.as_ref().map(|s| s.entries()).unwrap_or_default(),
        }
    }
}

impl Actor for RemoteCluster {
    type Context = Context<Self>;

    fn started(&mut self, _: &mut Context<Self>) {
        tracing::info!(cluster = %self.config.name, endpoints = ?self.config.etcd.endpoints, "connecting to remote cluster");
        self.start_runner();
    }
}

/// The cluster's config file changed: reconnect with `0`.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct Reconfigure(pub RemoteClusterConfig);

impl Handler<Reconfigure> for RemoteCluster {
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, Reconfigure(config): Reconfigure, _: &mut Context<Self>) -> Self::Result {
        tracing::info!(cluster = %config.name, "cluster config changed; reconnecting");
        self.stop_runner_then(move |actor, _| {
            actor.config = config;
            actor.start_runner();
        })
    }
}

/// The cluster's config file became invalid: disconnect, keep everything it contributed.
/// (The runner marks itself disconnected as it ends; the mesh reports the file's error.)
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct Disconnect;

impl Handler<Disconnect> for RemoteCluster {
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, _: Disconnect, _: &mut Context<Self>) -> Self::Result {
        tracing::warn!(cluster = %self.config.name,
            "cluster config file is invalid; disconnecting until it is fixed");
        self.stop_runner_then(|_, _| {})
    }
}

/// The cluster's config file is gone: stop and drain.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct Remove;

impl Handler<Remove> for RemoteCluster {
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, _: Remove, _: &mut Context<Self>) -> Self::Result {
        tracing::info!(cluster = %self.config.name, "remote cluster removed; draining what it contributed");
        let stopped = self.stop_runner();
        let stores = self
            .stores
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        AtomicResponse::new(Box::pin(
            async move {
                stopped.await;
                if let Some(stores) = stores {
                    stores.drain().await;
                }
            }
            .into_actor(self)
            .map(|(), _, ctx| ctx.stop()),
        ))
    }
}

/// The agent stops: stop without draining.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct Shutdown;

impl Handler<Shutdown> for RemoteCluster {
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, _: Shutdown, _: &mut Context<Self>) -> Self::Result {
        self.stop_runner_then(|_, ctx| ctx.stop())
    }
}

/// Asks for the cluster's status.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "ClusterStatus")]
pub struct GetStatus;

impl Handler<GetStatus> for RemoteCluster {
    type Result = MessageResult<GetStatus>;

    fn handle(&mut self, _: GetStatus, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.status())
    }
}
