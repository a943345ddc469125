//! Numeric identities for label sets, inside the cluster's range (cilium-semantics §3): the
//! same labels always get the same ID; IDs found in etcd at start are kept (so they survive
//! restarts of the apiserver and of agents); an ID no endpoint has used for the GC interval
//! is released.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;
use std::time::Duration;

use meshwork_types::{Label, Labels, POLICY_LABEL_CLUSTER};
use meshwork_types::{MINIMAL_NUMERIC_IDENTITY, identity_range};
use tokio::time::Instant;

/// Who uses an identity: a node's endpoint.
pub type User = (String, u64);

/// The cluster's identity range is used up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("every identity of the cluster's range {start}..={end} is in use")]
pub struct Exhausted {
    /// The first ID of the range.
    pub start: u32,
    /// The last ID of the range.
    pub end: u32,
}

#[derive(Debug)]
struct Allocated {
    labels: String,
    users: BTreeSet<User>,
    /// Since when no endpoint uses it (`None` while some does).
    unused_since: Option<Instant>,
}

/// The allocator; plain, driven by the apiserver's state.
#[derive(Debug)]
pub struct IdentityAllocator {
    cluster: String,
    range: RangeInclusive<u32>,
    by_labels: BTreeMap<String, u32>,
    by_id: BTreeMap<u32, Allocated>,
    /// No ID below this is free.
    free_from: u32,
}

impl IdentityAllocator {
    /// The allocator of cluster `cluster` (ID `cluster_id`, `max_connected_clusters`).
    pub fn new(cluster: &str, cluster_id: u32, max_connected_clusters: u32) -> Self {
        let range = identity_range(cluster_id, max_connected_clusters);
        // Below 256 are the reserved identities, also in cluster 0's range.
        let start = (*range.start()).max(MINIMAL_NUMERIC_IDENTITY);
        Self {
            cluster: cluster.to_owned(),
            range: start..=*range.end(),
            by_labels: BTreeMap::new(),
            by_id: BTreeMap::new(),
            free_from: start,
        }
    }

    /// The kvstore form of an endpoint's labels as an identity carries them: with Cilium's
    /// `k8s:io.cilium.k8s.policy.cluster=<cluster>`, which remote readers require.
    pub fn identity_labels(&self, labels: &[Label]) -> String {
        let mut set: Labels = labels.iter().cloned().collect();
        set.insert(Label::new("k8s", POLICY_LABEL_CLUSTER, &self.cluster));
        set.to_kvstore_string()
    }

    /// Keeps an identity found in etcd (its kvstore label string), unused from `now` on.
    /// One outside the range, or a second ID for the same labels, is not kept: `false`.
    pub fn restore(&mut self, id: u32, labels: &str, now: Instant) -> bool {
        if !self.range.contains(&id)
            || self.by_id.contains_key(&id)
            || self.by_labels.contains_key(labels)
        {
            return false;
        }
        self.by_labels.insert(labels.to_owned(), id);
        self.by_id.insert(
            id,
            Allocated {
                labels: labels.to_owned(),
                users: BTreeSet::new(),
                unused_since: Some(now),
            },
        );
        true
    }

    /// The ID for `labels` (kvstore form, see [`Self::identity_labels`]), now used by
    /// `user`; allocated (lowest free ID) when the labels have none. `Some(labels)` in the
    /// second value when the ID is new and must be written.
    pub fn acquire(&mut self, labels: &str, user: User) -> Result<(u32, bool), Exhausted> {
        if let Some(&id) = self.by_labels.get(labels) {
            let allocated = self.by_id.get_mut(&id).expect("both maps hold every ID");
            allocated.users.insert(user);
            allocated.unused_since = None;
            return Ok((id, false));
        }
        let id = self.lowest_free().ok_or(Exhausted {
            start: *self.range.start(),
            end: *self.range.end(),
        })?;
        self.by_labels.insert(labels.to_owned(), id);
        self.by_id.insert(
            id,
            Allocated {
                labels: labels.to_owned(),
                users: BTreeSet::from([user]),
                unused_since: None,
            },
        );
        Ok((id, true))
    }

    /// `user` no longer uses `id`.
    pub fn release(&mut self, id: u32, user: &User, now: Instant) {
        if let Some(allocated) = self.by_id.get_mut(&id) {
            allocated.users.remove(user);
            if allocated.users.is_empty() && allocated.unused_since.is_none() {
                allocated.unused_since = Some(now);
            }
        }
    }

