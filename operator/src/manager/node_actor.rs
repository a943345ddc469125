//! The `NodeManager` actor: a thin shell over [`NodeQueue`] that learns nodes from the store
//! watch, runs passes ([`pass::run`]) with bounded parallelism, wakes itself when a
//! rate-limited node may pass again, and asks for a resync after mutations; and over
//! [`Snapshots`], which every object it comes to know goes through to the node's `NodeIpam`
//! watchers.

use std::collections::BTreeSet;
use std::sync::{Arc, PoisonError};
use std::time::Instant;

use actix::prelude::*;

use crate::cilium_node::CiliumNode;
use crate::node_allocator::plan::plan;
use crate::node_store::NodeStore;

use super::instances_actor::{CacheSynced, Resync};
use super::pass::{self, PassDeps, PassResult, used_addresses};
use super::queue::NodeQueue;
use super::snapshots::{GenerationCheck, Published, Snapshots};

/// Passes running at once by default (Cilium's `--parallel-alloc-workers`).
pub const DEFAULT_PARALLEL_WORKERS: usize = 50;

/// What the store watch saw.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub enum NodeEvent {
    /// A node was created or changed.
    Upsert(Box<CiliumNode>),
    /// The operator wrote an agent's report onto a node: taken like [`Self::Upsert`], but
    /// only for a node still driven (the store watch may have delivered its deletion
    /// meanwhile, and a report must not bring it back).
    Reported(Box<CiliumNode>),
    /// A node was deleted.
    Delete(String),
    /// A full listing ended; nodes not in it are gone.
    Listed(BTreeSet<String>),
}

/// Where to ask for resyncs (the instances manager, started after this actor).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct ConnectInstances(pub Recipient<Resync>);

/// The names of the nodes the manager drives.
#[derive(Debug, Message)]
#[rtype(result = "Vec<String>")]
pub struct GetNodes;

/// A receiver of a node's published snapshots (for `NodeIpam/WatchNode`); `None` when the
/// manager drives no node of that name.
#[derive(Debug, Message)]
#[rtype(result = "Option<tokio::sync::watch::Receiver<Published>>")]
pub struct SubscribeSnapshots(pub String);

/// Whether a generation is one of a node's recent snapshots (for `NodeIpam/ReportUsage`).
#[derive(Debug, Message)]
#[rtype(result = "GenerationCheck")]
pub struct CheckGeneration {
    /// The node.
    pub node: String,
    /// The generation the report answers.
    pub generation: String,
}

/// The actor.
pub struct NodeManager<S: NodeStore + Clone + Unpin + 'static> {
    queue: NodeQueue,
    /// Each driven node's published snapshots, kept beside the queue's nodes.
    snapshots: Snapshots,
    deps: Arc<PassDeps<S>>,
    workers: usize,
    running: usize,
    /// Passes wait for the first successful describe.
    cache_ready: bool,
    /// The store's first full listing arrived.
    listed: bool,
    /// Both of the above: the operator can answer for every node (its gRPC health).
    ready: tokio::sync::watch::Sender<bool>,
    wake: Option<(Instant, SpawnHandle)>,
    instances: Option<Recipient<Resync>>,
}

