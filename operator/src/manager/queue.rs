//! The node manager's state, without actors or EC2: which nodes exist, which need a pass,
//! and which goes next — the worst deficit first, each node at most once per
//! [`MIN_PASS_INTERVAL`], never two passes of one node at once.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::cilium_node::CiliumNode;
use crate::cilium_node::convert::node_spec;
use crate::model::Tags;
use crate::node_allocator::{NodeAllocator, NodeSpec};

/// The shortest time between the starts of two passes of one node.
pub const MIN_PASS_INTERVAL: Duration = Duration::from_secs(1);
/// The longest wait before retrying a node whose passes keep failing.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(60);

/// One node.
#[derive(Debug)]
struct Entry {
    /// `None` while a pass has it.
    allocator: Option<NodeAllocator>,
    /// The newest stored object.
    latest: CiliumNode,
    /// Something changed since the last pass started.
    dirty: bool,
    /// When the next pass may start at the earliest.
    not_before: Option<Instant>,
    /// Passes failed in a row with a transient error.
    failures: u32,
    /// A resync was asked for because the cache knew no ENI of the node's instance; not
    /// again until a pass finds the instance (or the node names another one), so a node
    /// whose instance is gone costs one describe, not one a second.
    asked_for_instance: bool,
}

/// A pass handed out by [`NodeQueue::next`]; give the allocator back with
/// [`NodeQueue::finish`].
#[derive(Debug)]
pub struct Pass {
    /// The node.
    pub name: String,
    /// Its allocator, owned by the pass meanwhile.
    pub allocator: NodeAllocator,
    /// The newest stored object when the pass started.
    pub latest: CiliumNode,
}

/// What a finished pass reports back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassOutcome {
    /// The node is as it should be (or blocked by an error a retry at once cannot fix):
    /// no new pass until something changes.
    Settled,
    /// More to do (e.g. a release waiting for its delay): pass again when allowed.
    Again,
    /// A transient failure (EC2 hiccup, store error): pass again after a delay of twice
    /// [`MIN_PASS_INTERVAL`], doubling with each failure in a row up to [`MAX_RETRY_DELAY`].
    Retry,
}

/// Every node with `spec.eni.instance-id`, and their pass bookkeeping.
#[derive(Debug, Default)]
pub struct NodeQueue {
    nodes: BTreeMap<String, Entry>,
    eni_tags: Tags,
    prefix_delegation: bool,
}

/// The parts of a node that, when changed, call for a pass: the request and the agent's
/// side (usage, release answers). The pool and `status.eni` are the operator's own output.
fn inputs(node: &CiliumNode) -> impl PartialEq + use<> {
    let status = node.status.as_ref().map(|status| {
        (
            status.ipam.used.keys().cloned().collect::<Vec<_>>(),
            status.ipam.release_ips.clone(),
        )
    });
    (
        node.spec.eni.clone(),
        {
            let mut ipam = node.spec.ipam.clone();
            ipam.pool.clear();
            ipam
        },
        status,
    )
}

impl NodeQueue {
    /// An empty queue; `eni_tags` go on every ENI created, `prefix_delegation` is
    /// `--aws-enable-prefix-delegation`.
    pub fn new(eni_tags: Tags, prefix_delegation: bool) -> Self {
        Self {
            nodes: BTreeMap::new(),
            eni_tags,
            prefix_delegation,
        }
    }

    fn spec_of(&self, node: &CiliumNode) -> NodeSpec {
        spec_with(node, self.prefix_delegation)
    }

    /// A node was created or changed. Nodes without `spec.eni.instance-id` are not ENI nodes
    /// and are ignored (and forgotten, if one lost its instance ID); a version older than
    /// the one held is ignored. Returns true if the node now needs a pass.
    pub fn upsert(&mut self, node: CiliumNode) -> bool {
        let Some(name) = node.metadata.name.clone() else {
            return false;
        };
        // A write the manager was told of directly can arrive before the store watch
        // delivers an older version: never go back to it.
        if let Some(entry) = self.nodes.get(&name)
            && is_older(&node, &entry.latest)
        {
            return entry.dirty;
        }
        if node.spec.eni.instance_id.is_empty() {
            self.remove(&name);
            return false;
        }
        let spec = self.spec_of(&node);
        match self.nodes.get_mut(&name) {
            Some(entry) => {
                let changed = inputs(&entry.latest) != inputs(&node);
                if entry.latest.spec.eni.instance_id != node.spec.eni.instance_id {
                    entry.asked_for_instance = false;
                }
                if let Some(allocator) = &mut entry.allocator
                    && allocator.spec() != &spec
                {
                    allocator.set_spec(spec);
                }
                entry.latest = node;
                entry.dirty |= changed;
                entry.dirty
            }
            None => {
                let allocator = NodeAllocator::new(spec, self.eni_tags.clone());
                self.nodes.insert(
                    name,
                    Entry {
                        allocator: Some(allocator),
                        latest: node,
                        dirty: true,
                        not_before: None,
                        failures: 0,
                        asked_for_instance: false,
                    },
                );
                true
            }
        }
    }

    /// The node's object was deleted: its allocator stops (a pass in flight is dropped when
    /// it finishes). Nothing is released: the ENIs go with the instance.
    pub fn remove(&mut self, name: &str) -> bool {
        self.nodes.remove(name).is_some()
    }

