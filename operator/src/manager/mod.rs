//! The operator's actors and the plain state machines under them.
//!
//! - [`queue`]: which node passes next (worst deficit first, ≤ 1 pass/s per node).
//! - [`pass`]: one pass over one node — allocate, release excess, publish.
//! - [`resync`]: when and how the describe cache is refreshed; GC of leaked ENIs.
//! - [`node_actor`], [`instances_actor`]: the actix shells (`NodeManager`,
//!   `InstancesManager`) that drive those.
//! - [`snapshots`]: each node's published snapshots and their recent generations, for the
//!   `NodeIpam` gRPC service.
//! - [`watch`]: CiliumNode objects from the store, as events for the node manager.
//!
//! [`start`] wires them: the instances manager refreshes the shared cache and tells the node
//! manager, which runs passes and asks for a resync after mutations.

pub mod instances_actor;
pub mod node_actor;
pub mod pass;
pub mod queue;
pub mod resync;
pub mod snapshots;
pub mod watch;

use actix::{Actor, Addr};

use crate::model::Tags;
use crate::node_store::NodeStore;

pub use instances_actor::{CacheSynced, InstancesConfig, InstancesManager, Resync};
pub use node_actor::{
    CheckGeneration, ConnectInstances, GetNodes, NodeEvent, NodeManager, SubscribeSnapshots,
};
pub use pass::{LimitsCache, PassDeps, ReleaseConfig, SharedLimits};
pub use queue::NodeQueue;
pub use resync::ResyncFilter;
pub use snapshots::{Generation, GenerationCheck, Published, Snapshots};

/// Settings of the node manager.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// `--eni-tags`.
    pub eni_tags: Tags,
    /// `--aws-enable-prefix-delegation`.
    pub prefix_delegation: bool,
    /// Passes at once (`--parallel-alloc-workers`).
    pub workers: usize,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        Self {
            eni_tags: Tags::new(),
            prefix_delegation: false,
            workers: node_actor::DEFAULT_PARALLEL_WORKERS,
        }
    }
}

/// The running actors.
pub struct Operator<S: NodeStore + Clone + Unpin + 'static> {
    /// The node manager; feed it [`NodeEvent`]s (see [`watch`]).
    pub nodes: Addr<NodeManager<S>>,
    /// The instances manager.
    pub instances: Addr<InstancesManager>,
    /// True once the EC2 cache and the node store have each been read in full.
    pub ready: tokio::sync::watch::Receiver<bool>,
}

/// Starts both actors (inside an actix system).
pub fn start<S: NodeStore + Clone + Unpin + 'static>(
    deps: PassDeps<S>,
    config: &ManagerConfig,
    instances: InstancesConfig,
) -> Operator<S> {
    let ec2 = deps.ec2.clone();
    let cache = deps.cache.clone();
    let queue = NodeQueue::new(config.eni_tags.clone(), config.prefix_delegation);
    let manager = NodeManager::new(queue, deps, config.workers);
    let ready = manager.readiness();
    let nodes = manager.start();
    let instances = InstancesManager::new(
        ec2,
        cache,
        InstancesConfig {
            eni_tags: config.eni_tags.clone(),
            ..instances
        },
        Some(nodes.clone().recipient()),
    )
    .start();
    nodes.do_send(ConnectInstances(instances.clone().recipient()));
    Operator {
        nodes,
        instances,
        ready,
    }
}
