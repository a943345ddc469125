//! Cilium's kvstore key layout (contract §1).

/// Nodes: `cilium/state/nodes/v1/<cluster>/<node>`.
pub const NODES_PREFIX: &str = "cilium/state/nodes/v1";
/// Services: `cilium/state/services/v1/<cluster>/<namespace>/<name>`.
pub const SERVICES_PREFIX: &str = "cilium/state/services/v1";
/// Identities: `cilium/state/identities/v1/id/<numeric id>`.
pub const IDENTITIES_PREFIX: &str = "cilium/state/identities/v1";
/// Identities by numeric ID, the prefix identity stores watch.
pub const IDENTITY_ID_PREFIX: &str = "cilium/state/identities/v1/id";
/// IP → identity: `cilium/state/ip/v1/default/<ip>[/<len>]`.
pub const IPCACHE_PREFIX: &str = "cilium/state/ip/v1";
/// The ipcache address space Cilium uses (`default`), the prefix ipcache stores watch.
pub const IPCACHE_DEFAULT_PREFIX: &str = "cilium/state/ip/v1/default";
/// Cluster configs: `cilium/cluster-config/<cluster>`.
pub const CLUSTER_CONFIG_PREFIX: &str = "cilium/cluster-config";
/// Present when every remote must publish a cluster config.
pub const HAS_CLUSTER_CONFIG_KEY: &str = "cilium/.has-cluster-config";
/// The time a cluster's apiserver writes every minute (RFC 3339, under a lease); readers
/// take a stale one for lost quorum (contract §8).
pub const HEARTBEAT_KEY: &str = "cilium/.heartbeat";
/// Sync canaries: `cilium/synced/<cluster>/<prefix>`.
pub const SYNCED_PREFIX: &str = "cilium/synced";
/// Where kvstoremesh-style (`cached`) remotes keep data: `cilium/cache/<type>/v1/<cluster>/…`.
pub const CACHE_PREFIX: &str = "cilium/cache";

/// The prefix of the sync canaries of `cluster`, with its trailing `/`.
pub fn synced_prefix(cluster: &str) -> String {
    format!("{SYNCED_PREFIX}/{cluster}/")
}

/// The canary key announcing that `prefix` of `cluster` is fully written.
pub fn canary_key(cluster: &str, prefix: &str) -> String {
    format!("{SYNCED_PREFIX}/{cluster}/{prefix}")
}

/// A prefix with exactly one trailing `/`, so that `cluster1` never matches `cluster10`.
pub fn with_trailing_slash(prefix: &str) -> String {
    if prefix.ends_with('/') {
        prefix.to_owned()
    } else {
        format!("{prefix}/")
    }
}

/// The metric scope of a key, as Cilium labels it: the third and fourth path components
/// (`cilium/state/nodes/v1/…` → `nodes/v1`); short keys give their first 12 bytes.
pub fn scope_of(key: &str) -> String {
    let parts: Vec<&str> = key.splitn(5, '/').collect();
    if parts.len() < 4 {
        return key.chars().take(12).collect();
    }
    format!("{}/{}", parts[2], parts[3])
}

/// The end of the etcd range that covers every key starting with `prefix`.
pub fn prefix_range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All bytes were 0xff: the range is open-ended, which etcd spells as "\0".
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_matches_cilium() {
        assert_eq!(scope_of("cilium/state/nodes/v1/c1/n1"), "nodes/v1");
        assert_eq!(scope_of("cilium/state/ip/v1/default/"), "ip/v1");
        assert_eq!(scope_of("cilium/synced/c1/"), "c1/");
        assert_eq!(scope_of("foo"), "foo");
    }

    #[test]
    fn range_end_of_prefix() {
        assert_eq!(prefix_range_end(b"a/"), b"a0".to_vec());
        assert_eq!(prefix_range_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_range_end(b"\xff"), vec![0]);
    }

    #[test]
    fn trailing_slash_is_added_once() {
        assert_eq!(with_trailing_slash("cilium/synced/c1"), "cilium/synced/c1/");
        assert_eq!(
            with_trailing_slash("cilium/synced/c1/"),
            "cilium/synced/c1/"
        );
    }
}
