//! Remote identities with Cilium's on-sync semantics (contract §4).
//!
//! Every connection to a remote cluster fills a fresh cache. Until that connection's first
//! list is done, the new cache is pending and the previous connection's cache stays
//! registered. At list-done the new cache replaces the old one: IDs the old one had and the
//! new one lacks are deleted. A connection that ends before its list-done never replaces
//! anything; only the IDs it newly added (unknown to the registered cache) are withdrawn.
//! Identities seen by consumers are the union of the registered and the pending cache.

use std::collections::HashMap;
use std::sync::Arc;

use meshwork_types::{Identity, Labels};

/// What consumers of identities (policy) are told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentityChange {
    /// The identity exists with these labels.
    Upsert(Arc<Identity>),
    /// The identity is gone.
    Delete(u32),
}

// Identities are shared with the watch store that decoded them, never copied. foldhash, as in
// the watch store: seeded per map, and far cheaper than SipHash for one lookup per event.
type Hasher = foldhash::fast::RandomState;
type Cache = HashMap<u32, Arc<Identity>, Hasher>;

#[derive(Default)]
struct ClusterCaches {
    registered: Cache,
    registered_generation: Option<u64>,
    pending: Option<(u64, Cache)>,
}

/// The remote identity caches of every cluster. A plain state machine: each method returns
/// the changes consumers must see.
#[derive(Default)]
pub struct RemoteIdentities {
    clusters: HashMap<String, ClusterCaches, Hasher>,
}

impl RemoteIdentities {
    /// An empty set of caches.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new connection to `cluster` starts filling a fresh cache for `generation`.
    pub fn start(&mut self, cluster: &str, generation: u64) -> Vec<IdentityChange> {
        let caches = self.clusters.entry(cluster.to_owned()).or_default();
        // A pending cache of an older connection that never synced is withdrawn first.
        let mut changes = Vec::new();
        if let Some((_, old)) = caches.pending.take() {
            changes = withdraw_new(&caches.registered, old);
        }
        caches.pending = Some((generation, Cache::default()));
        changes
    }

    /// An identity arrived on connection `generation`: at most one change.
    pub fn upsert(
        &mut self,
        cluster: &str,
        generation: u64,
        identity: Arc<Identity>,
    ) -> Option<IdentityChange> {
        let cache = self.cache_mut(cluster, generation)?;
        if cache
            .get(&identity.id)
            .is_some_and(|known| known.labels == identity.labels)
        {
            return None;
        }
        cache.insert(identity.id, Arc::clone(&identity));
        Some(IdentityChange::Upsert(identity))
    }

    /// An identity was deleted on connection `generation`: at most one change.
    pub fn delete(&mut self, cluster: &str, generation: u64, id: u32) -> Option<IdentityChange> {
        let cache = self.cache_mut(cluster, generation)?;
        cache.remove(&id).map(|_| IdentityChange::Delete(id))
    }

    /// Connection `generation` finished its first list: its cache replaces the registered one.
    pub fn list_done(&mut self, cluster: &str, generation: u64) -> Vec<IdentityChange> {
        let Some(caches) = self.clusters.get_mut(cluster) else {
            return Vec::new();
        };
        let Some((_, new)) = caches.pending.take_if(|(g, _)| *g == generation) else {
            return Vec::new();
        };
        let old = std::mem::replace(&mut caches.registered, new);
        caches.registered_generation = Some(generation);
        old.into_keys()
            .filter(|id| !caches.registered.contains_key(id))
            .map(IdentityChange::Delete)
            .collect()
    }

    /// Connection `generation` ended. Before its list-done, its new IDs are withdrawn; after
    /// it, its cache stays registered (the next connection will replace it).
    pub fn stop(&mut self, cluster: &str, generation: u64) -> Vec<IdentityChange> {
        let Some(caches) = self.clusters.get_mut(cluster) else {
            return Vec::new();
        };
        match caches.pending.take_if(|(g, _)| *g == generation) {
            Some((_, pending)) => withdraw_new(&caches.registered, pending),
            None => Vec::new(),
        }
    }

    /// `cluster` was removed: every identity it contributed is deleted.
    pub fn remove_cluster(&mut self, cluster: &str) -> Vec<IdentityChange> {
        let Some(caches) = self.clusters.remove(cluster) else {
            return Vec::new();
        };
        let mut ids: Vec<u32> = caches.registered.into_keys().collect();
        if let Some((_, pending)) = caches.pending {
            ids.extend(pending.into_keys());
        }
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter().map(IdentityChange::Delete).collect()
    }

    /// The labels of `id` as consumers see them.
    pub fn get(&self, cluster: &str, id: u32) -> Option<&Labels> {
        let caches = self.clusters.get(cluster)?;
        caches
            .pending
            .as_ref()
            .and_then(|(_, p)| p.get(&id))
            .or_else(|| caches.registered.get(&id))
            .map(|identity| &identity.labels)
    }

