//! What remote clusters tell the rest of the agent, and the store observers that say it.
//!
//! Store observers run synchronously inside a watch store's task; they turn each change into
//! a typed event, buffer it, and hand the batch to every consumer's mailbox when the store
//! ends a batch (`Observer::flush`: a list page, a watch response). One message per batch
//! rather than per entry keeps a million-entry list from costing a million mailbox wake-ups.
//! Mailboxes are unbounded: the store never waits for a consumer.
//!
//! A store's first list-done travels in the same stream, after the entries it covers
//! ([`RemoteEvent::ListDone`]); once it is in every consumer's mailbox the forwarder tells the
//! barrier it was delivered, and each consumer that programs state acknowledges it itself
//! once applied (see [`crate::barrier`]).

use std::collections::HashSet;
use std::sync::Arc;

use actix::{Message, Recipient};
use meshwork_kvstore::Observer;
use meshwork_types::{Change, ClusterService, Identity, IpCacheEntry, Node, RemoteEvent, Resource};

use crate::barrier_actor::BarrierUpdate;

/// One incarnation of one remote cluster: a cluster removed and configured again is a new
/// incarnation, with fresh latches.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClusterRef {
    /// The cluster name.
    pub name: Arc<str>,
    /// Which incarnation.
    pub incarnation: u64,
}

impl ClusterRef {
    /// Incarnation `incarnation` of `name`.
    pub fn new(name: impl Into<Arc<str>>, incarnation: u64) -> Self {
        Self {
            name: name.into(),
            incarnation,
        }
    }
}

/// One remote cluster's events, in the order they happened. The cluster is named once per
/// batch, not per event: a store hands over thousands of entries per list page. The events
/// are shared by every consumer of the batch.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct RemoteEvents {
    /// The remote cluster every event comes from.
    pub cluster: ClusterRef,
    /// The events.
    pub events: Arc<Vec<RemoteEvent>>,
}

impl RemoteEvents {
    /// A batch of `events` from `cluster`.
    pub fn new(cluster: ClusterRef, events: Vec<RemoteEvent>) -> Self {
        Self {
            cluster,
            events: Arc::new(events),
        }
    }

    /// The resources whose first list-done this batch carries.
    pub fn lists_done(&self) -> impl Iterator<Item = Resource> + '_ {
        self.events.iter().filter_map(|event| match event {
            RemoteEvent::ListDone(resource) => Some(*resource),
            _ => None,
        })
    }

    /// The acknowledgement that `consumer` applied this batch's list-dones.
    pub fn applied_by(
        &self,
        consumer: crate::barrier::Consumer,
    ) -> impl Iterator<Item = BarrierUpdate> + '_ {
        self.lists_done()
            .map(move |resource| BarrierUpdate::Applied {
                cluster: Arc::clone(&self.cluster.name),
                incarnation: self.cluster.incarnation,
                resource,
                consumer,
            })
    }
}

/// One remote cluster's identity events, in the order they happened.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct IdentityEvents {
    /// The remote cluster every event is about.
    pub cluster: ClusterRef,
    /// The events.
    pub events: Vec<IdentityEvent>,
}

