//! When the cluster's initial state is complete, so that the sync canaries may be written
//! (cilium-semantics §8): a remote reader that re-lists once the canaries are there must
//! find everything live, also after the apiserver's etcd was wiped.
//!
//! The state is complete once no agent that connected within `--initial-sync-timeout` is
//! still sending its initial state, and either the timeout has passed or every node found in
//! etcd at start has republished. With nothing found in etcd (a fresh or wiped store) only the
//! timeout can tell that every agent had its chance, so the apiserver waits for it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

/// The plain state machine; see the module docs.
#[derive(Debug)]
pub struct InitialSync {
    deadline: Instant,
    /// Nodes found in etcd at start, not yet republished.
    adopted: BTreeSet<String>,
    adopted_any: bool,
    /// Sessions opened before the deadline: whether each has sent its initial state.
    sessions: BTreeMap<String, bool>,
    complete: bool,
}

impl InitialSync {
    /// Started at `now` with `timeout`, with the nodes `adopted` from etcd.
    pub fn new(now: Instant, timeout: Duration, adopted: impl IntoIterator<Item = String>) -> Self {
        let adopted: BTreeSet<String> = adopted.into_iter().collect();
        Self {
            deadline: now + timeout,
            adopted_any: !adopted.is_empty(),
            adopted,
            sessions: BTreeMap::new(),
            complete: false,
        }
    }

    /// `node`'s agent connected at `now`.
    pub fn session_opened(&mut self, node: &str, now: Instant) {
        if !self.complete && now < self.deadline {
            self.sessions.insert(node.to_owned(), false);
        }
    }

    /// `node`'s agent has sent its initial state.
    pub fn session_complete(&mut self, node: &str) {
        if let Some(done) = self.sessions.get_mut(node) {
            *done = true;
        }
        self.adopted.remove(node);
    }

    /// `node` was deleted by hand: it is not waited for.
    pub fn node_deleted(&mut self, node: &str) {
        self.adopted.remove(node);
        self.sessions.remove(node);
    }

    /// `node`'s agent went before sending its initial state: nothing to wait for from it.
    pub fn session_closed(&mut self, node: &str) {
        if self.sessions.get(node) == Some(&false) {
            self.sessions.remove(node);
        }
    }

    /// Whether the initial state is complete at `now`; once it is, it stays so.
    pub fn is_complete(&mut self, now: Instant) -> bool {
        if !self.complete {
            let pending = self.sessions.values().any(|done| !done);
            let everyone_back = self.adopted_any && self.adopted.is_empty();
            self.complete = !pending && (now >= self.deadline || everyone_back);
        }
        self.complete
    }

    /// When [`Self::is_complete`] may next turn true by time alone.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(60);

    #[test]
    fn a_wiped_store_waits_out_the_timeout_and_every_agent_that_came_in_it() {
        let start = Instant::now();
        let mut sync = InitialSync::new(start, TIMEOUT, []);
        assert!(
            !sync.is_complete(start),
            "nothing adopted: only the timeout can tell"
        );
        sync.session_opened("n1", start + Duration::from_secs(5));
        sync.session_complete("n1");
        sync.session_opened("n2", start + Duration::from_secs(50));
        assert!(!sync.is_complete(start + Duration::from_secs(59)));
        assert!(!sync.is_complete(start + TIMEOUT), "n2 is still publishing");
        sync.session_complete("n2");
        assert!(sync.is_complete(start + TIMEOUT));
    }

    #[test]
    fn after_a_restart_it_completes_as_soon_as_every_adopted_node_is_back() {
        let start = Instant::now();
        let mut sync = InitialSync::new(start, TIMEOUT, ["n1".to_owned(), "n2".to_owned()]);
        sync.session_opened("n1", start);
        sync.session_complete("n1");
        assert!(!sync.is_complete(start), "n2 has not republished");
        sync.session_opened("n2", start);
        sync.session_complete("n2");
        assert!(sync.is_complete(start + Duration::from_secs(1)));
    }

    #[test]
    fn an_agent_that_never_returns_is_waited_for_only_until_the_timeout() {
        let start = Instant::now();
        let mut sync = InitialSync::new(start, TIMEOUT, ["gone".to_owned()]);
        assert!(!sync.is_complete(start + Duration::from_secs(59)));
        assert!(sync.is_complete(start + TIMEOUT));
        // A session after the deadline does not hold completion back.
        sync.session_opened("late", start + TIMEOUT + Duration::from_secs(1));
        assert!(sync.is_complete(start + TIMEOUT + Duration::from_secs(1)));
    }

    #[test]
    fn a_deleted_adopted_node_is_not_waited_for() {
        let start = Instant::now();
        let mut sync = InitialSync::new(start, TIMEOUT, ["n1".to_owned(), "gone".to_owned()]);
        sync.session_opened("n1", start);
        sync.session_complete("n1");
        assert!(!sync.is_complete(start), "gone is waited for");
        sync.node_deleted("gone");
        assert!(sync.is_complete(start));
    }

    #[test]
    fn an_agent_that_leaves_mid_publish_is_not_waited_for() {
        let start = Instant::now();
        let mut sync = InitialSync::new(start, TIMEOUT, []);
        sync.session_opened("n1", start);
        sync.session_closed("n1");
        assert!(sync.is_complete(start + TIMEOUT));
    }
}
