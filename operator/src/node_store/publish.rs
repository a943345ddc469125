//! The publishing rule: snapshot the pool FIRST, then build `status.eni` from the live
//! describe cache, then put the snapshot into `spec.ipam.pool`; and write status before
//! spec (or both at once).
//!
//! Why: an agent allocating an IP from `spec.ipam.pool` looks up the IP's ENI (its
//! `resource`) in `status.eni.enis`, and Cilium's agent dies with "unable to find ENI" when
//! it is missing. Cilium's operator built spec and status from the allocator's state at
//! different moments and wrote spec first, so a pool IP on a just-attached ENI could reach
//! agents before the ENI did (cilium/cilium PR #19923 made it write status first). Here:
//! - the cache only gains ENIs while a node is being published (ENIs leave only through the
//!   release handshake, after their IPs left the pool), so status built from the cache after
//!   the snapshot lists every ENI the snapshot names;
//! - status is stored before (Kubernetes) or together with (etcd) the spec holding the
//!   snapshot, so no stored version pairs a pool with an older status.

use std::sync::{Arc, PoisonError, RwLock};

use crate::cilium_node::CiliumNode;
use crate::cilium_node::convert::{eni_status, pool};
use crate::cilium_node::{AllocationMap, EniStatus};
use crate::instances::InstanceCache;
use crate::node_allocator::{NodeSpec, ReleaseState};

/// One node as the operator holds it: the describe cache it shares with the allocator (which
/// keeps changing it) and the node's spec.
#[derive(Debug, Clone)]
pub struct LiveNode {
    cache: Arc<RwLock<InstanceCache>>,
    spec: NodeSpec,
    operator: Option<OperatorState>,
}

/// What the operator itself says about a node in `status.ipam`.
#[derive(Debug, Clone, Default)]
pub struct OperatorState {
    /// The operator's side of the release handshake (`None`: excess release is off, the
    /// stored `release-ips` are kept as they are).
    pub release: Option<ReleaseState>,
    /// `operator-status.error`; empty when allocation is healthy.
    pub error: String,
}

impl LiveNode {
    /// The node `spec` over the shared `cache`.
    pub fn new(cache: Arc<RwLock<InstanceCache>>, spec: NodeSpec) -> Self {
        Self {
            cache,
            spec,
            operator: None,
        }
    }

    /// The same node, also publishing the operator's `status.ipam` fields.
    pub fn with_operator_state(mut self, operator: OperatorState) -> Self {
        self.operator = Some(operator);
        self
    }

    /// The node's spec.
    pub fn spec(&self) -> &NodeSpec {
        &self.spec
    }

    /// The pool as of now.
    pub fn pool_snapshot(&self) -> AllocationMap {
        pool(&self.read(), &self.spec)
    }

    /// The node's ENIs as of now.
    pub fn eni_status(&self) -> EniStatus {
        eni_status(&self.read(), &self.spec.eni.instance_id)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, InstanceCache> {
        // A writer that panicked left a cache that is still consistent per ENI (every
        // change is one insert), so a poisoned lock is read as is.
        self.cache.read().unwrap_or_else(PoisonError::into_inner)
    }
}

/// In which order [`compose`] reads the cache and the stores write; only tests reverse it,
/// to prove the invariant checks can fail.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Order {
    /// The rule: pool snapshot, then status, then spec.
    #[default]
    StatusFirst,
    /// Cilium's old bug: status read before the pool snapshot, spec written first.
    #[cfg(test)]
    SpecFirst,
}

/// The object to publish: `latest` with `status.eni` rebuilt from the live cache and
/// `spec.ipam.pool` replaced by a pool snapshot taken BEFORE the cache was read for status.
/// With an [`OperatorState`], `operator-status` and the operator's side of the release
/// handshake are set too (the agent's answers kept). Everything else (the agent's
/// `spec.eni`, watermarks, `status.ipam.used`) is kept as `latest` has it.
pub fn compose(latest: &CiliumNode, live: &LiveNode) -> CiliumNode {
    compose_in(latest, live, Order::StatusFirst)
}

pub(crate) fn compose_in(latest: &CiliumNode, live: &LiveNode, order: Order) -> CiliumNode {
    let (pool, enis) = match order {
        Order::StatusFirst => {
            // Order matters: the snapshot first, so the ENIs read next are at least as new.
            let pool = live.pool_snapshot();
            let enis = live.eni_status();
            (pool, enis)
        }
        #[cfg(test)]
        Order::SpecFirst => {
            let enis = live.eni_status();
            let pool = live.pool_snapshot();
            (pool, enis)
        }
    };
    let mut node = latest.clone();
    let mut status = node.status.take().unwrap_or_default();
    status.eni = enis;
    if let Some(operator) = &live.operator {
        status
            .ipam
            .operator_status
            .error
            .clone_from(&operator.error);
        if let Some(release) = &operator.release {
            status.ipam.release_ips = release.publish(&status.ipam.release_ips);
        }
    }
    node.status = Some(status);
    node.spec.ipam.pool = pool;
    node
}
