//! Refreshing the describe cache: when (every [`RESYNC_INTERVAL`], and after mutations at
//! most once per [`MIN_RESYNC_INTERVAL`]), how (describe without holding the cache, apply
//! under it), and the garbage collection of leaked ENIs that follows — as plain state and
//! functions the instances actor drives.

use std::collections::BTreeSet;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use crate::ec2::{Ec2, SubnetFilter};
use crate::instances::{ResyncError, SharedCache, fetch_filtered};
use crate::model::{Eni, Tags, tags_match};

/// The periodic refresh.
pub const RESYNC_INTERVAL: Duration = Duration::from_secs(60);
/// The shortest time between the starts of two resyncs.
pub const MIN_RESYNC_INTERVAL: Duration = Duration::from_secs(1);

/// What to describe.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResyncFilter {
    /// `--subnet-ids-filter`, `--subnet-tags-filter`.
    pub subnets: SubnetFilter,
    /// `--instance-tags-filter`.
    pub instance_tags: Tags,
}

/// Describes everything and applies it to the shared cache. The cache is locked only to
/// take the ticket and to apply; a failure keeps the previous cache.
pub async fn resync(
    ec2: &Ec2,
    cache: &SharedCache,
    filter: &ResyncFilter,
) -> Result<(), ResyncError> {
    let ticket = cache
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .begin_resync();
    let snapshot = fetch_filtered(ec2, &filter.subnets, &filter.instance_tags).await?;
    cache
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .apply_resync(ticket, snapshot)
}

/// What to do about a resync request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResyncDecision {
    /// Start one now.
    Start,
    /// Ask again at this time (arm a timer).
    At(Instant),
    /// Nothing: one is running or a timer is armed; the request is remembered.
    Wait,
}

/// Coalesces resync requests: one at a time, at most one start per
/// [`MIN_RESYNC_INTERVAL`], and a request made during a resync causes exactly one more.
#[derive(Debug, Default)]
pub struct ResyncScheduler {
    running: bool,
    pending: bool,
    timer_armed: bool,
    last_start: Option<Instant>,
}

impl ResyncScheduler {
    /// A resync is wanted at `now`.
    pub fn request(&mut self, now: Instant) -> ResyncDecision {
        if self.running || self.timer_armed {
            self.pending = true;
            return ResyncDecision::Wait;
        }
        if let Some(last) = self.last_start
            && now < last + MIN_RESYNC_INTERVAL
        {
            self.pending = true;
            self.timer_armed = true;
            return ResyncDecision::At(last + MIN_RESYNC_INTERVAL);
        }
        self.pending = false;
        self.running = true;
        self.last_start = Some(now);
        ResyncDecision::Start
    }

    /// The timer armed by [`ResyncDecision::At`] fired.
    pub fn timer_fired(&mut self, now: Instant) -> ResyncDecision {
        self.timer_armed = false;
        self.request(now)
    }

    /// The running resync ended; a request made meanwhile is served.
    pub fn finished(&mut self, now: Instant) -> ResyncDecision {
        self.running = false;
        if self.pending {
            self.request(now)
        } else {
            ResyncDecision::Wait
        }
    }
}

/// Garbage collection of leaked ENIs: unattached ENIs carrying all of `--eni-tags` (so only
/// ones this operator created) are deleted once seen unattached by two collections in a row,
/// so an ENI between its creation and its attachment is never taken for a leak.
#[derive(Debug, Default)]
pub struct EniGc {
    suspects: BTreeSet<String>,
    last_run: Option<Instant>,
}

impl EniGc {
    /// If a collection is due at `now` (every `interval`), the ENIs to delete now.
    /// Never collects without tags: every unattached ENI would match.
    pub fn collect(
        &mut self,
        now: Instant,
        interval: Duration,
        unattached: &[Eni],
        tags: &Tags,
    ) -> Vec<String> {
        if tags.is_empty()
            || self
                .last_run
                .is_some_and(|last| now.saturating_duration_since(last) < interval)
        {
            return Vec::new();
        }
        self.last_run = Some(now);
        let tagged: BTreeSet<String> = unattached
            .iter()
            .filter(|eni| tags_match(&eni.tags, tags))
            .map(|eni| eni.id.clone())
            .collect();
        let leaked = tagged.intersection(&self.suspects).cloned().collect();
        self.suspects = tagged;
        leaked
    }
}

#[cfg(test)]
mod tests;
