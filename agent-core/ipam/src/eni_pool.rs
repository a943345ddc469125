//! The ENI allocator (`--ipam eni`, §11): pod IPs from the newest consistent operator
//! snapshot.
//!
//! - A snapshot is held only when [`Snapshot::check`] passes. An inconsistent one is never
//!   used: the previous consistent snapshot stays, the bad generation is counted once, and
//!   the pool waits for the next generation ([`Offer::Inconsistent`]).
//! - [`EniPool::allocate`] picks the lowest pool IP that is neither handed out nor in a
//!   release handshake, looks up its ENI in the same snapshot, and records the allocation
//!   (checkpoint first) only after that lookup succeeded (Cilium PR #18352). An owner that
//!   holds an IP gets it back, from the checkpoint, even before the first snapshot.
//! - `ready` latches once the pool held [`required`](crate::Watermarks::required) IPs it may
//!   hand out (the pool minus the release handshake; handed-out IPs count, as in Cilium,
//!   which compares the pool's size: a restarted agent whose pool is full of its own pods
//!   is ready).
//! - [`EniPool::release_answers`] answers each `marked-for-release` IP: `do-not-release`
//!   when it is handed out (it was allocated before the mark reached the agent),
//!   `ready-for-release` otherwise; from the mark on it is never handed out.
//! - Restored allocations whose IP is not in the held snapshot's pool are orphans: kept
//!   (the pod may still use the address, and its owner's repeated request gets it back),
//!   listed in [`EniStatus::orphans`] and [`Offer::Accepted`] so the agent reports them,
//!   and left out of [`EniPool::used`] (the operator refuses a used IP outside the pool).
//!   Releasing the owner removes them; an orphan whose IP comes back into the pool is an
//!   ordinary allocation again.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use crate::allocation::{Allocated, Allocation, EniAttachment, Mode, ROUTER_OWNER};
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::error::{AllocateError, ReleaseError};
use crate::ledger::Ledger;
use crate::snapshot::{Inconsistent, Snapshot};

/// The ENI allocator; see the module docs.
#[derive(Debug)]
pub struct EniPool {
    ledger: Ledger,
    held: Option<Held>,
    ready: bool,
    inconsistent: u64,
    /// The generation last refused: offered again (a reconnect resends it), it is not
    /// counted again.
    refused: Option<String>,
    report_due: bool,
}

#[derive(Debug)]
struct Held {
    snapshot: Snapshot,
    /// When this generation first arrived.
    received: Instant,
}

/// What [`EniPool::offer`] did with a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Offer {
    /// The snapshot is held now.
    Accepted {
        /// Its generation.
        generation: String,
        /// It is the first one held.
        first: bool,
        /// The pool became ready with it.
        became_ready: bool,
        /// Allocations whose IP left the pool with it (on the first snapshot: every
        /// restored allocation outside its pool).
        orphaned: Vec<Allocation>,
    },
    /// The held generation again (a reconnect resends the latest): nothing changed.
    Unchanged,
    /// Refused: the held snapshot (if any) stays, and the pool waits for the next one.
    Inconsistent {
        /// Its generation.
        generation: String,
        /// What is wrong with it.
        why: Inconsistent,
        /// It was counted now (false when the same generation was refused before).
        counted: bool,
    },
}

/// The agent's answer to a `marked-for-release` IP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReleaseAnswer {
    /// The IP is free and will not be handed out: the operator may release it.
    ReadyForRelease,
    /// The IP is handed out: keep it.
    DoNotRelease,
}

impl ReleaseAnswer {
    /// Cilium's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReadyForRelease => "ready-for-release",
            Self::DoNotRelease => "do-not-release",
        }
    }
}

/// A handed-out IP as the operator's `status.ipam.used` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsedIp {
    /// The address.
    pub ip: Ipv4Addr,
    /// The pod when known, else the owner.
    pub owner: String,
    /// Its ENI.
    pub resource: String,
}

/// What to report to the operator (`ReportUsage`), for one held generation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The generation answered.
    pub generation: String,
    /// Every handed-out IP of the pool.
    pub used: Vec<UsedIp>,
    /// An answer per `marked-for-release` IP.
    pub answers: BTreeMap<Ipv4Addr, ReleaseAnswer>,
}

/// The pool as `Ipam.Status` and the metrics show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EniStatus {
    /// The held generation.
    pub generation: Option<String>,
    /// How long ago the held generation first arrived.
    pub age: Option<Duration>,
    /// Addresses in the held pool.
    pub pool: usize,
    /// Of them, not in a release handshake.
    pub available: usize,
    /// IPs handed out (orphans included).
    pub used: usize,
    /// Cilium's `required`; `None` before the first snapshot.
    pub required: Option<u32>,
    /// The ready latch.
    pub ready: bool,
    /// Inconsistent generations refused so far.
    pub inconsistent_snapshots: u64,
    /// The generation last refused, while no newer one was held since.
    pub awaiting_after: Option<String>,
    /// The operator's error in the held snapshot.
    pub operator_error: String,
    /// Every allocation, by IP.
    pub allocations: Vec<Allocation>,
    /// Allocated IPs outside the held pool.
    pub orphans: Vec<Ipv4Addr>,
    /// The router IP, once allocated.
    pub router_ip: Option<Ipv4Addr>,
}

