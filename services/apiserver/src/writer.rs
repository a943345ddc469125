//! What the apiserver writes to its cluster's etcd, through the kvstore layer's
//! [`Writer`]: the prefixes and single keys it owns, adopted when it restarts.

use std::collections::BTreeMap;
use std::time::Duration;

use meshwork_kvstore::keys::{
    CLUSTER_CONFIG_PREFIX, IDENTITY_ID_PREFIX, IPCACHE_DEFAULT_PREFIX, NODES_PREFIX,
    SERVICES_PREFIX, SYNCED_PREFIX,
};
pub use meshwork_kvstore::lease_writer::{KeyChange, MAX_KEYS_PER_LEASE, Writer};
use meshwork_kvstore::{EtcdBackend, KvstoreError};

/// The prefixes an apiserver of `cluster` writes under (each ends in `/`).
pub fn owned_prefixes(cluster: &str) -> [String; 5] {
    [
        format!("{NODES_PREFIX}/{cluster}/"),
        format!("{SERVICES_PREFIX}/{cluster}/"),
        format!("{IPCACHE_DEFAULT_PREFIX}/"),
        format!("{IDENTITY_ID_PREFIX}/"),
        format!("{SYNCED_PREFIX}/{cluster}/"),
    ]
}

/// The single keys an apiserver of `cluster` writes: its cluster config and the heartbeat.
pub fn owned_keys(cluster: &str) -> [String; 2] {
    [
        format!("{CLUSTER_CONFIG_PREFIX}/{cluster}"),
        crate::control_keys::HEARTBEAT_KEY.to_owned(),
    ]
}

/// A writer that takes over what an apiserver of `cluster` wrote before (see
/// [`Writer::adopt`]), with the keys and values found.
pub async fn adopt(
    backend: EtcdBackend,
    cluster: &str,
    ttl: Duration,
) -> Result<(Writer, BTreeMap<String, Vec<u8>>), KvstoreError> {
    Writer::adopt(backend, &owned_prefixes(cluster), &owned_keys(cluster), ttl).await
}