impl IdentityEvents {
    /// A batch of one event.
    pub fn one(cluster: ClusterRef, event: IdentityEvent) -> Self {
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

/// Where a cluster's stores send what they see.
#[derive(Clone)]
pub struct Sinks {
    /// The sync barrier (told when a first list was delivered).
    pub barrier: Recipient<BarrierUpdate>,
    /// Every consumer of nodes, services and ipcache entries, each sent every batch in order.
    pub consumers: Vec<Recipient<RemoteEvents>>,
    /// The identity cache.
    pub identities: Recipient<IdentityEvents>,
}

impl Sinks {
    fn delivered(&self, cluster: &ClusterRef, resource: Resource) {
        self.barrier.do_send(BarrierUpdate::Delivered {
            cluster: Arc::clone(&cluster.name),
            incarnation: cluster.incarnation,
            resource,
        });
    }
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

/// What differs between the stores of nodes, services and ipcache entries: which of their
/// changes become events.
pub trait Route: Send + 'static {
    /// The store's value.
    type Value: Send + Sync;
    /// The resource the store syncs.
    const RESOURCE: Resource;
    /// `value` was stored under `key` (`created`: the key is new).
    fn upsert(&mut self, key: &str, value: &Arc<Self::Value>, created: bool)
    -> Option<RemoteEvent>;
    /// `key` was deleted; `value` was its last value.
    fn delete(&mut self, key: &str, value: &Arc<Self::Value>) -> Option<RemoteEvent>;
}

/// The observer of one remote store: buffers its events and hands each batch to every
/// consumer, its list-done included.
pub struct Forwarder<R> {
    cluster: ClusterRef,
    sinks: Sinks,
    route: R,
    batch: Batch<RemoteEvent>,
    list_done: bool,
}

impl<R: Route> Forwarder<R> {
    /// A forwarder of `cluster`'s store to `sinks`, choosing events with `route`.
    pub fn new(cluster: ClusterRef, sinks: Sinks, route: R) -> Self {
        Self {
            cluster,
            sinks,
            route,
            batch: Batch::default(),
            list_done: false,
        }
    }

    fn push(&mut self, event: Option<RemoteEvent>) {
        if let Some(event) = event {
            self.batch.push(event);
        }
    }
}

impl<R: Route> Observer<R::Value> for Forwarder<R> {
    fn on_upsert(&mut self, key: &str, value: &Arc<R::Value>) {
        let event = self.route.upsert(key, value, false);
        self.push(event);
    }

    fn on_create(&mut self, key: &str, value: &Arc<R::Value>) {
        let event = self.route.upsert(key, value, true);
        self.push(event);
    }

    fn on_delete(&mut self, key: &str, value: &Arc<R::Value>) {
        let event = self.route.delete(key, value);
        self.push(event);
    }

    fn on_list_done(&mut self) {
        self.batch.push(RemoteEvent::ListDone(R::RESOURCE));
        self.list_done = true;
    }

    fn flush(&mut self) {
        let Some(events) = self.batch.take() else {
            return;
        };
        let batch = RemoteEvents::new(self.cluster.clone(), events);
        if let Some((last, rest)) = self.sinks.consumers.split_last() {
            for consumer in rest {
                consumer.do_send(batch.clone());
            }
            last.do_send(batch);
        }
        if std::mem::take(&mut self.list_done) {
            self.sinks.delivered(&self.cluster, R::RESOURCE);
        }
    }
}

/// Every node change.
pub struct NodeRoute;

impl Route for NodeRoute {
    type Value = Node;
    const RESOURCE: Resource = Resource::Nodes;

    fn upsert(&mut self, _key: &str, value: &Arc<Node>, _created: bool) -> Option<RemoteEvent> {
        Some(RemoteEvent::Node {
            change: Change::Upsert(Arc::clone(value)),
        })
    }

    fn delete(&mut self, _key: &str, value: &Arc<Node>) -> Option<RemoteEvent> {
        Some(RemoteEvent::Node {
            change: Change::Delete(Arc::clone(value)),
        })
    }
}

/// Global services: only `shared` ones; a service that stops being shared is a delete.
#[derive(Default)]
pub struct ServiceRoute {
    /// Keys forwarded as shared, to turn "no longer shared" into a delete.
    shared: HashSet<String>,
}

impl Route for ServiceRoute {
    type Value = ClusterService;
    const RESOURCE: Resource = Resource::Services;

    fn upsert(
        &mut self,
        key: &str,
        value: &Arc<ClusterService>,
        _created: bool,
    ) -> Option<RemoteEvent> {
        let change = if value.shared {
            self.shared.insert(key.to_owned());
            Change::Upsert(Arc::clone(value))
        } else if self.shared.remove(key) {
            Change::Delete(Arc::clone(value))
        } else {
            return None;
        };
        Some(RemoteEvent::Service { change })
    }

    fn delete(&mut self, key: &str, value: &Arc<ClusterService>) -> Option<RemoteEvent> {
        self.shared.remove(key).then(|| RemoteEvent::Service {
            change: Change::Delete(Arc::clone(value)),
        })
    }
}

/// Every ipcache change, marking keys the cluster did not have before.
pub struct IpCacheRoute;

impl Route for IpCacheRoute {
    type Value = IpCacheEntry;
    const RESOURCE: Resource = Resource::IpCache;

    fn upsert(
        &mut self,
        _key: &str,
        value: &Arc<IpCacheEntry>,
        created: bool,
    ) -> Option<RemoteEvent> {
        Some(RemoteEvent::IpCache {
            created,
            change: Change::Upsert(Arc::clone(value)),
        })
    }

    fn delete(&mut self, _key: &str, value: &Arc<IpCacheEntry>) -> Option<RemoteEvent> {
        Some(RemoteEvent::IpCache {
            created: false,
            change: Change::Delete(Arc::clone(value)),
        })
    }
}

/// Forwards identity changes of one connection, its list-done included.
pub struct IdentityForwarder {
    cluster: ClusterRef,
    generation: u64,
    sinks: Sinks,
    batch: Batch<IdentityEvent>,
    list_done: bool,
}

impl IdentityForwarder {
    /// A forwarder of `cluster`'s identities of connection `generation` to `sinks`.
    pub fn new(cluster: ClusterRef, generation: u64, sinks: Sinks) -> Self {
        Self {
            cluster,
            generation,
            sinks,
            batch: Batch::default(),
            list_done: false,
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

    fn on_list_done(&mut self) {
        self.batch.push(IdentityEvent::ListDone {
            generation: self.generation,
        });
        self.list_done = true;
    }

    fn flush(&mut self) {
        if let Some(events) = self.batch.take() {
            self.sinks.identities.do_send(IdentityEvents {
                cluster: self.cluster.clone(),
                events,
            });
        }
        if std::mem::take(&mut self.list_done) {
            self.sinks.delivered(&self.cluster, Resource::Identities);
        }
    }
}