impl EniPool {
    /// The pool with the allocations `checkpoint` holds; it holds no snapshot yet.
    pub fn restore(checkpoint: Checkpoint) -> Result<Self, CheckpointError> {
        Ok(Self {
            ledger: Ledger::restore(checkpoint, Mode::Eni)?,
            held: None,
            ready: false,
            inconsistent: 0,
            refused: None,
            report_due: false,
        })
    }

    /// The checkpoint.
    pub fn checkpoint(&self) -> &Checkpoint {
        self.ledger.checkpoint()
    }

    /// Takes `snapshot`, arrived at `now`, if it is consistent; see [`Offer`].
    pub fn offer(&mut self, snapshot: Snapshot, now: Instant) -> Offer {
        if self
            .held
            .as_ref()
            .is_some_and(|held| held.snapshot.generation == snapshot.generation)
        {
            return Offer::Unchanged;
        }
        if let Err(why) = snapshot.check() {
            let counted = self.refused.as_deref() != Some(snapshot.generation.as_str());
            if counted {
                self.inconsistent += 1;
                self.refused = Some(snapshot.generation.clone());
            }
            return Offer::Inconsistent {
                generation: snapshot.generation,
                why,
                counted,
            };
        }
        let before: Vec<Ipv4Addr> = self.orphans().collect();
        let first = self.held.is_none();
        let generation = snapshot.generation.clone();
        // Marked IPs want answers; a `released` IP gone from the pool wants the report that
        // ends its handshake (the operator drops the entry only on a report of such a
        // generation, and a quiet node sends none otherwise).
        if snapshot.marked_for_release().next().is_some()
            || snapshot.released_gone().next().is_some()
        {
            self.report_due = true;
        }
        self.held = Some(Held {
            snapshot,
            received: now,
        });
        self.refused = None;
        let orphaned = self
            .orphans()
            .filter(|ip| !before.contains(ip))
            .filter_map(|ip| self.ledger.holder(ip))
            .filter_map(|owner| self.ledger.get(owner))
            .cloned()
            .collect();
        let became_ready = !self.ready && self.enough();
        self.ready |= became_ready;
        Offer::Accepted {
            generation,
            first,
            became_ready,
            orphaned,
        }
    }

    fn enough(&self) -> bool {
        match (&self.held, self.required()) {
            (Some(held), Some(required)) => {
                held.snapshot.available() >= usize::try_from(required).unwrap_or(usize::MAX)
            }
            _ => false,
        }
    }

    /// Hands out an IP to `owner` (`pod` recorded beside it); an owner that holds one gets
    /// it back with `existing`. See the module docs.
    pub fn allocate(&mut self, owner: &str, pod: &str) -> Result<Allocated, AllocateError> {
        if owner.is_empty() {
            return Err(AllocateError::InvalidOwner);
        }
        if let Some(allocation) = self.ledger.get(owner) {
            return Ok(Allocated {
                allocation: allocation.clone(),
                existing: true,
            });
        }
        let held = self.held.as_ref().ok_or(AllocateError::NoSnapshot)?;
        let snapshot = &held.snapshot;
        let Some((ip, eni_id)) = snapshot
            .pool
            .iter()
            .find(|(ip, _)| !self.ledger.holds(**ip) && !snapshot.in_handshake(**ip))
        else {
            return Err(AllocateError::Exhausted {
                pool: snapshot.pool.len(),
                in_use: snapshot
                    .pool
                    .keys()
                    .filter(|ip| self.ledger.holds(**ip))
                    .count(),
                in_handshake: snapshot
                    .pool
                    .keys()
                    .filter(|ip| snapshot.in_handshake(**ip))
                    .count(),
            });
        };
        // The ENI from the same snapshot, before anything is recorded (#18352).
        let eni = snapshot
            .enis
            .get(eni_id)
            .ok_or_else(|| AllocateError::EniMissing {
                ip: *ip,
                eni: eni_id.clone(),
                generation: snapshot.generation.clone(),
            })?;
        let allocation = Allocation {
            owner: owner.to_owned(),
            pod: pod.to_owned(),
            ip: *ip,
            prefix_len: 32,
            gateway: eni.subnet.first_host(),
            eni: Some(EniAttachment {
                id: eni.id.clone(),
                mac: eni.mac.clone(),
                number: eni.number,
                vpc_cidrs: eni.vpc_cidrs.clone(),
            }),
            generation: snapshot.generation.clone(),
        };
        self.ledger.insert(allocation.clone())?;
        self.report_due = true;
        Ok(Allocated {
            allocation,
            existing: false,
        })
    }

