//! The `ClusterMesh` actor: a shell over [`MeshState`] that carries out its commands. It owns
//! each remote cluster's running loop ([`RemoteClusterHandle`]) and, while no loop runs, the
//! stores the last one handed back; it tells the barrier which clusters exist, reserves
//! cluster IDs, and answers status from the loops' published state (no message per cluster).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use actix::{
    Actor, ActorFutureExt, Addr, AsyncContext, Context, Handler, Message, MessageResult, Recipient,
    ResponseFuture, WrapFuture,
};
use futures::FutureExt as _;
use futures::future::BoxFuture;
use meshwork_kvstore::KvstoreMetrics;
use tokio::sync::oneshot;

use crate::barrier_actor::BarrierUpdate;
use crate::cluster_ids::{ReserveClusterId, ReserveError};
use crate::config_dir::ClusterConfigEvent;
use crate::events::{ClusterRef, Sinks};
use crate::mesh_state::{Command, MeshState};
use crate::metrics::MeshMetrics;
use crate::remote_cluster::runner::{ConnectionState, MeshSettings};
use crate::remote_cluster::stores::ClusterStores;
use crate::remote_cluster::{
    DrainReason, LoopContext, RemoteClusterHandle, Stopped, StoreSet, status_of,
};
use crate::status::ClusterStatus;

/// The mesh of remote clusters, each filling a [`StoreSet`]: the agent's stores by default.
pub struct ClusterMesh<S: StoreSet = ClusterStores> {
    state: MeshState,
    settings: MeshSettings,
    /// Told which clusters exist (kvstoremesh has no barrier).
    barrier: Option<Recipient<BarrierUpdate>>,
    sinks: S::Sinks,
    metrics: KvstoreMetrics,
    running: HashMap<Arc<str>, RemoteClusterHandle<S>>,
    /// The stores a stopped loop handed back, while no loop of the cluster runs.
    kept: HashMap<Arc<str>, S>,
    /// The last connection state of a cluster whose loop is stopping or stopped.
    last_state: HashMap<Arc<str>, ConnectionState>,
    stopped: Vec<oneshot::Sender<()>>,
}

impl ClusterMesh {
    /// A mesh for the local cluster `settings.local_cluster` with ID `local_id` (reserved, so
    /// no remote can take it; 0 reserves nothing), whose stores send to `sinks`.
    pub fn new(
        settings: MeshSettings,
        local_id: u32,
        sinks: Sinks,
        metrics: KvstoreMetrics,
    ) -> Self {
        let barrier = sinks.barrier.clone();
        Self::with_stores(settings, local_id, Some(barrier), sinks, metrics)
    }
}

impl<S: StoreSet> ClusterMesh<S> {
    /// A mesh whose clusters fill stores of type `S`, built with `sinks`; `barrier`, when
    /// there is one, is told which clusters exist.
    pub fn with_stores(
        settings: MeshSettings,
        local_id: u32,
        barrier: Option<Recipient<BarrierUpdate>>,
        sinks: S::Sinks,
        metrics: KvstoreMetrics,
    ) -> Self {
        Self {
            state: MeshState::new(&settings.local_cluster, local_id),
            settings,
            barrier,
            sinks,
            metrics,
            running: HashMap::new(),
            kept: HashMap::new(),
            last_state: HashMap::new(),
            stopped: Vec::new(),
        }
    }

    fn loop_context(&self, ctx: &Context<Self>) -> LoopContext<S> {
        LoopContext {
            settings: self.settings.clone(),
            sinks: self.sinks.clone(),
            ids: ctx.address().recipient(),
            metrics: self.metrics.clone(),
        }
    }

    fn tell_barrier(&self, update: BarrierUpdate) {
        if let Some(barrier) = &self.barrier {
            barrier.do_send(update);
        }
    }

    fn execute(&mut self, commands: Vec<Command>, ctx: &mut Context<Self>) {
        for command in commands {
            match command {
                Command::AddLatches(cluster) => {
                    self.tell_barrier(BarrierUpdate::ClusterAdded {
                        cluster: Arc::clone(&cluster.name),
                        incarnation: cluster.incarnation,
                    });
                }
                Command::Start { cluster, config } => {
                    let handle = RemoteClusterHandle::spawn(
                        cluster.clone(),
                        config,
                        &self.loop_context(ctx),
                        self.kept.remove(&cluster.name),
                        self.last_state.remove(&cluster.name),
                    );
                    self.running.insert(cluster.name, handle);
                }
                Command::Restart { cluster, config } => {
                    tracing::info!(cluster = %cluster.name, "cluster config changed; reconnecting");
                    let stopping = self.stop_loop(&cluster);
                    let shared = self.loop_context(ctx);
                    ctx.spawn(stopping.into_actor(self).map(move |stopped, mesh, ctx| {
                        mesh.last_state.remove(&cluster.name);
                        let handle = RemoteClusterHandle::spawn(
                            cluster.clone(),
                            config,
                            &shared,
                            stopped.stores,
                            Some(stopped.state),
                        );
                        mesh.running.insert(Arc::clone(&cluster.name), handle);
                        mesh.done(&cluster, ctx);
                    }));
                }
                Command::Stop(cluster) => {
                    tracing::info!(cluster = %cluster.name, "stopping the remote cluster's connection");
                    let stopping = self.stop_loop(&cluster);
                    ctx.spawn(stopping.into_actor(self).map(move |stopped, mesh, ctx| {
                        mesh.keep(&cluster, stopped);
                        mesh.done(&cluster, ctx);
                    }));
                }
                Command::Drain(cluster) => {
                    tracing::info!(cluster = %cluster.name, "remote cluster removed; draining what it contributed");
                    self.tell_barrier(BarrierUpdate::ClusterRemoved(Arc::clone(&cluster.name)));
                    let stopping = self.stop_loop(&cluster);
                    let drained = async move {
                        let Stopped { stores, .. } = stopping.await;
                        if let Some(stores) = stores {
                            stores.drain(DrainReason::Removed).await;
                        }
                    };
                    ctx.spawn(drained.into_actor(self).map(move |(), mesh, ctx| {
                        mesh.last_state.remove(&cluster.name);
                        mesh.done(&cluster, ctx);
                    }));
                }
            }
        }
    }

