//! What remote clusters tell the rest of the agent, and the store observers that say it.
//!
//! Store observers run synchronously inside a watch store's task; they turn each change into
//! a typed event, buffer it, and hand the batch to an actor's mailbox when the store ends a
//! batch (`Observer::flush`: a list page, a watch response). One message per batch rather
//! than per entry keeps a million-entry list from costing a million mailbox wake-ups. The
//! mailbox is unbounded: the store never waits for a consumer.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use actix::{Message, Recipient};

use crate::kvstore::Observer;
use crate::types::{ClusterService, Identity, IpCacheEntry, Node};

/// An upsert or a delete of a value.
#[derive(Debug, Clone, PartialEq)]
pub enum Change<V> {
    /// Created or changed.
    Upsert(Arc<V>),
    /// Deleted; the last value.
    Delete(Arc<V>),
}

/// A change a remote cluster contributed (the cluster is the batch's, [`RemoteEvents`]).
#[derive(Debug, Clone)]
pub enum RemoteEvent {
    /// A remote node.
    Node {
        /// The change.
        change: Change<Node>,
    },
    /// A remote global (shared) service.
    Service {
        /// Position in the cluster's service event stream; the consumer acknowledges it.
        seq: u64,
        /// The change.
        change: Change<ClusterService>,
    },
    /// A remote ipcache entry (its key is [`IpCacheEntry::key_name`]).
    IpCache {
        /// An upsert of a key the cluster did not have before.
        created: bool,
        /// The change.
        change: Change<IpCacheEntry>,
    },
}

/// One remote cluster's events, in the order they happened. The cluster is named once per
/// batch, not per event: a store hands over thousands of entries per list page.
#[derive(Debug, Clone, Default, Message)]
#[rtype(result = "()")]
pub struct RemoteEvents {
    /// The remote cluster every event comes from.
    pub cluster: Arc<str>,
    /// The events.
    pub events: Vec<RemoteEvent>,
}

/// One remote cluster's identity events, in the order they happened.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct IdentityEvents {
    /// The remote cluster every event is about.
    pub cluster: Arc<str>,
    /// The events.
    pub events: Vec<IdentityEvent>,
}

impl IdentityEvents {
    /// A batch of one event.
    pub fn one(cluster: Arc<str>, event: IdentityEvent) -> Self {
        Self {
            cluster,
            events: vec![event],
        }
    }
}

/// A change of a remote cluster's identities, per connection (`generation`).
#[derive(Debug, Clone)]
pub enum IdentityEvent {
    /// A connection starts filling a fresh cache.
    Start {
        /// The connection.
        generation: u64,
    },
    /// An identity of that connection.
    Change {
        /// The connection.
        generation: u64,
        /// The change.
        change: Change<Identity>,
    },
    /// The connection's first list is done: its cache replaces the registered one.
    ListDone {
        /// The connection.
        generation: u64,
    },
    /// The connection ended.
    Stop {
        /// The connection.
        generation: u64,
    },
    /// The cluster was removed: delete all it contributed.
    RemoveCluster,
}

/// Buffers events until the store ends a batch.
pub struct Batch<E> {
    events: Vec<E>,
    // The size of the last batch handed on: list pages come in equal sizes, so the next
    // buffer is made that size at once instead of growing (and copying) ten times per page.
    hint: usize,
}

impl<E> Default for Batch<E> {
    fn default() -> Self {
        Self {
            events: Vec::new(),
            hint: 0,
        }
    }
}

impl<E> Batch<E> {
    fn push(&mut self, event: E) {
        if self.events.capacity() == 0 {
            self.events.reserve(self.hint);
        }
        self.events.push(event);
    }

    fn take(&mut self) -> Option<Vec<E>> {
        if self.events.is_empty() {
            return None;
        }
        self.hint = self.events.len();
        Some(std::mem::take(&mut self.events))
    }
}

/// Forwards node changes.
pub struct NodeForwarder {
    /// The remote cluster.
    pub cluster: Arc<str>,
    /// Where changes go.
    pub to: Recipient<RemoteEvents>,
    /// Changes not handed on yet.
    pub batch: Batch<RemoteEvent>,
}

impl NodeForwarder {
    /// A forwarder of `cluster`'s nodes to `to`.
    pub fn new(cluster: Arc<str>, to: Recipient<RemoteEvents>) -> Self {
        Self {
            cluster,
            to,
            batch: Batch::default(),
        }
    }

    fn push(&mut self, change: Change<Node>) {
        self.batch.push(RemoteEvent::Node { change });
    }
}

impl Observer<Node> for NodeForwarder {
    fn on_upsert(&mut self, _key: &str, value: &Arc<Node>) {
        self.push(Change::Upsert(Arc::clone(value)));
    }

    fn on_delete(&mut self, _key: &str, value: &Arc<Node>) {
        self.push(Change::Delete(Arc::clone(value)));
    }

    fn flush(&mut self) {
        if let Some(events) = self.batch.take() {
            self.to.do_send(RemoteEvents {
                cluster: Arc::clone(&self.cluster),
                events,
            });
        }
    }
}

