//! Where kvstoremesh caches a remote, and what the cache writer is told.

use std::sync::Arc;

use meshwork_kvstore::keys::{CACHE_PREFIX, SYNCED_PREFIX};
use meshwork_types::{ClusterConfig, ClusterConfigCapabilities, Resource};
use tokio::sync::oneshot;

/// A set of cache keys (foldhash: a list's every key goes in one).
pub type KeySet = std::collections::HashSet<String, foldhash::fast::RandomState>;

/// The four kinds a remote's cache holds, in the order their canaries are listed.
pub const KINDS: [Resource; 4] = [
    Resource::Nodes,
    Resource::Services,
    Resource::Identities,
    Resource::IpCache,
];

/// The type segment of the cache layout: `cilium/cache/<type>/v1`.
pub fn type_segment(kind: Resource) -> &'static str {
    match kind {
        Resource::Nodes => "nodes",
        Resource::Services => "services",
        Resource::Identities => "identities",
        Resource::IpCache => "ip",
    }
}

/// `cilium/cache/<type>/v1`: what agents reading the cache wait on a canary for.
pub fn cache_scope(kind: Resource) -> String {
    format!("{CACHE_PREFIX}/{}/v1", type_segment(kind))
}

/// Everything cached of `cluster`'s `kind`, ending in `/` (identities keep their `id/`
/// segment below the cluster, as Cilium's kvstoremesh writes them).
pub fn cache_prefix(cluster: &str, kind: Resource) -> String {
    match kind {
        Resource::Identities => format!("{}/{cluster}/id/", cache_scope(kind)),
        _ => format!("{}/{cluster}/", cache_scope(kind)),
    }
}

/// Every cached prefix of `cluster`, one per kind, down to the cluster (for identities, the
/// `id/` level included, so nothing cached of the cluster is missed).
pub fn cluster_prefixes(cluster: &str) -> [String; 4] {
    KINDS.map(|kind| format!("{}/{cluster}/", cache_scope(kind)))
}

/// The cluster a cached entry `cilium/cache/<type>/v1/<cluster>/…` belongs to.
pub fn cached_cluster(key: &str) -> Option<&str> {
    let rest = key.strip_prefix(CACHE_PREFIX)?.strip_prefix('/')?;
    let mut segments = rest.splitn(4, '/');
    let (_kind, version, cluster) = (segments.next()?, segments.next()?, segments.next()?);
    (version == "v1" && !cluster.is_empty() && segments.next().is_some()).then_some(cluster)
}

/// `cilium/synced/<cluster>/cilium/cache/<type>/v1`.
pub fn canary_key(cluster: &str, kind: Resource) -> String {
    format!("{SYNCED_PREFIX}/{cluster}/{}", cache_scope(kind))
}

/// `cilium/synced/<cluster>/cilium/cache/`: every cache canary of `cluster` (not the ones its
/// own apiserver writes, were it this cluster).
pub fn cache_canaries_prefix(cluster: &str) -> String {
    format!("{SYNCED_PREFIX}/{cluster}/{CACHE_PREFIX}/")
}

/// The remote's cluster config as cached: its ID and limits, with `syncedCanaries` and
/// `cached` forced on (the agent then reads the cache prefixes and waits on their canaries).
pub fn cached_config(remote: &ClusterConfig) -> Vec<u8> {
    ClusterConfig {
        id: remote.id,
        capabilities: ClusterConfigCapabilities {
            synced_canaries: true,
            cached: true,
            ..remote.capabilities.clone()
        },
    }
    .to_json()
}

/// What the stores tell the cache writer, in the order it must happen.
#[derive(Debug)]
pub enum CacheOp {
    /// Write `value` at `key` (a cache key), under a lease.
    Put {
        /// The cache key.
        key: String,
        /// The remote's value, as it wrote it.
        value: Vec<u8>,
    },
    /// Delete `key` (a cache key).
    Delete {
        /// The cache key.
        key: String,
    },
    /// A store's first list is done: delete what the cache holds under `prefix` that the
    /// list did not have (written by a previous kvstoremesh, or for an earlier cluster ID),
    /// then — once every write before it landed — write the canary of `cluster` × `kind`.
    ListDone {
        /// The remote.
        cluster: Arc<str>,
        /// Which store.
        kind: Resource,
        /// The store's cache prefix ([`cache_prefix`]).
        prefix: String,
        /// The cache keys the list had.
        listed: KeySet,
    },
    /// Write `cilium/cluster-config/<cluster>` with `value` ([`cached_config`]).
    Config {
        /// The remote.
        cluster: Arc<str>,
        /// The cached config.
        value: Vec<u8>,
    },
    /// The first step of a removal: delete the remote's cached config, so agents disconnect.
    RemoveConfig {
        /// The remote.
        cluster: Arc<str>,
        /// Answered once the delete landed.
        done: oneshot::Sender<()>,
    },
    /// The last step of a removal: delete the remote's canaries, then its cached entries.
    RemoveCluster {
        /// The remote.
        cluster: Arc<str>,
        /// Answered once both landed.
        done: oneshot::Sender<()>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cilium_cache_layout() {
        assert_eq!(
            cache_prefix("c1", Resource::Nodes),
            "cilium/cache/nodes/v1/c1/"
        );
        assert_eq!(
            cache_prefix("c1", Resource::Identities),
            "cilium/cache/identities/v1/c1/id/"
        );
        assert_eq!(
            cache_prefix("c1", Resource::IpCache),
            "cilium/cache/ip/v1/c1/"
        );
        assert_eq!(
            canary_key("c1", Resource::Services),
            "cilium/synced/c1/cilium/cache/services/v1"
        );
    }

    #[test]
    fn the_cluster_of_a_cached_entry() {
        assert_eq!(cached_cluster("cilium/cache/nodes/v1/c1/n1"), Some("c1"));
        assert_eq!(
            cached_cluster("cilium/cache/identities/v1/c2/id/65537"),
            Some("c2")
        );
        assert_eq!(
            cached_cluster("cilium/cache/nodes/v1/c1"),
            None,
            "no entry below it"
        );
        assert_eq!(cached_cluster("cilium/cache/nodes/v2/c1/n1"), None);
        assert_eq!(cached_cluster("cilium/state/nodes/v1/c1/n1"), None);
        assert_eq!(cached_cluster("cilium/cache/nodes/v1//n1"), None);
    }

    #[test]
    fn the_cached_config_says_cached_and_keeps_the_remote_limits() {
        let remote = ClusterConfig {
            id: 7,
            capabilities: ClusterConfigCapabilities {
                max_connected_clusters: 511,
                ..ClusterConfigCapabilities::default()
            },
        };
        assert_eq!(
            String::from_utf8(cached_config(&remote)).unwrap(),
            r#"{"id":7,"capabilities":{"syncedCanaries":true,"cached":true,"maxConnectedClusters":511}}"#
        );
    }
}
