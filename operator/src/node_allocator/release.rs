//! Excess release through Cilium's handshake (`--aws-release-excess-ips`), as a state machine
//! over time and the agent's answers, without EC2.
//!
//! An address is released only when all of these held, in order:
//! 1. it was free (not in `status.ipam.used`) and in excess for `--excess-ip-release-delay`;
//! 2. the operator published it as `marked-for-release` in `status.ipam.release-ips`;
//! 3. the agent answered `ready-for-release` (it will not hand the address out any more).
//!
//! Then the operator unassigns it and publishes `released`; the agent removes the entry once
//! the address has left the pool. `do-not-release` (the agent handed it out meanwhile) and an
//! address no longer in excess end the handshake for that address.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use crate::instances::InstanceCache;

use super::plan::is_excluded;
use super::spec::NodeSpec;

/// Set by the operator: the address is about to be released.
pub const MARKED_FOR_RELEASE: &str = "marked-for-release";
/// Set by the agent: the address may be released.
pub const READY_FOR_RELEASE: &str = "ready-for-release";
/// Set by the agent: the address is in use, keep it.
pub const DO_NOT_RELEASE: &str = "do-not-release";
/// Set by the operator: the address is gone from its ENI.
pub const RELEASED: &str = "released";

/// `status.ipam.release-ips`: address → state.
pub type ReleaseMap = BTreeMap<String, String>;

/// The excess addresses to release: up to `excess` free addresses of the usable ENI with the
/// most free addresses (as Cilium picks them), with that ENI's ID.
pub fn candidates(
    spec: &NodeSpec,
    cache: &InstanceCache,
    used: &BTreeSet<Ipv4Addr>,
    excess: usize,
) -> Option<(String, Vec<Ipv4Addr>)> {
    if excess == 0 {
        return None;
    }
    let eni_spec = &spec.eni;
    cache
        .enis(&eni_spec.instance_id)
        .filter(|eni| {
            // Prefixes are released only as whole /28s; addresses of one are never single.
            eni.prefixes.is_empty()
                && !is_excluded(
                    eni,
                    eni_spec.first_interface_index,
                    &eni_spec.exclude_interface_tags,
                )
        })
        .map(|eni| {
            let mut free: Vec<Ipv4Addr> = eni
                .addresses
                .iter()
                .filter(|address| !used.contains(address))
                .copied()
                .collect();
            free.sort_unstable();
            (eni.id.clone(), free)
        })
        .filter(|(_, free)| !free.is_empty())
        // Most free first; on a tie the first by ID, so the choice is stable between passes.
        .fold(
            None,
            |best: Option<(String, Vec<Ipv4Addr>)>, (id, free)| match best {
                Some(b) if b.1.len() >= free.len() => Some(b),
                _ => Some((id, free)),
            },
        )
        .map(|(id, mut free)| {
            free.truncate(excess);
            (id, free)
        })
}

/// One node's side of the handshake.
#[derive(Debug, Clone, Default)]
pub struct ReleaseState {
    /// Address → (its ENI, when it was first seen in excess).
    excess_since: BTreeMap<Ipv4Addr, (String, Instant)>,
    /// Address → the operator's state: [`MARKED_FOR_RELEASE`] or [`RELEASED`].
    status: BTreeMap<Ipv4Addr, &'static str>,
}

impl ReleaseState {
    /// Advances the handshake at `now` with this pass's `candidates` (see [`candidates`])
    /// and the agent's `answers` (the stored `status.ipam.release-ips`). Returns the
    /// addresses to unassign now, by ENI; report success with [`Self::released`].
    pub fn step(
        &mut self,
        now: Instant,
        delay: Duration,
        candidates: Option<&(String, Vec<Ipv4Addr>)>,
        answers: &ReleaseMap,
    ) -> BTreeMap<String, Vec<Ipv4Addr>> {
        // The agent removes a `released` entry once the address left the pool: done.
        self.status
            .retain(|ip, state| *state != RELEASED || answers.contains_key(&ip.to_string()));
        let wanted: BTreeSet<Ipv4Addr> = candidates
            .map(|(_, ips)| ips.iter().copied().collect())
            .unwrap_or_default();
        if let Some((eni_id, ips)) = candidates {
            for ip in ips {
                self.excess_since
                    .entry(*ip)
                    .or_insert_with(|| (eni_id.clone(), now));
            }
        }
        let mut ready: BTreeMap<String, Vec<Ipv4Addr>> = BTreeMap::new();
        let mut forget = Vec::new();
        for (ip, (eni_id, since)) in &self.excess_since {
            if !wanted.contains(ip) {
                // No longer in excess (used, or another ENI was picked): stop the handshake.
                forget.push(*ip);
                continue;
            }
            if now.saturating_duration_since(*since) < delay {
                continue;
            }
            let answer = answers.get(&ip.to_string()).map(String::as_str);
            match (self.status.get(ip).copied(), answer) {
                (Some(MARKED_FOR_RELEASE), Some(READY_FOR_RELEASE)) => {
                    ready.entry(eni_id.clone()).or_default().push(*ip);
                }
                (_, Some(DO_NOT_RELEASE)) => forget.push(*ip),
                _ => {
                    self.status.insert(*ip, MARKED_FOR_RELEASE);
                }
            }
        }
        for ip in forget {
            self.excess_since.remove(&ip);
            if self.status.get(&ip) == Some(&MARKED_FOR_RELEASE) {
                self.status.remove(&ip);
            }
        }
        ready
    }

    /// Records addresses unassigned from their ENI.
    pub fn released(&mut self, ips: &[Ipv4Addr]) {
        for ip in ips {
            self.excess_since.remove(ip);
            self.status.insert(*ip, RELEASED);
        }
    }

    /// `status.ipam.release-ips` to publish: the operator's states, except that an agent's
    /// answer to a `marked-for-release` is kept as the agent wrote it, and a `released`
    /// entry the agent removed stays removed (it saw the address leave the pool: the
    /// handshake is over, and [`Self::step`] forgets it on the next pass).
    pub fn publish(&self, agent: &ReleaseMap) -> ReleaseMap {
        self.status
            .iter()
            .filter_map(|(ip, state)| {
                let key = ip.to_string();
                let value = match (agent.get(&key).map(String::as_str), *state) {
                    (Some(answer @ (READY_FOR_RELEASE | DO_NOT_RELEASE)), MARKED_FOR_RELEASE) => {
                        answer.to_owned()
                    }
                    (None, RELEASED) => return None,
                    _ => (*state).to_owned(),
                };
                Some((key, value))
            })
            .collect()
    }

    /// True if no address is in the handshake.
    pub fn is_idle(&self) -> bool {
        self.excess_since.is_empty() && self.status.is_empty()
    }
}

#[cfg(test)]
mod tests;
