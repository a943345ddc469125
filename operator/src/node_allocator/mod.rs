//! One node's allocator: a state machine that, from the node's spec and usage and the
//! describe cache, plans the next EC2 mutation ([`plan::plan`], pure) and carries it out
//! ([`execute`]), until the node's deficit is met or something blocks it.
//!
//! Each mutation's result goes into the cache directly (Cilium's `UpdateENI`), so working
//! through a deficit needs no describe between steps: a fresh node that needs a new ENI
//! costs exactly create-with-addresses, attach, modify.

pub mod execute;
pub mod plan;
pub mod release;
pub mod spec;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use crate::ec2::{Ec2, Ec2Error};
use crate::instances::{CacheAccess, InstanceCache};
use crate::limits::Limits;
use crate::model::Tags;

pub use execute::{ExecuteError, MAX_ATTACH_TRIES, Outcome};
pub use plan::{Action, CreateEni, NodeStats, Plan, PlanError, is_excluded};
pub use release::{ReleaseMap, ReleaseState};
pub use spec::{DEFAULT_PRE_ALLOCATE, EniSpec, IpamSpec, NodeSpec};

/// Why a maintenance pass stopped short of meeting the node's need.
#[derive(Debug, thiserror::Error)]
pub enum AllocateError {
    /// Nothing can be planned (see [`PlanError`]).
    #[error("node {node}: {error}")]
    Plan {
        /// The node.
        node: String,
        /// Why.
        error: PlanError,
    },
    /// EC2 refused for lack of free addresses in the subnet; our free count was stale.
    #[error("node {node}: subnet {subnet_id} is exhausted: {error}")]
    SubnetExhausted {
        /// The node.
        node: String,
        /// The subnet.
        subnet_id: String,
        /// EC2's refusal.
        error: ExecuteError,
    },
    /// The instance is not running any more (terminated before its node object went).
    #[error("node {node}: instance is not running: {error}")]
    InstanceNotRunning {
        /// The node.
        node: String,
        /// EC2's refusal.
        error: ExecuteError,
    },
    /// Another EC2 failure.
    #[error("node {node}: {error}")]
    Ec2 {
        /// The node.
        node: String,
        /// What failed.
        error: ExecuteError,
    },
    /// Unassigning released addresses failed; they stay marked and are retried next pass.
    #[error("node {node}: releasing {count} addresses from {eni_id}: {error}")]
    Release {
        /// The node.
        node: String,
        /// The ENI.
        eni_id: String,
        /// How many addresses.
        count: usize,
        /// EC2's error.
        error: Ec2Error,
    },
    /// Mutations went through but the need was still not met after the pass limit (or one
    /// added nothing): stop rather than loop.
    #[error("node {node}: still {needed} addresses short after {steps} mutations")]
    NoProgress {
        /// The node.
        node: String,
        /// The unmet need.
        needed: usize,
        /// Mutations made.
        steps: usize,
    },
}

/// What one maintenance pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Figures after the pass.
    pub stats: NodeStats,
    /// EC2 mutations that succeeded (assignments and ENI set-ups).
    pub steps: usize,
    /// ENIs created.
    pub created_enis: usize,
    /// Addresses added to the pool.
    pub added: usize,
}

/// One node's allocation state.
#[derive(Debug, Clone)]
pub struct NodeAllocator {
    spec: NodeSpec,
    stats: NodeStats,
    last_error: Option<String>,
    eni_tags: Tags,
    release: ReleaseState,
}

impl NodeAllocator {
    /// An allocator for `spec`; `eni_tags` go on every ENI it creates (`--eni-tags`).
    pub fn new(spec: NodeSpec, eni_tags: Tags) -> Self {
        Self {
            spec,
            stats: NodeStats::default(),
            last_error: None,
            eni_tags,
            release: ReleaseState::default(),
        }
    }

    /// The node's spec.
    pub fn spec(&self) -> &NodeSpec {
        &self.spec
    }

    /// Replaces the spec (the node object changed).
    pub fn set_spec(&mut self, spec: NodeSpec) {
        self.spec = spec;
    }

    /// Figures of the last plan.
    pub fn stats(&self) -> NodeStats {
        self.stats
    }

    /// The last pass's error, for the node's `status.ipam.operator-status`.
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// Records the error of a pass made outside [`Self::maintain`] (e.g. excess release).
    pub fn set_last_error(&mut self, error: Option<String>) {
        self.last_error = error;
    }

    /// The operator's side of the release handshake.
    pub fn release_state(&self) -> &ReleaseState {
        &self.release
    }

    /// `status.ipam.release-ips` to publish, given the stored one (`agent`).
    pub fn release_status(&self, agent: &ReleaseMap) -> ReleaseMap {
        self.release.publish(agent)
    }

