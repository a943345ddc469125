//! Writing a lab cluster's Cilium-format state into its etcd.

use meshwork_agent_core::kvstore::{EtcdBackend, KvstoreError};
use meshwork_lab::cilium::Cluster;

/// Writes the cluster config, the state and then the canaries; returns the state's key count.
pub async fn load(backend: &EtcdBackend, cluster: &Cluster) -> Result<usize, KvstoreError> {
    let (key, value) = cluster.config();
    backend.put(&key, value).await?;
    let state = cluster.state();
    let count = state.len();
    backend.put_many(state, 1000).await?;
    backend.put_many(cluster.canaries(), 1000).await?;
    Ok(count)
}
