//! When kvstoremesh is ready (Cilium's rules): every remote known at start has written all
//! its canaries into the cache; a remote that did not connect within the per-cluster timeout
//! is not waited for; after the global timeout, ready regardless. Once ready, ready for good.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use meshwork_types::Resource;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::keys::KINDS;

/// What readiness hears about.
#[derive(Debug, Clone)]
pub enum ReadinessEvent {
    /// The remote connected and its cluster config is valid.
    Connected(Arc<str>),
    /// The remote's canary of `kind` is in the cache.
    Synced(Arc<str>, Resource),
    /// The remote was removed and drained.
    Removed(Arc<str>),
}

#[derive(Debug, Default, Clone)]
struct Remote {
    connected: bool,
    synced: Vec<Resource>,
}

impl Remote {
    fn is_synced(&self) -> bool {
        KINDS.iter().all(|kind| self.synced.contains(kind))
    }
}

/// The plain state: the remotes known at start, and how far each got.
#[derive(Debug)]
pub struct Readiness {
    start: Instant,
    per_cluster: Duration,
    global: Duration,
    remotes: BTreeMap<Arc<str>, Remote>,
    ready: bool,
}

impl Readiness {
    /// Readiness for `remotes` (the config directory at start), counted from `start`.
    pub fn new(
        remotes: impl IntoIterator<Item = Arc<str>>,
        start: Instant,
        per_cluster: Duration,
        global: Duration,
    ) -> Self {
        Self {
            start,
            per_cluster,
            global,
            remotes: remotes
                .into_iter()
                .map(|r| (r, Remote::default()))
                .collect(),
            ready: false,
        }
    }

    /// Applies `event` (remotes not known at start are not waited for).
    pub fn apply(&mut self, event: &ReadinessEvent) {
        match event {
            ReadinessEvent::Connected(name) => {
                if let Some(remote) = self.remotes.get_mut(name) {
                    remote.connected = true;
                }
            }
            ReadinessEvent::Synced(name, kind) => {
                if let Some(remote) = self.remotes.get_mut(name)
                    && !remote.synced.contains(kind)
                {
                    remote.synced.push(*kind);
                }
            }
            ReadinessEvent::Removed(name) => {
                self.remotes.remove(name);
            }
        }
    }

    /// Whether kvstoremesh is ready at `now` (latched).
    pub fn check(&mut self, now: Instant) -> bool {
        if !self.ready {
            let late = now >= self.start + self.per_cluster;
            let waited = |r: &Remote| r.is_synced() || (!r.connected && late);
            self.ready = now >= self.start + self.global || self.remotes.values().all(waited);
        }
        self.ready
    }

    /// The next instant [`Self::check`] may change its answer without an event.
    pub fn next_deadline(&self, now: Instant) -> Option<Instant> {
        if self.ready {
            return None;
        }
        [self.start + self.per_cluster, self.start + self.global]
            .into_iter()
            .find(|deadline| *deadline > now)
    }

    /// Remotes still waited for, by name (for the log and status).
    pub fn pending(&self) -> impl Iterator<Item = &str> {
        self.remotes
            .iter()
            .filter(|(_, r)| !r.is_synced())
            .map(|(name, _)| &**name)
    }
}

/// Runs `state` on `events` until they end, publishing readiness on `ready`.
pub async fn run(
    mut state: Readiness,
    mut events: mpsc::UnboundedReceiver<ReadinessEvent>,
    ready: watch::Sender<bool>,
) {
    loop {
        let now = Instant::now();
        if state.check(now) && !*ready.borrow() {
            let pending: Vec<&str> = state.pending().collect();
            if pending.is_empty() {
                tracing::info!("every remote cluster is cached: ready");
            } else {
                tracing::warn!(
                    ?pending,
                    "ready without these remote clusters (not connected in time, or the global timeout passed)"
                );
            }
            ready.send_replace(true);
        }
        let deadline = state.next_deadline(now);
        let event = match deadline {
            Some(deadline) => tokio::select! {
                event = events.recv() => event,
                () = tokio::time::sleep_until(deadline) => continue,
            },
            None => events.recv().await,
        };
        match event {
            Some(event) => state.apply(&event),
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PER_CLUSTER: Duration = Duration::from_secs(15);
    const GLOBAL: Duration = Duration::from_secs(600);

    fn synced_all(state: &mut Readiness, name: &str) {
        for kind in KINDS {
            state.apply(&ReadinessEvent::Synced(name.into(), kind));
        }
    }

    #[test]
    fn ready_once_every_remote_wrote_all_four_canaries() {
        let start = Instant::now();
        let mut state = Readiness::new(["a".into(), "b".into()], start, PER_CLUSTER, GLOBAL);
        state.apply(&ReadinessEvent::Connected("a".into()));
        state.apply(&ReadinessEvent::Connected("b".into()));
        synced_all(&mut state, "a");
        for kind in &KINDS[..3] {
            state.apply(&ReadinessEvent::Synced("b".into(), *kind));
        }
        assert!(!state.check(start));
        assert!(
            !state.check(start + PER_CLUSTER * 2),
            "b connected: it is waited for"
        );
        state.apply(&ReadinessEvent::Synced("b".into(), Resource::IpCache));
        assert!(state.check(start + PER_CLUSTER * 2));
    }

    #[test]
    fn a_remote_that_never_connected_is_dropped_after_its_timeout() {
        let start = Instant::now();
        let mut state = Readiness::new(["a".into(), "down".into()], start, PER_CLUSTER, GLOBAL);
        state.apply(&ReadinessEvent::Connected("a".into()));
        synced_all(&mut state, "a");
        assert!(!state.check(start + PER_CLUSTER - Duration::from_millis(1)));
        assert_eq!(state.next_deadline(start), Some(start + PER_CLUSTER));
        assert!(state.check(start + PER_CLUSTER));
        assert_eq!(state.next_deadline(start + PER_CLUSTER), None);
    }

    #[test]
    fn a_connected_remote_that_never_syncs_waits_for_the_global_timeout() {
        let start = Instant::now();
        let mut state = Readiness::new(["slow".into()], start, PER_CLUSTER, GLOBAL);
        state.apply(&ReadinessEvent::Connected("slow".into()));
        assert!(!state.check(start + GLOBAL - Duration::from_secs(1)));
        assert!(state.check(start + GLOBAL));
        // Latched: nothing undoes it.
        state.apply(&ReadinessEvent::Connected("slow".into()));
        assert!(state.check(start + GLOBAL));
    }

    #[test]
    fn no_remotes_is_ready_at_once_and_later_remotes_are_not_waited_for() {
        let start = Instant::now();
        let mut state = Readiness::new([], start, PER_CLUSTER, GLOBAL);
        state.apply(&ReadinessEvent::Connected("later".into()));
        assert!(state.check(start));
    }

    #[tokio::test(start_paused = true)]
    async fn the_task_turns_ready_at_the_per_cluster_deadline() {
        let start = Instant::now();
        let state = Readiness::new(["down".into()], start, PER_CLUSTER, GLOBAL);
        let (_events, rx) = mpsc::unbounded_channel();
        let (ready, mut seen) = watch::channel(false);
        tokio::spawn(run(state, rx, ready));
        seen.wait_for(|r| *r).await.unwrap();
        assert_eq!(Instant::now() - start, PER_CLUSTER);
    }
}
