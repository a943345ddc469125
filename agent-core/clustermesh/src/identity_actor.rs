//! The actor shell of [`RemoteIdentities`]: applies identity events of every connection and
//! acknowledges each cluster's first identity list to the barrier once applied.

use std::sync::Arc;

use actix::{Actor, Context, Handler, Message, MessageResult, Recipient};

use super::barrier::Consumer;
use super::barrier_actor::BarrierUpdate;
use super::events::{IdentityEvent, IdentityEvents};
use super::identity_cache::RemoteIdentities;
use meshwork_types::{Change, Resource};

/// Holds the remote identity caches.
pub struct IdentityCacheActor {
    identities: RemoteIdentities,
    barrier: Recipient<BarrierUpdate>,
}

impl IdentityCacheActor {
    /// An empty cache that acknowledges list-dones to `barrier`.
    pub fn new(barrier: Recipient<BarrierUpdate>) -> Self {
        Self {
            identities: RemoteIdentities::new(),
            barrier,
        }
    }
}

impl Actor for IdentityCacheActor {
    type Context = Context<Self>;
}

impl Handler<IdentityEvents> for IdentityCacheActor {
    type Result = ();

    fn handle(&mut self, batch: IdentityEvents, _: &mut Context<Self>) {
        let cluster = &*batch.cluster.name;
        let ids = &mut self.identities;
        for event in batch.events {
            // Policy will consume the changes each call answers; nothing does yet.
            match event {
                IdentityEvent::Start { generation } => drop(ids.start(cluster, generation)),
                IdentityEvent::Change {
                    generation,
                    change: Change::Upsert(identity),
                } => drop(ids.upsert(cluster, generation, identity)),
                IdentityEvent::Change {
                    generation,
                    change: Change::Delete(identity),
                } => drop(ids.delete(cluster, generation, identity.id)),
                IdentityEvent::ListDone { generation } => {
                    drop(ids.list_done(cluster, generation));
                    self.barrier.do_send(BarrierUpdate::Applied {
                        cluster: Arc::clone(&batch.cluster.name),
                        incarnation: batch.cluster.incarnation,
                        resource: Resource::Identities,
                        consumer: Consumer::Identities,
                    });
                }
                IdentityEvent::Stop { generation } => drop(ids.stop(cluster, generation)),
                IdentityEvent::RemoveCluster => drop(ids.remove_cluster(cluster)),
            }
        }
    }
}

/// Asks how many identities a cluster has registered.
#[derive(Debug, Clone, Message)]
#[rtype(result = "usize")]
pub struct GetRegisteredIdentities(pub String);

impl Handler<GetRegisteredIdentities> for IdentityCacheActor {
    type Result = MessageResult<GetRegisteredIdentities>;

    fn handle(&mut self, msg: GetRegisteredIdentities, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.identities.registered_len(&msg.0))
    }
}