impl<S: NodeStore + Clone + Unpin + 'static> NodeManager<S> {
    /// Drives the nodes of `queue` with `deps`, at most `workers` passes at once.
    pub fn new(queue: NodeQueue, deps: PassDeps<S>, workers: usize) -> Self {
        Self {
            queue,
            snapshots: Snapshots::new(),
            deps: Arc::new(deps),
            workers: workers.max(1),
            running: 0,
            cache_ready: false,
            listed: false,
            ready: tokio::sync::watch::Sender::new(false),
            wake: None,
            instances: None,
        }
    }

    /// Turns true once the EC2 cache and the node store have each been read in full.
    pub fn readiness(&self) -> tokio::sync::watch::Receiver<bool> {
        self.ready.subscribe()
    }

    fn upsert(&mut self, node: CiliumNode) {
        let name = node.metadata.name.clone();
        self.queue.upsert(node);
        if let Some(name) = name {
            self.sync_snapshots(&name);
        }
    }

    /// Brings the node's snapshots in line with the queue's newest object of it.
    fn sync_snapshots(&mut self, name: &str) {
        match self.queue.latest(name) {
            Some(node) => {
                self.snapshots.observe(node);
            }
            None => self.snapshots.remove(name),
        }
    }

    fn update_readiness(&self) {
        let ready = self.cache_ready && self.listed;
        self.ready
            .send_if_modified(|was| std::mem::replace(was, ready) != ready);
    }

    /// Starts every pass that may start, and arms a timer for the next one that must wait.
    fn drive(&mut self, ctx: &mut Context<Self>) {
        if !self.cache_ready {
            return;
        }
        let now = Instant::now();
        while self.running < self.workers {
            let deps = Arc::clone(&self.deps);
            let Some(next) = self.queue.next(now, |allocator, node| {
                let limits = deps.limits.get(&allocator.spec().eni.instance_type);
                let cache = deps.cache.read().unwrap_or_else(PoisonError::into_inner);
                let used = used_addresses(node).len();
                plan(allocator.spec(), used, limits.as_ref(), &cache)
                    .map_or(0, |plan| plan.stats.needed)
            }) else {
                break;
            };
            self.running += 1;
            let work = async move { pass::run(&deps, next).await };
            ctx.spawn(work.into_actor(self).map(|result: PassResult, act, ctx| {
                act.running -= 1;
                // A new instance is described at once, not at the next periodic resync.
                let unknown = act
                    .queue
                    .instance_unknown(&result.name, result.instance_unknown);
                if (result.mutated || unknown)
                    && let Some(instances) = &act.instances
                {
                    instances.do_send(Resync);
                }
                act.queue.finish(
                    Instant::now(),
                    &result.name,
                    result.allocator,
                    result.published,
                    result.outcome,
                );
                act.sync_snapshots(&result.name);
                act.drive(ctx);
            }));
        }
        self.arm_wake(ctx);
    }

    fn arm_wake(&mut self, ctx: &mut Context<Self>) {
        let Some(at) = self.queue.next_wake() else {
            return;
        };
        if let Some((armed, handle)) = self.wake {
            if armed <= at {
                return;
            }
            ctx.cancel_future(handle);
        }
        let delay = at.saturating_duration_since(Instant::now());
        let handle = ctx.run_later(delay, |act, ctx| {
            act.wake = None;
            act.drive(ctx);
        });
        self.wake = Some((at, handle));
    }
}

impl<S: NodeStore + Clone + Unpin + 'static> Actor for NodeManager<S> {
    type Context = Context<Self>;
}

impl<S: NodeStore + Clone + Unpin + 'static> Handler<NodeEvent> for NodeManager<S> {
    type Result = ();

    fn handle(&mut self, event: NodeEvent, ctx: &mut Context<Self>) {
        match event {
            NodeEvent::Upsert(node) => self.upsert(*node),
            NodeEvent::Reported(node) => {
                if node
                    .metadata
                    .name
                    .as_deref()
                    .is_some_and(|name| self.queue.contains(name))
                {
                    self.upsert(*node);
                }
            }
            NodeEvent::Delete(name) => {
                if self.queue.remove(&name) {
                    tracing::info!(node = %name, "CiliumNode deleted; allocator stopped");
                }
                self.snapshots.remove(&name);
            }
            NodeEvent::Listed(names) => {
                self.queue.retain(&names);
                let queue = &self.queue;
                self.snapshots.retain(|name| queue.contains(name));
                self.listed = true;
                self.update_readiness();
            }
        }
        self.drive(ctx);
    }
}

impl<S: NodeStore + Clone + Unpin + 'static> Handler<CacheSynced> for NodeManager<S> {
    type Result = ();

    fn handle(&mut self, synced: CacheSynced, ctx: &mut Context<Self>) {
        if synced.ok {
            self.cache_ready = true;
            self.queue.mark_all();
            self.update_readiness();
        }
        self.drive(ctx);
    }
}

impl<S: NodeStore + Clone + Unpin + 'static> Handler<ConnectInstances> for NodeManager<S> {
    type Result = ();

    fn handle(&mut self, connect: ConnectInstances, _: &mut Context<Self>) {
        self.instances = Some(connect.0);
    }
}

impl<S: NodeStore + Clone + Unpin + 'static> Handler<GetNodes> for NodeManager<S> {
    type Result = Vec<String>;

    fn handle(&mut self, _: GetNodes, _: &mut Context<Self>) -> Vec<String> {
        self.queue.names()
    }
}

impl<S: NodeStore + Clone + Unpin + 'static> Handler<SubscribeSnapshots> for NodeManager<S> {
    type Result = Option<tokio::sync::watch::Receiver<Published>>;

    fn handle(&mut self, query: SubscribeSnapshots, _: &mut Context<Self>) -> Self::Result {
        self.snapshots.subscribe(&query.0)
    }
}

impl<S: NodeStore + Clone + Unpin + 'static> Handler<CheckGeneration> for NodeManager<S> {
    type Result = MessageResult<CheckGeneration>;

    fn handle(&mut self, query: CheckGeneration, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.snapshots.check(&query.node, &query.generation))
    }
}
