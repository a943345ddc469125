//! Each node's published snapshots, for the `NodeIpam` gRPC service: a `watch` channel per
//! node carrying its newest published object (what `WatchNode` streams), and a short history
//! of the generations published (what `ReportUsage` answers must name). Plain state, no
//! actors: the node manager feeds it every object it comes to know and hands out receivers.
//!
//! A node's object is *published* once its status lists an ENI (the operator never publishes
//! an empty status, see `pass::run`); every stored generation of it from then on is a
//! snapshot, whoever wrote it (the operator's passes, the agent's reports, anyone through the
//! store), because each one pairs status and pool of one stored version. Generations only
//! move forward: an object older than the one held (a store watch lagging behind a direct
//! write) is ignored.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use tokio::sync::watch;

use crate::cilium_node::CiliumNode;
use crate::node_allocator::release::{MARKED_FOR_RELEASE, RELEASED};

/// Generations kept per node: a report must answer one of the node's last this many
/// snapshots. An agent answers the snapshot it holds, which is at most a few generations
/// old; an older one is stale and its answers are refused rather than applied blind.
pub const HISTORY: usize = 16;

/// What a node's channel holds.
#[derive(Debug, Clone, Default)]
pub enum Published {
    /// The node is driven but nothing was published yet.
    #[default]
    Pending,
    /// The newest published object: status and pool of one stored generation.
    Node(Arc<CiliumNode>),
    /// The node is no longer driven (deleted, or it lost its instance ID); the channel
    /// closes after this.
    Gone,
}

/// One published generation, as much of it as a report is checked against.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Generation {
    /// The stored generation (resourceVersion).
    pub generation: String,
    /// Addresses the snapshot showed `marked-for-release`: the ones an answer may be for.
    pub marked: BTreeSet<String>,
    /// Addresses the snapshot showed `released` and no longer in its pool: an agent that
    /// reports on this snapshot has seen them go, so their entries may be removed (what
    /// Cilium's agent does once a released address left the pool).
    pub released: BTreeSet<String>,
}

impl Generation {
    /// The generation of `node` as stored.
    pub fn of(node: &CiliumNode) -> Self {
        let release_ips = node.status.as_ref().map(|status| &status.ipam.release_ips);
        let with_state = |state: &str| -> BTreeSet<String> {
            release_ips
                .into_iter()
                .flatten()
                .filter(|(_, value)| value.as_str() == state)
                .map(|(ip, _)| ip.clone())
                .collect()
        };
        let mut released = with_state(RELEASED);
        released.retain(|ip| !node.spec.ipam.pool.contains_key(ip));
        Self {
            generation: node.metadata.resource_version.clone().unwrap_or_default(),
            marked: with_state(MARKED_FOR_RELEASE),
            released,
        }
    }
}

/// Whether a report's generation may be answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GenerationCheck {
    /// The manager drives no node of that name.
    Unknown,
    /// The node has no published snapshot yet.
    Unpublished,
    /// Not one of the node's recent snapshots; `latest` is the newest.
    Stale {
        /// The newest published generation.
        latest: String,
    },
    /// One of the node's recent snapshots.
    Published(Generation),
}

/// One node's channel and history.
#[derive(Debug)]
struct Entry {
    sender: watch::Sender<Published>,
    /// Oldest first; at most [`HISTORY`].
    history: VecDeque<Generation>,
}

/// Every driven node's snapshots.
#[derive(Debug, Default)]
pub struct Snapshots {
    nodes: BTreeMap<String, Entry>,
}

/// True if the object is published: its status lists an ENI.
pub fn is_published(node: &CiliumNode) -> bool {
    node.status
        .as_ref()
        .is_some_and(|status| !status.eni.enis.is_empty())
}

/// Whether generation `new` comes after `old`: by number when both are numbers (etcd's
/// revisions, Kubernetes' resourceVersions in practice), else whenever they differ.
fn is_newer(new: &str, old: &str) -> bool {
    match (new.parse::<u64>(), old.parse::<u64>()) {
        (Ok(new), Ok(old)) => new > old,
        _ => new != old,
    }
}

impl Snapshots {
    /// No node.
    pub fn new() -> Self {
        Self::default()
    }

    /// The newest object the manager holds for a driven node: starts the node's channel if
    /// needed, and publishes the object to its watchers if it is published and newer than
    /// the last. Returns true if the watchers got it.
    pub fn observe(&mut self, node: &CiliumNode) -> bool {
        let Some(name) = node.metadata.name.as_deref() else {
            return false;
        };
        let entry = self.nodes.entry(name.to_owned()).or_insert_with(|| Entry {
            sender: watch::Sender::new(Published::Pending),
            history: VecDeque::new(),
        });
        if !is_published(node) {
            return false;
        }
        let generation = Generation::of(node);
        if entry
            .history
            .back()
            .is_some_and(|last| !is_newer(&generation.generation, &last.generation))
        {
            return false;
        }
        if entry.history.len() == HISTORY {
            entry.history.pop_front();
        }
        entry.history.push_back(generation);
        // `send_replace` stores the value even while nobody watches, for the next watcher.
        entry
            .sender
            .send_replace(Published::Node(Arc::new(node.clone())));
        true
    }

    /// The node is no longer driven: its watchers learn it and the channel closes.
    pub fn remove(&mut self, name: &str) {
        if let Some(entry) = self.nodes.remove(name) {
            entry.sender.send_replace(Published::Gone);
        }
    }

    /// Keeps only the nodes `keep` says are still driven.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        let gone: Vec<String> = self
            .nodes
            .keys()
            .filter(|name| !keep(name))
            .cloned()
            .collect();
        for name in gone {
            self.remove(&name);
        }
    }

    /// A receiver of the node's snapshots (holding the newest one), `None` for a node that
    /// is not driven.
    pub fn subscribe(&self, name: &str) -> Option<watch::Receiver<Published>> {
        self.nodes.get(name).map(|entry| entry.sender.subscribe())
    }

    /// Whether `generation` is one of the node's recent snapshots.
    pub fn check(&self, name: &str, generation: &str) -> GenerationCheck {
        let Some(entry) = self.nodes.get(name) else {
            return GenerationCheck::Unknown;
        };
        let Some(latest) = entry.history.back() else {
            return GenerationCheck::Unpublished;
        };
        match entry
            .history
            .iter()
            .rev()
            .find(|known| known.generation == generation)
        {
            Some(known) => GenerationCheck::Published(known.clone()),
            None => GenerationCheck::Stale {
                latest: latest.generation.clone(),
            },
        }
    }

    /// Number of nodes with a channel.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True if no node has a channel.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

#[cfg(test)]
mod tests;