    /// Releases every identity unused for at least `interval`; returns their IDs.
    pub fn collect_garbage(&mut self, now: Instant, interval: Duration) -> Vec<u32> {
        let expired: Vec<u32> = self
            .by_id
            .iter()
            .filter(|(_, a)| a.unused_since.is_some_and(|since| now - since >= interval))
            .map(|(id, _)| *id)
            .collect();
        for id in &expired {
            if let Some(allocated) = self.by_id.remove(id) {
                self.by_labels.remove(&allocated.labels);
            }
            self.free_from = self.free_from.min(*id);
        }
        expired
    }

    /// The labels of `id`, if allocated.
    pub fn labels(&self, id: u32) -> Option<&str> {
        self.by_id.get(&id).map(|a| a.labels.as_str())
    }

    /// Identities allocated now.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// No identity is allocated.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    fn lowest_free(&mut self) -> Option<u32> {
        // IDs are handed out from the bottom: the first gap at or after `free_from`.
        let mut candidate = self.free_from;
        for &id in self.by_id.range(candidate..).map(|(id, _)| id) {
            if id > candidate {
                break;
            }
            candidate = id.checked_add(1)?;
        }
        self.free_from = candidate;
        self.range.contains(&candidate).then_some(candidate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(node: &str, id: u64) -> User {
        (node.to_owned(), id)
    }

    #[test]
    fn the_same_labels_get_the_same_id_in_the_cluster_range() {
        let mut ids = IdentityAllocator::new("c1", 1, 255);
        let web = ids.identity_labels(&[Label::parse("k8s:app=web")]);
        assert_eq!(web, "k8s:app=web;k8s:io.cilium.k8s.policy.cluster=c1;");
        let (a, new) = ids.acquire(&web, user("n1", 1)).unwrap();
        assert_eq!((a, new), (65536, true));
        assert_eq!(ids.acquire(&web, user("n2", 7)).unwrap(), (65536, false));
        let db = ids.identity_labels(&[Label::parse("k8s:app=db")]);
        assert_eq!(ids.acquire(&db, user("n1", 2)).unwrap(), (65537, true));
    }

    #[test]
    fn restored_ids_are_kept_and_gaps_are_reused() {
        let now = Instant::now();
        let mut ids = IdentityAllocator::new("c1", 1, 255);
        assert!(ids.restore(65537, "k8s:app=db;", now));
        assert!(
            !ids.restore(65538, "k8s:app=db;", now),
            "a second ID for the same labels"
        );
        assert!(!ids.restore(5, "k8s:app=x;", now), "outside the range");
        assert_eq!(
            ids.acquire("k8s:app=db;", user("n1", 1)).unwrap(),
            (65537, false)
        );
        assert_eq!(
            ids.acquire("k8s:app=web;", user("n1", 2)).unwrap(),
            (65536, true)
        );
        assert_eq!(
            ids.acquire("k8s:app=api;", user("n1", 3)).unwrap(),
            (65538, true)
        );
    }

    #[test]
    fn an_id_unused_for_the_interval_is_released_and_a_used_one_never() {
        let start = Instant::now();
        let gc = Duration::from_secs(900);
        let mut ids = IdentityAllocator::new("c1", 1, 255);
        let (web, _) = ids.acquire("web;", user("n1", 1)).unwrap();
        let (db, _) = ids.acquire("db;", user("n1", 2)).unwrap();
        ids.release(web, &user("n1", 1), start);
        assert!(
            ids.collect_garbage(start + gc - Duration::from_secs(1), gc)
                .is_empty()
        );
        assert_eq!(ids.collect_garbage(start + gc, gc), [web]);
        assert_eq!(ids.labels(db), Some("db;"), "still used");
        assert!(ids.collect_garbage(start + gc * 10, gc).is_empty());
        // Used again before the interval: kept.
        ids.release(db, &user("n1", 2), start);
        ids.acquire("db;", user("n2", 9)).unwrap();
        assert!(ids.collect_garbage(start + gc * 2, gc).is_empty());
    }

    #[test]
    fn a_full_range_is_an_error_naming_it() {
        let mut ids = IdentityAllocator::new("c1", 1, 255);
        for i in 0..65536_u32 {
            ids.acquire(&format!("k8s:i={i};"), user("n", u64::from(i)))
                .unwrap();
        }
        let err = ids.acquire("k8s:one=more;", user("n", 0)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "every identity of the cluster's range 65536..=131071 is in use"
        );
    }
}
