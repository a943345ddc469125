//! One pass over one node: allocate what it needs, advance excess release, publish — as a
//! plain async function over the shared cache, so it runs the same in the actor and in tests.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use crate::cilium_node::CiliumNode;
use crate::ec2::Ec2;
use crate::instances::{CacheAccess, SharedCache};
use crate::limits::{Limits, LimitsTable};
use crate::node_allocator::{AllocateError, NodeAllocator, PlanError, ReleaseMap};
use crate::node_store::{LiveNode, NodeStore, OperatorState, StoreError, compose};

use super::queue::{Pass, PassOutcome};

/// Instance-type limits shared by every pass: described once per type on first use (one
/// DescribeInstanceTypes however many nodes of the type start at once), overrides first.
#[derive(Debug, Default)]
pub struct LimitsCache {
    table: RwLock<LimitsTable>,
    describing: tokio::sync::Mutex<()>,
}

/// The limits cache, shared.
pub type SharedLimits = Arc<LimitsCache>;

impl LimitsCache {
    /// A cache starting from `table` (e.g. overrides).
    pub fn new(table: LimitsTable) -> Self {
        Self {
            table: RwLock::new(table),
            describing: tokio::sync::Mutex::new(()),
        }
    }

    /// The limits of `instance_type`, if known.
    pub fn get(&self, instance_type: &str) -> Option<Limits> {
        self.table
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(instance_type)
            .cloned()
    }

    /// The limits of `instance_type`, describing the type if it is not known yet (one
    /// describe at a time; whoever waited finds the answer of the one before).
    pub async fn get_or_describe(&self, ec2: &Ec2, instance_type: &str) -> Option<Limits> {
        if let Some(known) = self.get(instance_type) {
            return Some(known);
        }
        let _describing = self.describing.lock().await;
        if let Some(known) = self.get(instance_type) {
            return Some(known);
        }
        match LimitsTable::describe(ec2, &[instance_type.to_owned()]).await {
            Ok(described) => {
                let mut table = self.table.write().unwrap_or_else(PoisonError::into_inner);
                table.merge(described);
                table.get(instance_type).cloned()
            }
            Err(err) => {
                tracing::warn!(%err, instance_type, "describing the instance type failed");
                None
            }
        }
    }
}

/// Excess release settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseConfig {
    /// `--aws-release-excess-ips`.
    pub enabled: bool,
    /// `--excess-ip-release-delay`.
    pub delay: Duration,
}

impl Default for ReleaseConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            delay: Duration::from_secs(180),
        }
    }
}

/// What every pass uses.
#[derive(Debug, Clone)]
pub struct PassDeps<S> {
    /// EC2.
    pub ec2: Ec2,
    /// The describe cache.
    pub cache: SharedCache,
    /// Instance-type limits.
    pub limits: SharedLimits,
    /// Where the node objects live.
    pub store: S,
    /// Excess release.
    pub release: ReleaseConfig,
}

/// What a pass did.
#[derive(Debug)]
pub struct PassResult {
    /// The node.
    pub name: String,
    /// Its allocator, to give back to the queue.
    pub allocator: NodeAllocator,
    /// The object as stored, if the pass published.
    pub published: Option<CiliumNode>,
    /// Whether to pass again.
    pub outcome: PassOutcome,
    /// Whether EC2 state changed (the cache should be refreshed).
    pub mutated: bool,
    /// The describe cache knows no ENI of the node's instance: it is gone, or newer than
    /// the last describe (a node that registers itself usually is).
    pub instance_unknown: bool,
}

/// `status.ipam.used` as addresses.
pub fn used_addresses(node: &CiliumNode) -> BTreeSet<Ipv4Addr> {
    node.status
        .as_ref()
        .map(|status| {
            status
                .ipam
                .used
                .keys()
                .filter_map(|ip| ip.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn release_answers(node: &CiliumNode) -> ReleaseMap {
    node.status
        .as_ref()
        .map(|status| status.ipam.release_ips.clone())
        .unwrap_or_default()
}

/// Whether an error may go away by retrying soon (EC2 hiccups), as opposed to one that
/// needs a change first (no subnet, exhausted subnet, instance gone, unknown limits).
fn is_transient(err: &AllocateError) -> bool {
    matches!(
        err,
        AllocateError::Ec2 { .. } | AllocateError::Release { .. }
    )
}

/// Runs one pass.
pub async fn run<S: NodeStore>(deps: &PassDeps<S>, pass: Pass) -> PassResult {
    let Pass {
        name,
        mut allocator,
        latest,
    } = pass;
    let spec = allocator.spec().clone();
    let limits = deps
        .limits
        .get_or_describe(&deps.ec2, &spec.eni.instance_type)
        .await;
    let used = used_addresses(&latest);
    let mut cache = deps.cache.clone();
    let generation = cache.with(|c| c.generation());
    let mut outcome = PassOutcome::Settled;
    let mut failure = None;
    // A failed EC2 step may still have changed EC2 (an ENI created, then deleted again).
    let mut ec2_failed = false;
    if let Err(err) = allocator
        .maintain(&deps.ec2, &mut cache, limits.as_ref(), used.len())
        .await
    {
        ec2_failed = !matches!(err, AllocateError::Plan { .. });
        failure = Some(err);
    }
    if failure.is_none() && deps.release.enabled {
        match allocator
            .release_excess(
                &deps.ec2,
                &mut cache,
                limits.as_ref(),
                &used,
                &release_answers(&latest),
                Instant::now(),
                deps.release.delay,
            )
            .await
        {
            Ok(_) => {}
            Err(err) => {
                ec2_failed = true;
                failure = Some(err);
            }
        }
        if !allocator.release_state().is_idle() {
            // Waiting for the delay or the agent; the agent's answers also wake the node.
            outcome = PassOutcome::Again;
        }
    }
    let mutated = ec2_failed || cache.with(|c| c.generation()) != generation;
    let instance_unknown = matches!(
        failure,
        Some(AllocateError::Plan {
            error: PlanError::InstanceNotFound { .. },
            ..
        })
    );
    let error = failure
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default();
    allocator.set_last_error((!error.is_empty()).then(|| error.clone()));
    if failure.as_ref().is_some_and(is_transient) {
        outcome = PassOutcome::Retry;
    }

    // Never publish a node the cache knows no ENI of (not described yet, or the instance is
    // gone): that would publish an empty pool and status over the last good ones.
    let instance = spec.eni.instance_id.clone();
    let known = cache.with(|c| c.enis(&instance).next().is_some());
    let mut published = None;
    if known {
        let live = LiveNode::new(deps.cache.clone(), spec).with_operator_state(OperatorState {
            release: deps
                .release
                .enabled
                .then(|| allocator.release_state().clone()),
            error,
        });
        let desired = compose(&latest, &live);
        if desired.spec != latest.spec || desired.status != latest.status {
            match deps.store.publish(latest, &live).await {
                Ok(stored) => published = Some(stored),
                Err(StoreError::NotFound(_)) => {
                    tracing::debug!(node = %name, "node deleted meanwhile; not recreated");
                }
                Err(err) => {
                    tracing::warn!(node = %name, %err, "publishing failed; retrying");
                    outcome = PassOutcome::Retry;
                }
            }
        }
    }
    PassResult {
        name,
        allocator,
        published,
        outcome,
        mutated,
        instance_unknown,
    }
}
