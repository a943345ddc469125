//! What remote clusters tell the rest of the agent, and the store observers that say it.
//!
//! Store observers run synchronously inside a watch store's task; they turn each change into
//! a typed message and hand it to an actor's mailbox (`do_send`: the mailbox is unbounded,
//! the store never waits for a consumer).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use actix::{Message, Recipient};

use crate::kvstore::Observer;
use crate::types::{ClusterService, Identity, IpIdentityPair, Node};

/// An upsert or a delete of a value.
#[derive(Debug, Clone, PartialEq)]
pub enum Change<V> {
    /// Created or changed.
    Upsert(Arc<V>),
    /// Deleted; the last value.
    Delete(Arc<V>),
}

/// A change a remote cluster contributed.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub enum RemoteEvent {
    /// A remote node.
    Node {
        /// The remote cluster.
        cluster: Arc<str>,
        /// The change.
        change: Change<Node>,
    },
    /// A remote global (shared) service.
    Service {
        /// The remote cluster.
        cluster: Arc<str>,
        /// Position in the cluster's service event stream; the consumer acknowledges it.
        seq: u64,
        /// The change.
        change: Change<ClusterService>,
    },
    /// A remote ipcache entry, keyed as in etcd (`<ip>` or `<ip>/<len>`).
    IpCache {
        /// The remote cluster.
        cluster: Arc<str>,
        /// The key below `cilium/state/ip/v1/default/`.
        key: Arc<str>,
        /// The change.
        change: Change<IpIdentityPair>,
    },
}

/// A change of a remote cluster's identities, per connection (`generation`).
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub enum IdentityEvent {
    /// A connection starts filling a fresh cache.
    Start {
        /// The remote cluster.
        cluster: Arc<str>,
        /// The connection.
        generation: u64,
    },
    /// An identity of that connection.
    Change {
        /// The remote cluster.
        cluster: Arc<str>,
        /// The connection.
        generation: u64,
        /// The change.
        change: Change<Identity>,
    },
    /// The connection's first list is done: its cache replaces the registered one.
    ListDone {
        /// The remote cluster.
        cluster: Arc<str>,
        /// The connection.
        generation: u64,
    },
    /// The connection ended.
    Stop {
        /// The remote cluster.
        cluster: Arc<str>,
        /// The connection.
        generation: u64,
    },
    /// The cluster was removed: delete all it contributed.
    RemoveCluster {
        /// The remote cluster.
        cluster: Arc<str>,
    },
}

/// Forwards node changes.
pub struct NodeForwarder {
    /// The remote cluster.
    pub cluster: Arc<str>,
    /// Where changes go.
    pub to: Recipient<RemoteEvent>,
}

impl Observer<Node> for NodeForwarder {
    fn on_upsert(&mut self, _key: &str, value: &Arc<Node>) {
        self.to.do_send(RemoteEvent::Node {
            cluster: Arc::clone(&self.cluster),
            change: Change::Upsert(Arc::clone(value)),
        });
    }

    fn on_delete(&mut self, _key: &str, value: &Arc<Node>) {
        self.to.do_send(RemoteEvent::Node {
            cluster: Arc::clone(&self.cluster),
            change: Change::Delete(Arc::clone(value)),
        });
    }
}

/// Forwards global services: only `shared` ones; a service that stops being shared is a
/// delete. Numbers every event so the consumer can acknowledge programming.
pub struct ServiceForwarder {
    /// The remote cluster.
    pub cluster: Arc<str>,
    /// Where changes go.
    pub to: Recipient<RemoteEvent>,
    /// The last sequence number handed out (shared with the list-done callback).
    pub last_seq: Arc<AtomicU64>,
    /// Keys forwarded as shared, to turn "no longer shared" into a delete.
    pub shared: HashSet<String>,
}

impl ServiceForwarder {
    fn send(&mut self, change: Change<ClusterService>) {
        let seq = self.last_seq.fetch_add(1, Ordering::AcqRel) + 1;
        self.to.do_send(RemoteEvent::Service {
            cluster: Arc::clone(&self.cluster),
            seq,
            change,
        });
    }
}

impl Observer<ClusterService> for ServiceForwarder {
    fn on_upsert(&mut self, key: &str, value: &Arc<ClusterService>) {
        if value.shared {
            self.shared.insert(key.to_owned());
            self.send(Change::Upsert(Arc::clone(value)));
        } else if self.shared.remove(key) {
            self.send(Change::Delete(Arc::clone(value)));
        }
    }

    fn on_delete(&mut self, key: &str, value: &Arc<ClusterService>) {
        if self.shared.remove(key) {
            self.send(Change::Delete(Arc::clone(value)));
        }
    }
}

/// Forwards ipcache changes.
pub struct IpCacheForwarder {
    /// The remote cluster.
    pub cluster: Arc<str>,
    /// Where changes go.
    pub to: Recipient<RemoteEvent>,
}

impl Observer<IpIdentityPair> for IpCacheForwarder {
    fn on_upsert(&mut self, key: &str, value: &Arc<IpIdentityPair>) {
        self.to.do_send(RemoteEvent::IpCache {
            cluster: Arc::clone(&self.cluster),
            key: key.into(),
            change: Change::Upsert(Arc::clone(value)),
        });
    }

    fn on_delete(&mut self, key: &str, value: &Arc<IpIdentityPair>) {
        self.to.do_send(RemoteEvent::IpCache {
            cluster: Arc::clone(&self.cluster),
            key: key.into(),
            change: Change::Delete(Arc::clone(value)),
        });
    }
}

/// Forwards identity changes of one connection.
pub struct IdentityForwarder {
    /// The remote cluster.
    pub cluster: Arc<str>,
    /// The connection.
    pub generation: u64,
    /// Where changes go.
    pub to: Recipient<IdentityEvent>,
}

impl Observer<Identity> for IdentityForwarder {
    fn on_upsert(&mut self, _key: &str, value: &Arc<Identity>) {
        self.to.do_send(IdentityEvent::Change {
            cluster: Arc::clone(&self.cluster),
            generation: self.generation,
            change: Change::Upsert(Arc::clone(value)),
        });
    }

    fn on_delete(&mut self, _key: &str, value: &Arc<Identity>) {
        self.to.do_send(IdentityEvent::Change {
            cluster: Arc::clone(&self.cluster),
            generation: self.generation,
            change: Change::Delete(Arc::clone(value)),
        });
    }
}
