//! The actor shell of the [`SyncBarrier`]: latches change through messages; waits are handed
//! out as futures that run outside the actor, so a long wait never blocks it.

use actix::{Actor, Context, Handler, Message, MessageResult};

use super::barrier::{ClusterWait, MeshWait, SyncBarrier};
use super::kinds::{Resource, SyncKind};

/// The sync barrier actor.
pub struct SyncBarrierActor {
    barrier: SyncBarrier,
}

impl SyncBarrierActor {
    /// Wraps `barrier`.
    pub fn new(barrier: SyncBarrier) -> Self {
        Self { barrier }
    }
}

impl Actor for SyncBarrierActor {
    type Context = Context<Self>;
}

/// What changes the barrier's latches.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub enum BarrierUpdate {
    /// A cluster's config file appeared.
    ClusterAdded(String),
    /// A cluster was removed.
    ClusterRemoved(String),
    /// The agent stops.
    StopAll,
    /// A store's first list is done (not services).
    Synced {
        /// The remote cluster.
        cluster: String,
        /// Which store.
        resource: Resource,
    },
    /// The services store's first list is done after emitting events up to `last_seq`.
    ServicesListDone {
        /// The remote cluster.
        cluster: String,
        /// The last event number emitted before list-done.
        last_seq: u64,
    },
    /// The consumer programmed the cluster's service events up to `seq`.
    ServicesProgrammed {
        /// The remote cluster.
        cluster: String,
        /// The last programmed event.
        seq: u64,
    },
}

impl Handler<BarrierUpdate> for SyncBarrierActor {
    type Result = ();

    fn handle(&mut self, update: BarrierUpdate, _: &mut Context<Self>) {
        match update {
            BarrierUpdate::ClusterAdded(cluster) => self.barrier.add_cluster(&cluster),
            BarrierUpdate::ClusterRemoved(cluster) => self.barrier.remove_cluster(&cluster),
            BarrierUpdate::StopAll => self.barrier.stop_all(),
            BarrierUpdate::Synced { cluster, resource } => self.barrier.synced(&cluster, resource),
            BarrierUpdate::ServicesListDone { cluster, last_seq } => {
                self.barrier.services_list_done(&cluster, last_seq);
            }
            BarrierUpdate::ServicesProgrammed { cluster, seq } => {
                self.barrier.services_programmed(&cluster, seq);
            }
        }
    }
}

/// Asks for a mesh-level wait over the clusters known now.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "MeshWait")]
pub struct GetMeshWait(pub SyncKind);

impl Handler<GetMeshWait> for SyncBarrierActor {
    type Result = MessageResult<GetMeshWait>;

    fn handle(&mut self, GetMeshWait(kind): GetMeshWait, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.barrier.mesh_wait(kind))
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
