//! The actor shell of [`RemoteIdentities`]: applies identity events of every connection.

use actix::{Actor, Context, Handler, Message, MessageResult};

use super::events::{Change, IdentityEvent, IdentityEvents};
use super::identity_cache::RemoteIdentities;

/// Holds the remote identity caches.
#[derive(Default)]
pub struct IdentityCacheActor {
    identities: RemoteIdentities,
    changes: u64,
}

impl Actor for IdentityCacheActor {
    type Context = Context<Self>;
}

impl Handler<IdentityEvents> for IdentityCacheActor {
    type Result = ();

    fn handle(&mut self, batch: IdentityEvents, _: &mut Context<Self>) {
        for event in batch.events {
            self.apply(&batch.cluster, event);
        }
    }
}

impl IdentityCacheActor {
    fn apply(&mut self, cluster: &str, event: IdentityEvent) {
        let ids = &mut self.identities;
        // Policy consumes the changes once it exists; count them meanwhile.
        let changes = match event {
            IdentityEvent::Start { generation } => ids.start(cluster, generation).len(),
            IdentityEvent::Change {
                generation,
                change: Change::Upsert(identity),
            } => usize::from(ids.upsert(cluster, generation, identity).is_some()),
            IdentityEvent::Change {
                generation,
                change: Change::Delete(identity),
            } => usize::from(ids.delete(cluster, generation, identity.id).is_some()),
            IdentityEvent::ListDone { generation } => ids.list_done(cluster, generation).len(),
            IdentityEvent::Stop { generation } => ids.stop(cluster, generation).len(),
            IdentityEvent::RemoveCluster => ids.remove_cluster(cluster).len(),
        };
        self.changes += changes as u64;
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