/// Forwards global services: only `shared` ones; a service that stops being shared is a
/// delete. Numbers every event so the consumer can acknowledge programming.
pub struct ServiceForwarder {
    /// The remote cluster.
    pub cluster: Arc<str>,
    /// Where changes go.
    pub to: Recipient<RemoteEvents>,
    /// The last sequence number handed out (shared with the list-done callback).
    pub last_seq: Arc<AtomicU64>,
    /// Keys forwarded as shared, to turn "no longer shared" into a delete.
    pub shared: HashSet<String>,
    /// Changes not handed on yet.
    pub batch: Batch<RemoteEvent>,
}

impl ServiceForwarder {
    /// A forwarder of `cluster`'s services to `to`, numbering from `last_seq`.
    pub fn new(cluster: Arc<str>, to: Recipient<RemoteEvents>, last_seq: Arc<AtomicU64>) -> Self {
        Self {
            cluster,
            to,
            last_seq,
            shared: HashSet::new(),
            batch: Batch::default(),
        }
    }

    fn push(&mut self, change: Change<ClusterService>) {
        let seq = self.last_seq.fetch_add(1, Ordering::AcqRel) + 1;
        self.batch.push(RemoteEvent::Service { seq, change });
    }
}

impl Observer<ClusterService> for ServiceForwarder {
    fn on_upsert(&mut self, key: &str, value: &Arc<ClusterService>) {
        if value.shared {
            self.shared.insert(key.to_owned());
            self.push(Change::Upsert(Arc::clone(value)));
        } else if self.shared.remove(key) {
            self.push(Change::Delete(Arc::clone(value)));
        }
    }

    fn on_delete(&mut self, key: &str, value: &Arc<ClusterService>) {
        if self.shared.remove(key) {
            self.push(Change::Delete(Arc::clone(value)));
        }
    }

    fn flush(&mut self) {
        if let Some(events) = self.batch.take() {
            self.to.do_send(RemoteEvents {
                cluster: Arc::clone(&self.cluster),
                events,
            });
        }
    }
}

/// Forwards ipcache changes.
pub struct IpCacheForwarder {
    /// The remote cluster.
    pub cluster: Arc<str>,
    /// Where changes go.
    pub to: Recipient<RemoteEvents>,
    /// Changes not handed on yet.
    pub batch: Batch<RemoteEvent>,
}

impl IpCacheForwarder {
    /// A forwarder of `cluster`'s ipcache to `to`.
    pub fn new(cluster: Arc<str>, to: Recipient<RemoteEvents>) -> Self {
        Self {
            cluster,
            to,
            batch: Batch::default(),
        }
    }

    fn push(&mut self, created: bool, change: Change<IpCacheEntry>) {
        self.batch.push(RemoteEvent::IpCache { created, change });
    }
}

impl Observer<IpCacheEntry> for IpCacheForwarder {
    fn on_upsert(&mut self, _key: &str, value: &Arc<IpCacheEntry>) {
        self.push(false, Change::Upsert(Arc::clone(value)));
    }

    fn on_create(&mut self, _key: &str, value: &Arc<IpCacheEntry>) {
        self.push(true, Change::Upsert(Arc::clone(value)));
    }

    fn on_delete(&mut self, _key: &str, value: &Arc<IpCacheEntry>) {
        self.push(false, Change::Delete(Arc::clone(value)));
    }

    fn flush(&mut self) {
        if let Some(events) = self.batch.take() {
            self.to.do_send(RemoteEvents {
                cluster: Arc::clone(&self.cluster),
                events,
            });
        }
    }
}

/// Forwards identity changes of one connection.
pub struct IdentityForwarder {
    /// The remote cluster.
    pub cluster: Arc<str>,
    /// The connection.
    pub generation: u64,
    /// Where changes go.
    pub to: Recipient<IdentityEvents>,
    /// Changes not handed on yet.
    pub batch: Batch<IdentityEvent>,
}

impl IdentityForwarder {
    /// A forwarder of `cluster`'s identities of connection `generation` to `to`.
    pub fn new(cluster: Arc<str>, generation: u64, to: Recipient<IdentityEvents>) -> Self {
        Self {
            cluster,
            generation,
            to,
            batch: Batch::default(),
        }
    }

    fn push(&mut self, change: Change<Identity>) {
        self.batch.push(IdentityEvent::Change {
            generation: self.generation,
            change,
        });
    }
}

impl Observer<Identity> for IdentityForwarder {
    fn on_upsert(&mut self, _key: &str, value: &Arc<Identity>) {
        self.push(Change::Upsert(Arc::clone(value)));
    }

    fn on_delete(&mut self, _key: &str, value: &Arc<Identity>) {
        self.push(Change::Delete(Arc::clone(value)));
    }

    fn flush(&mut self) {
        if let Some(events) = self.batch.take() {
            self.to.do_send(IdentityEvents {
                cluster: Arc::clone(&self.cluster),
                events,
            });
        }
    }
}
