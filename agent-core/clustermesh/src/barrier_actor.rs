//! The actor shell of the [`SyncBarrier`]: latches change through messages; waits are handed
//! out as futures that run outside the actor, so a long wait never blocks it.

use std::sync::Arc;

use actix::{Actor, Context, Handler, Message, MessageResult};
use meshwork_types::{Resource, SyncKind};

use super::barrier::{ClusterWait, Consumer, MeshWait, Scope, SyncBarrier};
use super::timeline::{Step, TimelineRecorder};

/// The sync barrier actor.
pub struct SyncBarrierActor {
    barrier: SyncBarrier,
    timeline: TimelineRecorder,
}

impl SyncBarrierActor {
    /// Wraps `barrier`.
    pub fn new(barrier: SyncBarrier) -> Self {
        Self {
            barrier,
            timeline: TimelineRecorder::default(),
        }
    }

    /// Records on `timeline` the instant each cluster's resource syncs.
    pub fn with_timeline(mut self, timeline: TimelineRecorder) -> Self {
        self.timeline = timeline;
        self
    }

    /// Applies `update` to `cluster`'s `resource` latches; records the instant it was the
    /// one that completed them.
    fn complete(
        &mut self,
        cluster: &Arc<str>,
        incarnation: u64,
        resource: Resource,
        update: impl FnOnce(&mut SyncBarrier),
    ) {
        let before = self.barrier.resource_synced(cluster, incarnation, resource);
        update(&mut self.barrier);
        if !before && self.barrier.resource_synced(cluster, incarnation, resource) {
            self.timeline.record(Step::ListDone {
                cluster: Arc::clone(cluster),
                resource,
            });
        }
    }
}

impl Actor for SyncBarrierActor {
    type Context = Context<Self>;
}

/// What changes the barrier's latches.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub enum BarrierUpdate {
    /// An incarnation of a cluster appeared (its config file did).
    ClusterAdded {
        /// The remote cluster.
        cluster: Arc<str>,
        /// Which incarnation.
        incarnation: u64,
    },
    /// A cluster was removed.
    ClusterRemoved(Arc<str>),
    /// The agent stops.
    StopAll,
    /// A store handed its first list to every consumer.
    Delivered {
        /// The remote cluster.
        cluster: Arc<str>,
        /// Its incarnation.
        incarnation: u64,
        /// Which store.
        resource: Resource,
    },
    /// A consumer applied a cluster's first list of a resource.
    Applied {
        /// The remote cluster.
        cluster: Arc<str>,
        /// Its incarnation.
        incarnation: u64,
        /// Which store's list.
        resource: Resource,
        /// Who applied it.
        consumer: Consumer,
    },
}

impl Handler<BarrierUpdate> for SyncBarrierActor {
    type Result = ();

    fn handle(&mut self, update: BarrierUpdate, _: &mut Context<Self>) {
        match update {
            BarrierUpdate::ClusterAdded {
                cluster,
                incarnation,
            } => self.barrier.add_cluster(&cluster, incarnation),
            BarrierUpdate::ClusterRemoved(cluster) => self.barrier.remove_cluster(&cluster),
            BarrierUpdate::StopAll => self.barrier.stop_all(),
            BarrierUpdate::Delivered {
                cluster,
                incarnation,
                resource,
            } => self.complete(&cluster, incarnation, resource, |barrier| {
                barrier.delivered(&cluster, incarnation, resource);
            }),
            BarrierUpdate::Applied {
                cluster,
                incarnation,
                resource,
                consumer,
            } => self.complete(&cluster, incarnation, resource, |barrier| {
                barrier.applied(&cluster, incarnation, resource, consumer);
            }),
        }
    }
}

/// Asks for a mesh-level wait over the clusters known now. `only`: count only these
/// consumers' acknowledgements (`None`: every registered consumer's).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "MeshWait")]
pub struct GetMeshWait {
    /// What to wait for.
    pub kind: SyncKind,
    /// Whose acknowledgements count.
    pub only: Option<&'static [Consumer]>,
}

impl GetMeshWait {
    /// A wait for `kind` counting every registered consumer.
    pub fn all(kind: SyncKind) -> Self {
        Self { kind, only: None }
    }

    /// A wait for `kind` counting only `consumers`.
    pub fn only(kind: SyncKind, consumers: &'static [Consumer]) -> Self {
        Self {
            kind,
            only: Some(consumers),
        }
    }
}

impl Handler<GetMeshWait> for SyncBarrierActor {
    type Result = MessageResult<GetMeshWait>;

    fn handle(&mut self, msg: GetMeshWait, _: &mut Context<Self>) -> Self::Result {
        let scope = msg.only.map_or(Scope::All, Scope::Only);
        MessageResult(self.barrier.mesh_wait_in(msg.kind, scope))
    }
}

/// Asks for a wait on one cluster (`None` when unknown).
#[derive(Debug, Clone, Message)]
#[rtype(result = "Option<ClusterWait>")]
pub struct GetClusterWait {
    /// The remote cluster.
    pub cluster: String,
    /// What to wait for.
    pub kind: SyncKind,
}

impl Handler<GetClusterWait> for SyncBarrierActor {
    type Result = MessageResult<GetClusterWait>;

    fn handle(&mut self, msg: GetClusterWait, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.barrier.cluster_wait(&msg.cluster, msg.kind))
    }
}