    /// Gives `owner`'s IP back; `None` when it held none (nothing is written then).
    pub fn release(&mut self, owner: &str) -> Result<Option<Allocation>, ReleaseError> {
        if owner.is_empty() {
            return Err(ReleaseError::InvalidOwner);
        }
        let released = self.ledger.remove(owner)?;
        self.report_due |= released.is_some();
        Ok(released)
    }

    /// Cilium's `required` from the held snapshot's watermarks; `None` before the first.
    pub fn required(&self) -> Option<u32> {
        self.held
            .as_ref()
            .map(|held| held.snapshot.watermarks.required())
    }

    /// Whether the pool held `required` IPs at least once.
    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// The held snapshot.
    pub fn snapshot(&self) -> Option<&Snapshot> {
        self.held.as_ref().map(|held| &held.snapshot)
    }

    /// The router IP, once allocated.
    pub fn router_ip(&self) -> Option<Ipv4Addr> {
        self.ledger.get(ROUTER_OWNER).map(|a| a.ip)
    }

    /// `owner`'s allocation.
    pub fn allocation(&self, owner: &str) -> Option<&Allocation> {
        self.ledger.get(owner)
    }

    /// Allocated IPs outside the held pool (none before the first snapshot: unknown).
    pub fn orphans(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.ledger.by_ip().map(|a| a.ip).filter(|ip| {
            self.held
                .as_ref()
                .is_some_and(|held| !held.snapshot.pool.contains_key(ip))
        })
    }

    /// The answers to the held snapshot's `marked-for-release` IPs.
    pub fn release_answers(&self) -> BTreeMap<Ipv4Addr, ReleaseAnswer> {
        let Some(held) = &self.held else {
            return BTreeMap::new();
        };
        held.snapshot
            .marked_for_release()
            .map(|ip| {
                let answer = if self.ledger.holds(ip) {
                    ReleaseAnswer::DoNotRelease
                } else {
                    ReleaseAnswer::ReadyForRelease
                };
                (ip, answer)
            })
            .collect()
    }

    /// The handed-out IPs of the held pool, by IP, as `status.ipam.used` lists them
    /// (orphans are left out: the operator refuses a used IP outside the pool).
    pub fn used(&self) -> Vec<UsedIp> {
        let Some(held) = &self.held else {
            return Vec::new();
        };
        self.ledger
            .by_ip()
            .filter_map(|a| {
                let resource = held.snapshot.pool.get(&a.ip)?;
                let owner = if a.pod.is_empty() { &a.owner } else { &a.pod };
                Some(UsedIp {
                    ip: a.ip,
                    owner: owner.clone(),
                    resource: resource.clone(),
                })
            })
            .collect()
    }

    /// Asks for a report at the next [`Self::take_report`] (after a reconnect, or a report
    /// that failed).
    pub fn mark_report_due(&mut self) {
        self.report_due = true;
    }

    /// Whether a report is due (an allocation, a release, a snapshot with marked IPs, or
    /// [`Self::mark_report_due`] since the last [`Self::take_report`]).
    pub fn report_due(&self) -> bool {
        self.report_due
    }

    /// The report for the held generation when one is due, clearing the due flag (mark it
    /// again if sending fails); `None` when none is due or no snapshot is held.
    pub fn take_report(&mut self) -> Option<Report> {
        if !self.report_due {
            return None;
        }
        let generation = self.held.as_ref()?.snapshot.generation.clone();
        self.report_due = false;
        Some(Report {
            generation,
            used: self.used(),
            answers: self.release_answers(),
        })
    }

    /// The pool's state at `now`.
    pub fn status(&self, now: Instant) -> EniStatus {
        let snapshot = self.snapshot();
        EniStatus {
            generation: snapshot.map(|s| s.generation.clone()),
            age: self
                .held
                .as_ref()
                .map(|held| now.saturating_duration_since(held.received)),
            pool: snapshot.map_or(0, |s| s.pool.len()),
            available: snapshot.map_or(0, Snapshot::available),
            used: self.ledger.len(),
            required: self.required(),
            ready: self.ready,
            inconsistent_snapshots: self.inconsistent,
            awaiting_after: self.refused.clone(),
            operator_error: snapshot
                .map(|s| s.operator_error.clone())
                .unwrap_or_default(),
            allocations: self.ledger.by_ip().cloned().collect(),
            orphans: self.orphans().collect(),
            router_ip: self.router_ip(),
        }
    }
}

#[cfg(test)]
#[path = "eni_pool_tests.rs"]
mod tests;
