//! The remote state the agent holds: nodes, global services and ipcache entries of every
//! remote cluster, as the stores deliver them. It acknowledges service events once applied,
//! which completes the barrier's services latch (until the datapath programs them itself).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use actix::{Actor, Context, Handler, Message, MessageResult, Recipient};
use tokio::sync::mpsc;

use super::barrier_actor::BarrierUpdate;
use super::events::{Change, RemoteEvent, RemoteEvents};
use crate::types::{ClusterService, IpCacheEntry, Node};

/// Counts of what one cluster contributed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Contribution {
    /// Nodes.
    pub nodes: usize,
    /// Global services.
    pub services: usize,
    /// ipcache entries.
    pub ipcache: usize,
}

/// The merged remote state. A plain state machine. ipcache entries are only counted: the
/// watch stores hold them, and their consumers (the datapath) keep their own copy.
#[derive(Default)]
pub struct RemoteState {
    nodes: HashMap<(Arc<str>, String), Arc<Node>>,
    services: HashMap<(Arc<str>, String), Arc<ClusterService>>,
    ipcache: HashMap<Arc<str>, usize>,
}

impl RemoteState {
    /// Applies a batch of one cluster's events; answers the `seq` of its last service event.
    pub fn apply(&mut self, batch: &RemoteEvents) -> Option<u64> {
        let cluster = &batch.cluster;
        // ipcache entries are counted per batch: one map update per list page.
        let (mut created, mut deleted) = (0usize, 0usize);
        let mut last_seq = None;
        for event in &batch.events {
            match event {
                RemoteEvent::Node { change } => {
                    apply(
                        &mut self.nodes,
                        (Arc::clone(cluster), node_key(change)),
                        change,
                    );
                }
                RemoteEvent::Service { seq, change } => {
                    apply(
                        &mut self.services,
                        (Arc::clone(cluster), service_key(change)),
                        change,
                    );
                    last_seq = last_seq.max(Some(*seq));
                }
                RemoteEvent::IpCache {
                    created: true,
                    change: Change::Upsert(_),
                } => created += 1,
                RemoteEvent::IpCache {
                    change: Change::Upsert(_),
                    ..
                } => {}
                RemoteEvent::IpCache {
                    change: Change::Delete(_),
                    ..
                } => deleted += 1,
            }
        }
        if created > 0 || deleted > 0 {
            let count = self.ipcache.entry(Arc::clone(cluster)).or_default();
            *count = (*count + created).saturating_sub(deleted);
        }
        last_seq
    }

    /// What `cluster` contributes now.
    pub fn contribution(&self, cluster: &str) -> Contribution {
        Contribution {
            nodes: self.nodes.keys().filter(|(c, _)| &**c == cluster).count(),
            services: self
                .services
                .keys()
                .filter(|(c, _)| &**c == cluster)
                .count(),
            ipcache: self.ipcache.get(cluster).copied().unwrap_or(0),
        }
    }
}

fn node_key(change: &Change<Node>) -> String {
    match change {
        Change::Upsert(n) | Change::Delete(n) => n.name.clone(),
    }
}

fn service_key(change: &Change<ClusterService>) -> String {
    match change {
        Change::Upsert(s) | Change::Delete(s) => format!("{}/{}", s.namespace, s.name),
    }
}

fn apply<K: std::hash::Hash + Eq, V>(map: &mut HashMap<K, Arc<V>>, key: K, change: &Change<V>) {
    match change {
        Change::Upsert(value) => {
            map.insert(key, Arc::clone(value));
        }
        Change::Delete(_) => {
            map.remove(&key);
        }
    }
}

/// The actor shell of [`RemoteState`].
pub struct RemoteStateActor {
    state: RemoteState,
    barrier: Recipient<BarrierUpdate>,
    ack_services: bool,
    subscribers: Vec<Recipient<RemoteEvents>>,
    ipcache_tap: Option<mpsc::UnboundedSender<(Arc<IpCacheEntry>, Instant)>>,
}

impl RemoteStateActor {
    /// A consumer that acknowledges services to `barrier`.
    pub fn new(barrier: Recipient<BarrierUpdate>) -> Self {
        Self {
            state: RemoteState::default(),
            barrier,
            ack_services: true,
            subscribers: Vec::new(),
            ipcache_tap: None,
        }
    }

    /// Also forwards every batch to `subscriber` (the datapath writer, WireGuard), in order.
    pub fn with_subscriber(mut self, subscriber: Recipient<RemoteEvents>) -> Self {
        self.subscribers.push(subscriber);
        self
    }