    /// Identities registered for `cluster` (the last synced connection's cache).
    pub fn registered_len(&self, cluster: &str) -> usize {
        self.clusters.get(cluster).map_or(0, |c| c.registered.len())
    }

    fn cache_mut(&mut self, cluster: &str, generation: u64) -> Option<&mut Cache> {
        let caches = self.clusters.get_mut(cluster)?;
        if caches
            .pending
            .as_ref()
            .is_some_and(|(g, _)| *g == generation)
        {
            return caches.pending.as_mut().map(|(_, p)| p);
        }
        // After its list-done, a connection keeps updating the cache it registered.
        if caches.registered_generation == Some(generation) {
            return Some(&mut caches.registered);
        }
        None
    }
}

fn withdraw_new(registered: &Cache, pending: Cache) -> Vec<IdentityChange> {
    let mut changes: Vec<IdentityChange> = pending
        .into_keys()
        .filter(|id| !registered.contains_key(id))
        .map(IdentityChange::Delete)
        .collect();
    changes.sort_by_key(|c| match c {
        IdentityChange::Delete(id) => *id,
        IdentityChange::Upsert(identity) => identity.id,
    });
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(app: &str) -> Labels {
        Labels::parse_kvstore(&format!(
            "k8s:app={app};k8s:io.cilium.k8s.policy.cluster=c1;"
        ))
    }

    fn identity(id: u32, app: &str) -> Arc<Identity> {
        Arc::new(Identity {
            id,
            labels: labels(app),
        })
    }

    fn deletes(changes: Vec<IdentityChange>) -> Vec<u32> {
        changes
            .into_iter()
            .map(|c| match c {
                IdentityChange::Delete(id) => id,
                IdentityChange::Upsert(identity) => panic!("unexpected upsert of {}", identity.id),
            })
            .collect::<std::collections::BTreeSet<u32>>()
            .into_iter()
            .collect()
    }

    #[test]
    fn list_done_replaces_the_old_cache_and_deletes_what_vanished() {
        let mut ids = RemoteIdentities::new();
        ids.start("c1", 1);
        ids.upsert("c1", 1, identity(10, "a"));
        ids.upsert("c1", 1, identity(11, "b"));
        assert!(ids.list_done("c1", 1).is_empty());
        assert_eq!(ids.registered_len("c1"), 2);

        // Reconnect: 11 vanished, 12 is new. Nothing is deleted before list-done.
        ids.start("c1", 2);
        assert_eq!(
            ids.upsert("c1", 2, identity(10, "a")),
            Some(IdentityChange::Upsert(identity(10, "a")))
        );
        ids.upsert("c1", 2, identity(12, "c"));
        assert_eq!(
            ids.get("c1", 11),
            Some(&labels("b")),
            "the old cache still answers"
        );
        assert_eq!(deletes(ids.list_done("c1", 2)), [11]);
        assert_eq!(ids.registered_len("c1"), 2);
        assert_eq!(ids.get("c1", 11), None);
    }

    #[test]
    fn a_connection_cancelled_before_list_done_withdraws_only_its_new_ids() {
        let mut ids = RemoteIdentities::new();
        ids.start("c1", 1);
        ids.upsert("c1", 1, identity(10, "a"));
        ids.list_done("c1", 1);

        ids.start("c1", 2);
        ids.upsert("c1", 2, identity(10, "a"));
        ids.upsert("c1", 2, identity(20, "new"));
        assert_eq!(deletes(ids.stop("c1", 2)), [20]);
        assert_eq!(
            ids.get("c1", 10),
            Some(&labels("a")),
            "the registered cache is untouched"
        );
        // Its list-done, arriving late, registers nothing.
        assert!(ids.list_done("c1", 2).is_empty());
        assert_eq!(ids.registered_len("c1"), 1);
    }

    #[test]
    fn a_synced_connection_keeps_updating_its_cache() {
        let mut ids = RemoteIdentities::new();
        ids.start("c1", 1);
        ids.list_done("c1", 1);
        assert!(ids.upsert("c1", 1, identity(5, "x")).is_some());
        assert_eq!(
            ids.upsert("c1", 1, identity(5, "x")),
            None,
            "the same labels again change nothing"
        );
        assert_eq!(ids.delete("c1", 1, 5), Some(IdentityChange::Delete(5)));
        assert_eq!(ids.delete("c1", 1, 5), None);
        assert!(
            ids.stop("c1", 1).is_empty(),
            "stopping after list-done withdraws nothing"
        );
        // Events of a stale connection are ignored.
        assert!(ids.upsert("c1", 7, identity(6, "y")).is_none());
    }

    #[test]
    fn removal_deletes_everything_the_cluster_contributed() {
        let mut ids = RemoteIdentities::new();
        ids.start("c1", 1);
        ids.upsert("c1", 1, identity(10, "a"));
        ids.list_done("c1", 1);
        ids.start("c1", 2);
        ids.upsert("c1", 2, identity(11, "b"));
        assert_eq!(deletes(ids.remove_cluster("c1")), [10, 11]);
        assert!(ids.remove_cluster("c1").is_empty());
    }
}
