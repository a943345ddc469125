//! Lab etcds: connecting to one, writing a lab cluster's Cilium-format state into it, and
//! the agent's clustermesh config files that point at them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use meshwork_kvstore::{EtcdBackend, EtcdConfig, KvstoreError};
use meshwork_lab::agent::write_cluster_config;
use meshwork_lab::cilium::Cluster;
use meshwork_lab::etcd::EtcdServer;

/// A client of the plain (no TLS) lab etcd at `endpoint`.
pub async fn connect(endpoint: &str) -> Result<EtcdBackend, KvstoreError> {
    EtcdBackend::connect(&EtcdConfig::new([endpoint]), Duration::from_secs(10)).await
}

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

/// Creates `<dir>/clustermesh` with one config file per cluster and returns its path.
pub fn write_mesh_config(
    dir: &Path,
    servers: &[EtcdServer],
    clusters: &[Cluster],
) -> anyhow::Result<PathBuf> {
    let config = dir.join("clustermesh");
    std::fs::create_dir(&config).with_context(|| format!("creating {}", config.display()))?;
    for (server, cluster) in servers.iter().zip(clusters) {
        write_cluster_config(&config, &cluster.name, &server.endpoint())?;
    }
    Ok(config)
}