    /// One step of excess release through the handshake (see [`release`]): marks excess
    /// free addresses after `delay`, and unassigns those the agent agreed to release.
    /// Returns how many addresses were released.
    #[allow(clippy::too_many_arguments, reason = "one pass's inputs, all distinct")]
    pub async fn release_excess(
        &mut self,
        ec2: &Ec2,
        cache: &mut (impl CacheAccess + Send),
        limits: Option<&Limits>,
        used: &BTreeSet<Ipv4Addr>,
        answers: &ReleaseMap,
        now: Instant,
        delay: Duration,
    ) -> Result<usize, AllocateError> {
        let node = self.spec.name.clone();
        let (plan, candidates) = cache
            .with(|c| {
                let plan = self.plan(used.len(), limits, c)?;
                let candidates = if plan.stats.prefix_delegated {
                    None
                } else {
                    release::candidates(&self.spec, c, used, plan.stats.excess)
                };
                Ok((plan, candidates))
            })
            .map_err(|source| AllocateError::Plan {
                node: node.clone(),
                error: source,
            })?;
        tracing::debug!(node = %node, excess = plan.stats.excess, "excess release step");
        let ready = self.release.step(now, delay, candidates.as_ref(), answers);
        let mut released = 0;
        for (eni_id, addresses) in ready {
            execute::release(ec2, cache, &self.spec, &eni_id, &addresses)
                .await
                .map_err(|source| AllocateError::Release {
                    node: node.clone(),
                    eni_id: eni_id.clone(),
                    count: addresses.len(),
                    error: source,
                })?;
            self.release.released(&addresses);
            released += addresses.len();
        }
        Ok(released)
    }

    /// Plans without acting (and remembers the figures).
    pub fn plan(
        &mut self,
        used: usize,
        limits: Option<&Limits>,
        cache: &InstanceCache,
    ) -> Result<Plan, PlanError> {
        let plan = plan::plan(&self.spec, used, limits, cache)?;
        self.stats = plan.stats;
        Ok(plan)
    }

    /// Plans and mutates until the need is met or something blocks: one pass of pool
    /// maintenance. Bounded: at most two mutations per possible ENI, and a mutation that
    /// adds nothing ends the pass.
    pub async fn maintain(
        &mut self,
        ec2: &Ec2,
        cache: &mut (impl CacheAccess + Send),
        limits: Option<&Limits>,
        used: usize,
    ) -> Result<Report, AllocateError> {
        let result = self.maintain_inner(ec2, cache, limits, used).await;
        self.last_error = result.as_ref().err().map(ToString::to_string);
        if let Err(err) = &result {
            tracing::warn!(%err, "pool maintenance stopped");
        }
        result
    }

    async fn maintain_inner(
        &mut self,
        ec2: &Ec2,
        cache: &mut (impl CacheAccess + Send),
        limits: Option<&Limits>,
        used: usize,
    ) -> Result<Report, AllocateError> {
        let node = self.spec.name.clone();
        let max_steps = limits.map_or(0, |l| 2 * usize::try_from(l.adapters).unwrap_or(0) + 2);
        let mut report = Report::default();
        loop {
            let plan = cache
                .with(|c| self.plan(used, limits, c))
                .map_err(|source| AllocateError::Plan {
                    node: node.clone(),
                    error: source,
                })?;
            report.stats = plan.stats;
            let outcome = match &plan.action {
                Action::Nothing => return Ok(report),
                _ if report.steps >= max_steps => {
                    return Err(AllocateError::NoProgress {
                        node,
                        needed: plan.stats.needed,
                        steps: report.steps,
                    });
                }
                Action::Assign {
                    eni_id,
                    subnet_id,
                    count,
                    prefixes,
                } => execute::assign(ec2, cache, &self.spec, eni_id, *count, *prefixes)
                    .await
                    .map_err(|err| classify(&node, subnet_id, err))?,
                Action::Create(create) => {
                    execute::create(ec2, cache, &self.spec, create, &self.eni_tags)
                        .await
                        .map_err(|err| classify(&node, &create.subnet_id, err))?
                }
            };
            report.steps += 1;
            report.added += outcome.added();
            if matches!(outcome, Outcome::Created(_)) {
                report.created_enis += 1;
            }
            if outcome.added() == 0 {
                return Err(AllocateError::NoProgress {
                    node,
                    needed: plan.stats.needed,
                    steps: report.steps,
                });
            }
        }
    }
}

fn classify(node: &str, subnet_id: &str, err: ExecuteError) -> AllocateError {
    let node = node.to_owned();
    if err.ec2().is_subnet_exhausted() {
        AllocateError::SubnetExhausted {
            node,
            subnet_id: subnet_id.to_owned(),
            error: err,
        }
    } else if err.ec2().is_instance_not_running() {
        AllocateError::InstanceNotRunning { node, error: err }
    } else {
        AllocateError::Ec2 { node, error: err }
    }
}

#[cfg(test)]
mod tests;