    /// Stops the cluster's loop, if one runs; resolves to what it (or the mesh) kept.
    /// Meanwhile the status shows the loop's state as it was.
    fn stop_loop(
        &mut self,
        cluster: &ClusterRef,
    ) -> impl Future<Output = Stopped<S>> + 'static + use<S> {
        let handle = self.running.remove(&cluster.name);
        if let Some(handle) = &handle {
            self.last_state
                .insert(Arc::clone(&cluster.name), handle.state());
        }
        let stores = self.kept.remove(&cluster.name);
        let state = self.last_state.get(&cluster.name).cloned();
        async move {
            match handle {
                Some(handle) => handle.stop().await,
                None => Stopped {
                    stores,
                    state: state.unwrap_or_default(),
                },
            }
        }
    }

    fn keep(&mut self, cluster: &ClusterRef, stopped: Stopped<S>) {
        if let Some(stores) = stopped.stores {
            self.kept.insert(Arc::clone(&cluster.name), stores);
        }
        self.last_state
            .insert(Arc::clone(&cluster.name), stopped.state);
    }

    fn done(&mut self, cluster: &ClusterRef, ctx: &mut Context<Self>) {
        let commands = self.state.done(cluster);
        self.execute(commands, ctx);
        if self.state.is_stopped() {
            for waiter in self.stopped.drain(..) {
                let _ = waiter.send(());
            }
        }
    }

    fn statuses(&self) -> Vec<ClusterStatus> {
        self.state
            .clusters()
            .map(|view| {
                let name = &view.cluster.name;
                let mut status = match self.running.get(name) {
                    Some(handle) => handle.status(),
                    None => {
                        let etcd_endpoints = view
                            .config
                            .map(|c| c.etcd.endpoints.join(","))
                            .unwrap_or_default();
                        let state = self.last_state.get(name).cloned().unwrap_or_default();
                        status_of(name, &etcd_endpoints, &state)
                    }
                };
                if let Some(invalid) = view.invalid {
                    status.last_error = Some(invalid.to_owned());
                }
                status
            })
            .collect()
    }
}

impl<S: StoreSet> Actor for ClusterMesh<S> {
    type Context = Context<Self>;
}

impl<S: StoreSet> Handler<ClusterConfigEvent> for ClusterMesh<S> {
    type Result = ();

    fn handle(&mut self, event: ClusterConfigEvent, ctx: &mut Context<Self>) {
        if let ClusterConfigEvent::Invalid { name, error } = &event {
            tracing::error!(cluster = %name, %error, "invalid clustermesh config file");
        }
        let commands = self.state.apply(event);
        self.execute(commands, ctx);
    }
}

impl<S: StoreSet> Handler<ReserveClusterId> for ClusterMesh<S> {
    type Result = Result<(), ReserveError>;

    fn handle(&mut self, msg: ReserveClusterId, _: &mut Context<Self>) -> Self::Result {
        self.state.reserve(&msg.cluster, msg.id)
    }
}

/// Asks for every remote cluster's status, sorted by name.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Vec<ClusterStatus>")]
pub struct GetMeshStatus;

impl<S: StoreSet> Handler<GetMeshStatus> for ClusterMesh<S> {
    type Result = MessageResult<GetMeshStatus>;

    fn handle(&mut self, _: GetMeshStatus, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.statuses())
    }
}

/// A scrape's refresh of `metrics` from `mesh`'s statuses (a metrics server runs it before
/// each scrape; a mesh that is gone leaves the last values).
pub fn refresh_metrics<S: StoreSet>(
    mesh: Addr<ClusterMesh<S>>,
    metrics: Arc<MeshMetrics>,
) -> impl Fn() -> BoxFuture<'static, ()> + Send + Sync + 'static {
    move || {
        let (mesh, metrics) = (mesh.clone(), Arc::clone(&metrics));
        async move {
            if let Ok(statuses) = mesh.send(GetMeshStatus).await {
                metrics.update(&statuses);
            }
        }
        .boxed()
    }
}

/// Asks for every reserved cluster ID (the local cluster's included), by ID.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "BTreeMap<u32, String>")]
pub struct GetReservedIds;

impl<S: StoreSet> Handler<GetReservedIds> for ClusterMesh<S> {
    type Result = MessageResult<GetReservedIds>;

    fn handle(&mut self, _: GetReservedIds, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.state.reserved_ids())
    }
}

/// The agent stops: every remote cluster stops without draining; resolves once every loop
/// has stopped, after which the barrier releases every pending wait.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct ShutdownMesh;

impl<S: StoreSet> Handler<ShutdownMesh> for ClusterMesh<S> {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: ShutdownMesh, ctx: &mut Context<Self>) -> Self::Result {
        let commands = self.state.shutdown();
        self.execute(commands, ctx);
        let (tx, rx) = oneshot::channel();
        if self.state.is_stopped() {
            let _ = tx.send(());
        } else {
            self.stopped.push(tx);
        }
        let barrier = self.barrier.clone();
        Box::pin(async move {
            let _ = rx.await;
            if let Some(barrier) = barrier {
                barrier.do_send(BarrierUpdate::StopAll);
            }
        })
    }
}
