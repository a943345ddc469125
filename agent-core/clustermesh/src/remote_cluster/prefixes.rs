//! Where a remote cluster's data lives: Cilium's state layout, or kvstoremesh's cache layout
//! for remotes with the `cached` capability.

use meshwork_kvstore::keys;

/// The watched prefix and the canary prefix of one store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorePrefix {
    /// What the store watches.
    pub watch: String,
    /// What the canary manager gates it on (`cilium/synced/<cluster>/<canary>`).
    pub canary: String,
}

/// The four stores' prefixes for one remote cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterPrefixes {
    /// Nodes.
    pub nodes: StorePrefix,
    /// Services.
    pub services: StorePrefix,
    /// Identities.
    pub identities: StorePrefix,
    /// ipcache.
    pub ipcache: StorePrefix,
}

impl ClusterPrefixes {
    /// The prefixes of `cluster`; `cached` selects `cilium/cache/<type>/v1/<cluster>/…`.
    pub fn new(cluster: &str, cached: bool) -> Self {
        if cached {
            let cache = |kind: &str| format!("{}/{kind}/v1", keys::CACHE_PREFIX);
            return Self {
                nodes: StorePrefix {
                    watch: format!("{}/{cluster}", cache("nodes")),
                    canary: cache("nodes"),
                },
                services: StorePrefix {
                    watch: format!("{}/{cluster}", cache("services")),
                    canary: cache("services"),
                },
                // kvstoremesh keeps the source key below the cluster: `…/<cluster>/id/<id>`.
                identities: StorePrefix {
                    watch: format!("{}/{cluster}/id", cache("identities")),
                    canary: cache("identities"),
                },
                ipcache: StorePrefix {
                    watch: format!("{}/{cluster}", cache("ip")),
                    canary: cache("ip"),
                },
            };
        }
        Self {
            nodes: StorePrefix {
                watch: format!("{}/{cluster}", keys::NODES_PREFIX),
                canary: keys::NODES_PREFIX.to_owned(),
            },
            services: StorePrefix {
                watch: format!("{}/{cluster}", keys::SERVICES_PREFIX),
                canary: keys::SERVICES_PREFIX.to_owned(),
            },
            identities: StorePrefix {
                watch: keys::IDENTITY_ID_PREFIX.to_owned(),
                canary: keys::IDENTITIES_PREFIX.to_owned(),
            },
            ipcache: StorePrefix {
                watch: keys::IPCACHE_DEFAULT_PREFIX.to_owned(),
                canary: keys::IPCACHE_PREFIX.to_owned(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_and_cache_layouts() {
        let state = ClusterPrefixes::new("c1", false);
        assert_eq!(state.nodes.watch, "cilium/state/nodes/v1/c1");
        assert_eq!(state.identities.watch, "cilium/state/identities/v1/id");
        assert_eq!(state.ipcache.canary, "cilium/state/ip/v1");
        let cache = ClusterPrefixes::new("c1", true);
        assert_eq!(cache.ipcache.watch, "cilium/cache/ip/v1/c1");
        assert_eq!(cache.services.canary, "cilium/cache/services/v1");
        assert_eq!(cache.identities.watch, "cilium/cache/identities/v1/c1/id");
    }
}
