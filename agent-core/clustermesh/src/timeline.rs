//! The restart timeline: when each step of the agent's current start happened — the start,
//! each remote connected, each cluster's first list of each resource applied, each sync
//! wait returned (and how), each endpoint regenerated, WireGuard's garbage collection and
//! the datapath's prune passes.
//!
//! [`Timeline`] is plain data (steps with their offset from the start, bounded in number);
//! [`TimelineRecorder`] is the cheap shared handle the actors and loops record through, as
//! the loops publish their status on a watch: recording takes a lock for one push and never
//! waits on an actor's mailbox. The API reads a snapshot ([`TimelineRecorder::snapshot`]).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use meshwork_types::{Resource, SyncKind};
use tokio::time::Instant;

use crate::barrier::{WaitError, WaitOutcome};

/// How many steps of each class (the remotes' own, the agent's) a timeline keeps: the first
/// ones of a start, which is what it is for (a remote that flaps for days must not grow the
/// agent without bound). 511 remotes' five steps each fit, so a big mesh's remotes never
/// push out the waits, regenerations and prunes.
pub const CAPACITY: usize = 4096;

/// Who waited on the barrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiter {
    /// The start-up wait behind the gRPC health turning `SERVING`.
    Readiness,
    /// Restored endpoints, before they regenerate.
    Regeneration,
    /// The datapath, before it prunes restored services, backends and tunnel entries.
    Prune,
    /// WireGuard, before it collects restored peers and allowed IPs.
    WireguardGc,
}

/// How a wait returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitEnd {
    /// Every cluster of its snapshot synced (or went away).
    Synced,
    /// The circuit breaker (`--clustermesh-sync-timeout`) fired with these clusters pending.
    Breaker {
        /// The clusters that had not synced.
        pending: Vec<String>,
    },
    /// The waiter's own deadline passed first (`--clustermesh-ip-identities-sync-timeout`
    /// for regeneration).
    Timeout,
    /// The wait failed otherwise.
    Failed(String),
}

impl WaitEnd {
    /// How `outcome` reads on the timeline.
    pub fn of(outcome: &Result<WaitOutcome, WaitError>) -> Self {
        match outcome {
            Ok(WaitOutcome::Synced) => Self::Synced,
            Ok(WaitOutcome::BreakerFired { pending }) => Self::Breaker {
                pending: pending.clone(),
            },
            Err(WaitError::CallerDeadline { .. }) => Self::Timeout,
            Err(err @ WaitError::Disconnected(_)) => Self::Failed(err.to_string()),
        }
    }
}

/// One step of a start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The agent started: offset 0.
    Started,
    /// A remote's etcd is connected and its cluster config read and validated.
    Connected {
        /// The remote cluster.
        cluster: Arc<str>,
    },
    /// A remote's first list of `resource` was delivered and applied by every consumer: the
    /// instant that cluster × resource synced.
    ListDone {
        /// The remote cluster.
        cluster: Arc<str>,
        /// Which store.
        resource: Resource,
    },
    /// A wait on the barrier returned.
    WaitReturned {
        /// Who waited.
        waiter: Waiter,
        /// What for.
        kind: SyncKind,
        /// How it ended.
        end: WaitEnd,
    },
    /// An endpoint's program was regenerated (or failed to be).
    EndpointRegenerated {
        /// The endpoint.
        endpoint: u64,
        /// Why it failed; `None` when it succeeded.
        error: Option<String>,
    },
    /// WireGuard's garbage collection ran after the `kind` wait.
    WireguardGc {
        /// `NodesSynced` (restored peers) or `IPIdentitiesSynced` (restored allowed IPs).
        kind: SyncKind,
        /// Restored peers removed.
        removed: u64,
    },
    /// The datapath pruned what the `kind` wait guards.
    Pruned {
        /// `ServicesSynced` (services, backends) or `NodesSynced` (tunnel entries).
        kind: SyncKind,
        /// Restored map entries deleted.
        removed: u64,
    },
}

/// A step and when it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Since the start.
    pub offset: Duration,
    /// What happened.
    pub step: Step,
}

/// The steps of one start, in the order they happened; see the module docs.
#[derive(Debug, Clone)]
pub struct Timeline {
    started: Instant,
    started_at: SystemTime,
    entries: Vec<Entry>,
    capacity: usize,
    /// Steps kept of each class: a remote's (connected, first lists), the agent's.
    kept: [usize; 2],
    /// The remotes whose first connection is recorded: a reconnect is not a step of the
    /// start.
    connected: HashSet<Arc<str>>,
    dropped: u64,
}

impl Timeline {
    /// A timeline of a start at `started` (wall clock `started_at`), holding at most
    /// `capacity` steps of each class, its first one [`Step::Started`].
    pub fn new(started: Instant, started_at: SystemTime, capacity: usize) -> Self {
        let mut timeline = Self {
            started,
            started_at,
            entries: Vec::new(),
            capacity,
            kept: [0; 2],
            connected: HashSet::new(),
            dropped: 0,
        };
        timeline.record(started, Step::Started);
        timeline
    }

    /// Records `step` at `at`, in time order (a step recorded late by its thread still
    /// lands where it happened); once its class is full, the step is counted and left out.
    /// A remote's reconnects are not recorded, only its first connection.
    pub fn record(&mut self, at: Instant, step: Step) {
        let class = match &step {
            Step::Connected { cluster } => {
                if !self.connected.insert(Arc::clone(cluster)) {
                    return;
                }
                0
            }
            Step::ListDone { .. } => 0,
            _ => 1,
        };
        if self.kept[class] >= self.capacity {
            self.dropped += 1;
            return;
        }
        self.kept[class] += 1;
        let offset = at.saturating_duration_since(self.started);
        let position = self.entries.partition_point(|e| e.offset <= offset);
        self.entries.insert(position, Entry { offset, step });
    }

    /// The steps, in time order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Steps left out because the timeline was full.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// When the start was, by the wall clock.
    pub fn started_at(&self) -> SystemTime {
        self.started_at
    }
}

/// The shared handle steps are recorded through; a disabled one (the default, for a mesh
/// nobody asks about, like kvstoremesh's) records nothing.
#[derive(Debug, Clone, Default)]
pub struct TimelineRecorder(Option<Arc<Mutex<Timeline>>>);

impl TimelineRecorder {
    /// A recorder of a start happening now.
    pub fn start() -> Self {
        let timeline = Timeline::new(Instant::now(), SystemTime::now(), CAPACITY);
        Self(Some(Arc::new(Mutex::new(timeline))))
    }

    /// Records `step` as happening now.
    pub fn record(&self, step: Step) {
        if let Some(timeline) = &self.0 {
            // A panic elsewhere while recording leaves the steps as they were: keep them.
            let mut timeline = timeline.lock().unwrap_or_else(PoisonError::into_inner);
            timeline.record(Instant::now(), step);
        }
    }

    /// Records that `waiter`'s wait for `kind` returned with `outcome`.
    pub fn wait_returned(
        &self,
        waiter: Waiter,
        kind: SyncKind,
        outcome: &Result<WaitOutcome, WaitError>,
    ) {
        self.record(Step::WaitReturned {
            waiter,
            kind,
            end: WaitEnd::of(outcome),
        });
    }

    /// The timeline as of now; `None` when disabled.
    pub fn snapshot(&self) -> Option<Timeline> {
        let timeline = self.0.as_ref()?;
        Some(
            timeline
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }
}

#[cfg(test)]
#[path = "timeline_tests.rs"]
mod tests;
