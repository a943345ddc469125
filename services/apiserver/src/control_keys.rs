//! The keys that describe the cluster rather than its state (cilium-semantics §1, §8): its
//! cluster config, the marker older readers look for, the heartbeat and the sync canaries.

use std::time::SystemTime;

use meshwork_types::keys::{
    HAS_CLUSTER_CONFIG_KEY, IDENTITIES_PREFIX, IPCACHE_PREFIX, NODES_PREFIX, SERVICES_PREFIX,
    SYNCED_PREFIX,
};
use meshwork_types::{ClusterConfig, ClusterConfigCapabilities};

/// Written every minute under a lease; readers count a quorum error after two without one.
pub use meshwork_types::keys::HEARTBEAT_KEY;

/// The prefixes a canary is written for, once the initial state of all of them is written.
pub const CANARY_PREFIXES: [&str; 4] = [
    NODES_PREFIX,
    SERVICES_PREFIX,
    IDENTITIES_PREFIX,
    IPCACHE_PREFIX,
];

/// `cilium/cluster-config/<cluster>` and its value: sync canaries, never `cached`.
pub fn cluster_config(
    cluster: &str,
    cluster_id: u32,
    max_connected_clusters: u32,
) -> (String, Vec<u8>) {
    let config = ClusterConfig {
        id: cluster_id,
        capabilities: ClusterConfigCapabilities {
            synced_canaries: true,
            max_connected_clusters,
            service_exports_enabled: Some(false),
            ..ClusterConfigCapabilities::default()
        },
    };
    (ClusterConfig::key(cluster), config.to_json())
}

/// The marker older readers look for (written without a lease).
pub fn has_cluster_config() -> (String, Vec<u8>) {
    (HAS_CLUSTER_CONFIG_KEY.to_owned(), b"true".to_vec())
}

/// `cilium/synced/<cluster>/<prefix>` for each canary prefix, valued `now` (RFC 3339).
pub fn canaries(cluster: &str, now: SystemTime) -> Vec<(String, Vec<u8>)> {
    CANARY_PREFIXES
        .iter()
        .map(|prefix| (format!("{SYNCED_PREFIX}/{cluster}/{prefix}"), rfc3339(now)))
        .collect()
}

/// The heartbeat's value at `now`.
pub fn heartbeat(now: SystemTime) -> (String, Vec<u8>) {
    (HEARTBEAT_KEY.to_owned(), rfc3339(now))
}

fn rfc3339(now: SystemTime) -> Vec<u8> {
    humantime::format_rfc3339_seconds(now)
        .to_string()
        .into_bytes()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use meshwork_types::{ClusterConfigDecoder, Decoder as _};

    use super::*;

    #[test]
    fn the_cluster_config_is_what_a_remote_agent_validates() {
        let (key, value) = cluster_config("c1", 7, 255);
        assert_eq!(key, "cilium/cluster-config/c1");
        assert_eq!(
            String::from_utf8(value.clone()).unwrap(),
            r#"{"id":7,"capabilities":{"syncedCanaries":true,"maxConnectedClusters":255,"serviceExportsEnabled":false}}"#
        );
        let decoded = ClusterConfigDecoder::default()
            .decode("c1", &value)
            .unwrap();
        assert!(decoded.capabilities.synced_canaries && !decoded.capabilities.cached);
    }

    #[test]
    fn canaries_name_the_four_prefixes_of_the_cluster() {
        let at = UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        let keys: Vec<String> = canaries("c1", at).into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            [
                "cilium/synced/c1/cilium/state/nodes/v1",
                "cilium/synced/c1/cilium/state/services/v1",
                "cilium/synced/c1/cilium/state/identities/v1",
                "cilium/synced/c1/cilium/state/ip/v1",
            ]
        );
        assert_eq!(heartbeat(at).1, b"2026-11-18T11:06:40Z");
    }
}