    /// Leaves service acknowledgements to a subscriber that programs services (the datapath
    /// acknowledges once the backends are written).
    pub fn without_service_acks(mut self) -> Self {
        self.ack_services = false;
        self
    }

    /// Also reports every applied ipcache entry on `tap`, stamped when it was applied
    /// (benchmarks measure propagation).
    pub fn with_ipcache_tap(
        mut self,
        tap: mpsc::UnboundedSender<(Arc<IpCacheEntry>, Instant)>,
    ) -> Self {
        self.ipcache_tap = Some(tap);
        self
    }
}

impl Actor for RemoteStateActor {
    type Context = Context<Self>;
}

impl Handler<RemoteEvents> for RemoteStateActor {
    type Result = ();

    fn handle(&mut self, batch: RemoteEvents, _: &mut Context<Self>) {
        let last_service = self.state.apply(&batch);
        if let Some(seq) = last_service
            && self.ack_services
        {
            self.barrier.do_send(BarrierUpdate::ServicesProgrammed {
                cluster: batch.cluster.to_string(),
                seq,
            });
        }
        if let Some(tap) = &self.ipcache_tap {
            for event in &batch.events {
                if let RemoteEvent::IpCache { change, .. } = event {
                    let (Change::Upsert(entry) | Change::Delete(entry)) = change;
                    let _ = tap.send((Arc::clone(entry), Instant::now()));
                }
            }
        }
        if let Some((last, rest)) = self.subscribers.split_last() {
            for subscriber in rest {
                subscriber.do_send(batch.clone());
            }
            last.do_send(batch);
        }
    }
}

/// Asks what a cluster contributes.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Contribution")]
pub struct GetContribution(pub String);

impl Handler<GetContribution> for RemoteStateActor {
    type Result = MessageResult<GetContribution>;

    fn handle(
        &mut self,
        GetContribution(cluster): GetContribution,
        _: &mut Context<Self>,
    ) -> Self::Result {
        MessageResult(self.state.contribution(&cluster))
    }
}

/// Resolves once every subscriber has handled every batch forwarded before it: a consumer
/// that saw a sync latch complete uses it to know the synced entries reached the datapath.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct Settle;

impl Handler<Settle> for RemoteStateActor {
    type Result = actix::ResponseFuture<()>;

    fn handle(&mut self, _: Settle, _: &mut Context<Self>) -> Self::Result {
        let subscribers = self.subscribers.clone();
        Box::pin(async move {
            // Mailboxes are FIFO: an empty batch is handled after every earlier one.
            for subscriber in subscribers {
                let _ = subscriber.send(RemoteEvents::default()).await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::IpIdentityPair;

    fn ip(addr: &str) -> Arc<IpCacheEntry> {
        let pair = IpIdentityPair {
            ip: Some(addr.parse().unwrap()),
            id: 70_000,
            ..IpIdentityPair::default()
        };
        Arc::new(IpCacheEntry::from_pair(pair).unwrap())
    }

    fn service(name: &str) -> Arc<ClusterService> {
        Arc::new(ClusterService {
            namespace: "default".to_owned(),
            name: name.to_owned(),
            ..ClusterService::default()
        })
    }

    #[test]
    fn a_batch_counts_entries_once_and_answers_its_last_service() {
        let mut state = RemoteState::default();
        let events = vec![
            RemoteEvent::IpCache {
                created: true,
                change: Change::Upsert(ip("10.1.0.1")),
            },
            RemoteEvent::IpCache {
                created: true,
                change: Change::Upsert(ip("10.1.0.2")),
            },
            RemoteEvent::Service {
                seq: 7,
                change: Change::Upsert(service("a")),
            },
            // A changed entry is not a new one.
            RemoteEvent::IpCache {
                created: false,
                change: Change::Upsert(ip("10.1.0.2")),
            },
            RemoteEvent::Service {
                seq: 8,
                change: Change::Upsert(service("b")),
            },
            RemoteEvent::IpCache {
                created: false,
                change: Change::Delete(ip("10.1.0.1")),
            },
            RemoteEvent::Node {
                change: Change::Upsert(Arc::new(Node {
                    name: "n1".to_owned(),
                    ..Node::default()
                })),
            },
        ];
        let batch = RemoteEvents {
            cluster: Arc::from("b"),
            events,
        };
        assert_eq!(state.apply(&batch), Some(8));
        assert_eq!(
            state.contribution("b"),
            Contribution {
                nodes: 1,
                services: 2,
                ipcache: 1
            }
        );
        assert_eq!(state.contribution("c"), Contribution::default());
        assert_eq!(state.apply(&RemoteEvents::default()), None);
    }
}
