//! The elector: what to do with the Lease as it was just read, as a plain state machine.
//!
//! Time comes in as arguments: `now` (tokio's monotonic [`Instant`]) for every decision, and
//! `wall` only for the times written into the record (`acquireTime`, `renewTime`), which other
//! candidates never compare with their own clocks. As in client-go, a candidate tells that a
//! lease expired by its own clock: the holder's lease is valid until `leaseDurationSeconds`
//! after the moment this candidate last saw the record *change*.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use super::Timing;

/// The leader-election record a Lease's spec carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Who holds the lease; empty when nobody does (released).
    pub holder: String,
    /// How long the holder's lease lasts after it was last seen renewed, in seconds.
    pub lease_duration_seconds: i32,
    /// When the current holder acquired it (wall clock; informational).
    pub acquire_time: Option<Timestamp>,
    /// When the holder last renewed it (wall clock; informational).
    pub renew_time: Option<Timestamp>,
    /// How many times the lease changed hands.
    pub transitions: i32,
}

/// The Lease as read: its record and the resourceVersion a write must carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The record.
    pub record: Record,
    /// The object's resourceVersion.
    pub resource_version: String,
}

/// What the candidate does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// There is no Lease: create it naming this candidate.
    Create(Record),
    /// Write `record` over the Lease at `resource_version`: a renewal, or taking over a lease
    /// that expired or was released.
    Update {
        /// The record to write.
        record: Record,
        /// The resourceVersion read (a concurrent write makes the update fail with 409).
        resource_version: String,
    },
    /// Another candidate holds an unexpired lease: nothing to write; try again after the
    /// retry period.
    Wait {
        /// The holder.
        holder: String,
    },
}

/// One candidate's view of the election.
#[derive(Debug)]
pub struct Elector {
    identity: String,
    timing: Timing,
    /// The record last seen and when it was first seen with that content.
    observed: Option<(Record, Instant)>,
    /// When the last successful write of this candidate's own record was decided (the
    /// moment before its read, so never later than the write itself): `Some` while leading.
    renewed_at: Option<Instant>,
}

impl Elector {
    /// A candidate named `identity` (unique among candidates) with `timing`.
    pub fn new(identity: impl Into<String>, timing: Timing) -> Self {
        Self {
            identity: identity.into(),
            timing,
            observed: None,
            renewed_at: None,
        }
    }

    /// This candidate's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The timing.
    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// Decides what to do with `current` (the Lease just read at `now`; `None`: there is
    /// none). `wall` is written into the record as its renew (and, for a new holder, acquire)
    /// time.
    pub fn step(&mut self, current: Option<&Observed>, now: Instant, wall: Timestamp) -> Step {
        let Some(current) = current else {
            return Step::Create(self.own_record(None, wall));
        };
        let changed = self
            .observed
            .as_ref()
            .is_none_or(|(seen, _)| *seen != current.record);
        if changed {
            self.observed = Some((current.record.clone(), now));
        }
        let held_by_other =
            !current.record.holder.is_empty() && current.record.holder != self.identity;
        if held_by_other {
            // Someone else took it (or holds it): whatever this candidate believed, it is
            // not the leader any more.
            self.renewed_at = None;
            if !self.expired(now) {
                return Step::Wait {
                    holder: current.record.holder.clone(),
                };
            }
        }
        Step::Update {
            record: self.own_record(Some(&current.record), wall),
            resource_version: current.resource_version.clone(),
        }
    }

    /// The write of `record` (decided by [`step`](Self::step) at `now`) succeeded: this
    /// candidate holds the lease until `renew_deadline` after `now` unless it renews.
    pub fn written(&mut self, record: Record, now: Instant) {
        self.observed = Some((record, now));
        self.renewed_at = Some(now);
    }

    /// Whether this candidate leads at `now`: its last successful write is younger than the
    /// renew deadline.
    pub fn is_leader(&self, now: Instant) -> bool {
        self.leading_until(now).is_some()
    }

    /// While this candidate leads at `now`: the instant its leadership ends unless it renews.
    pub fn leading_until(&self, now: Instant) -> Option<Instant> {
        let until = self.renewed_at? + self.timing.renew_deadline;
        (now < until).then_some(until)
    }

    /// Whether this candidate led and has now gone a renew deadline without a successful
    /// renewal: it must stop acting as the leader at once (another may take over a lease
    /// duration after it last renewed, which is later).
    pub fn lost(&self, now: Instant) -> bool {
        self.renewed_at.is_some() && !self.is_leader(now)
    }

    /// The record that gives the lease up (an empty holder, a one-second duration, so the
    /// next candidate takes over at its next try), if this candidate leads at `now`.
    pub fn release(&self, now: Instant, wall: Timestamp) -> Option<Record> {
        if !self.is_leader(now) {
            return None;
        }
        let transitions = self
            .observed
            .as_ref()
            .map_or(0, |(seen, _)| seen.transitions);
        Some(Record {
            holder: String::new(),
            lease_duration_seconds: 1,
            acquire_time: Some(wall),
            renew_time: Some(wall),
            transitions,
        })
    }

    /// When the lease last seen (held by another) expires by this candidate's clock.
    fn expired(&self, now: Instant) -> bool {
        let Some((record, seen_at)) = &self.observed else {
            return true;
        };
        let duration =
            Duration::from_secs(u64::try_from(record.lease_duration_seconds).unwrap_or(0));
        now.saturating_duration_since(*seen_at) >= duration
    }

    /// This candidate's record over `previous`: a renewal keeps the acquire time and the
    /// transition count, a takeover counts one more transition.
    fn own_record(&self, previous: Option<&Record>, wall: Timestamp) -> Record {
        let lease_duration_seconds =
            i32::try_from(self.timing.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX);
        let (acquire_time, transitions) = match previous {
            None => (Some(wall), 0),
            Some(previous) if previous.holder == self.identity => {
                (previous.acquire_time.or(Some(wall)), previous.transitions)
            }
            Some(previous) => (Some(wall), previous.transitions.saturating_add(1)),
        };
        Record {
            holder: self.identity.clone(),
            lease_duration_seconds,
            acquire_time,
            renew_time: Some(wall),
            transitions,
        }
    }
}