    /// Keeps only the nodes named in `names` (after a full re-list of the store).
    pub fn retain(&mut self, names: &std::collections::BTreeSet<String>) {
        self.nodes.retain(|name, _| names.contains(name));
    }

    /// Every node needs a pass (the describe cache was refreshed).
    pub fn mark_all(&mut self) {
        for entry in self.nodes.values_mut() {
            entry.dirty = true;
        }
    }

    /// Number of known nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True if no node is known.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The known nodes, by name.
    pub fn names(&self) -> Vec<String> {
        self.nodes.keys().cloned().collect()
    }

    /// The newest stored object of a node.
    pub fn latest(&self, name: &str) -> Option<&CiliumNode> {
        self.nodes.get(name).map(|entry| &entry.latest)
    }

    /// True if the node is known.
    pub fn contains(&self, name: &str) -> bool {
        self.nodes.contains_key(name)
    }

    /// Takes the next pass at `now`: among the nodes needing one, idle, and not passed within
    /// [`MIN_PASS_INTERVAL`], the one with the largest `deficit` (ties by name).
    pub fn next(
        &mut self,
        now: Instant,
        mut deficit: impl FnMut(&NodeAllocator, &CiliumNode) -> usize,
    ) -> Option<Pass> {
        let (name, _) = self
            .nodes
            .iter()
            .filter(|(_, entry)| entry.dirty && entry.allocator.is_some())
            .filter(|(_, entry)| entry.not_before.is_none_or(|at| now >= at))
            .filter_map(|(name, entry)| {
                let allocator = entry.allocator.as_ref()?;
                Some((name, deficit(allocator, &entry.latest)))
            })
            // max_by_key keeps the last maximum; iterate names backwards so ties go to the first.
            .rev()
            .max_by_key(|(_, deficit)| *deficit)?;
        let name = name.clone();
        let entry = self.nodes.get_mut(&name)?;
        entry.dirty = false;
        entry.not_before = Some(now + MIN_PASS_INTERVAL);
        Some(Pass {
            allocator: entry.allocator.take()?,
            latest: entry.latest.clone(),
            name,
        })
    }

    /// A pass found the describe cache knowing no ENI of the node's instance (`unknown`),
    /// or knowing it. Returns true when a resync should be asked for: the first time the
    /// instance is unknown (it may be newer than the last describe), not again until it was
    /// found.
    pub fn instance_unknown(&mut self, name: &str, unknown: bool) -> bool {
        let Some(entry) = self.nodes.get_mut(name) else {
            return false;
        };
        let ask = unknown && !entry.asked_for_instance;
        entry.asked_for_instance = unknown;
        ask
    }

    /// When the next pass may start, if a node is waiting only for its interval.
    pub fn next_wake(&self) -> Option<Instant> {
        self.nodes
            .values()
            .filter(|entry| entry.dirty && entry.allocator.is_some())
            .filter_map(|entry| entry.not_before)
            .min()
    }

    /// A pass ended: the allocator comes back (unless the node was deleted meanwhile), and
    /// `published` (the object as stored by the pass) becomes the newest known object unless
    /// a newer one arrived meanwhile.
    pub fn finish(
        &mut self,
        now: Instant,
        name: &str,
        allocator: NodeAllocator,
        published: Option<CiliumNode>,
        outcome: PassOutcome,
    ) {
        let Some(entry) = self.nodes.get_mut(name) else {
            tracing::debug!(node = %name, "node deleted during its pass; allocator stopped");
            return;
        };
        let mut allocator = allocator;
        // The object may have changed during the pass.
        let spec = spec_with(&entry.latest, self.prefix_delegation);
        if allocator.spec() != &spec {
            allocator.set_spec(spec);
        }
        entry.allocator = Some(allocator);
        if let Some(stored) = published
            && revision(&stored) > revision(&entry.latest)
        {
            entry.latest = stored;
        }
        match outcome {
            PassOutcome::Settled => entry.failures = 0,
            PassOutcome::Again => {
                entry.failures = 0;
                entry.dirty = true;
            }
            PassOutcome::Retry => {
                entry.failures = entry.failures.saturating_add(1);
                entry.dirty = true;
                let delay = MIN_PASS_INTERVAL
                    .saturating_mul(1 << entry.failures.min(6))
                    .min(MAX_RETRY_DELAY);
                let at = now + delay;
                entry.not_before = Some(entry.not_before.map_or(at, |before| before.max(at)));
            }
        }
    }
}

fn spec_with(node: &CiliumNode, prefix_delegation: bool) -> NodeSpec {
    let mut spec = node_spec(node);
    spec.prefix_delegation = prefix_delegation;
    spec
}

/// True if both objects carry a numeric resourceVersion and `node`'s is the smaller.
fn is_older(node: &CiliumNode, than: &CiliumNode) -> bool {
    let number = |node: &CiliumNode| {
        node.metadata
            .resource_version
            .as_deref()
            .and_then(|version| version.parse::<u64>().ok())
    };
    matches!((number(node), number(than)), (Some(new), Some(old)) if new < old)
}

/// The object's resourceVersion as a number (etcd revisions; Kubernetes' are opaque but
/// numeric in practice); 0 if none.
fn revision(node: &CiliumNode) -> u64 {
    node.metadata
        .resource_version
        .as_deref()
        .and_then(|version| version.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests;
