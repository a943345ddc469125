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

#[cfg(test)]
mod tests {
    use meshwork_lab::cilium::{Cluster, Sizes};
    use meshwork_types::{
        Decoder, IdentityDecoder, IpCacheDecoder, IpCacheEntryDecoder, NodeDecoder, ServiceDecoder,
        keys,
    };

    /// What the benchmarks load is what the agent accepts, for every cluster ID: a fixture
    /// the decoders refuse (as kvstoremesh then refuses to cache it) would make a benchmark
    /// measure less than it says.
    #[test]
    fn every_fixture_entry_decodes_for_every_cluster_id() {
        let sizes = Sizes {
            nodes: 3,
            services: 2,
            identities: 3,
            ipcache: 65_540,
        };
        for id in [1, 55, 56, 155, 156, 255] {
            let cluster = Cluster {
                name: format!("cluster-{id}"),
                id,
                sizes,
            };
            let name = cluster.name.as_str();
            let nodes = NodeDecoder::new(name, Some(id));
            let services = ServiceDecoder::new(name, Some(id));
            let identities = IdentityDecoder::new(name, Some(id));
            let ipcache = IpCacheEntryDecoder(IpCacheDecoder::new(Some(id)));
            let mut decoded = 0;
            for (key, value) in cluster.state() {
                let relative = |prefix: &str| key.strip_prefix(&format!("{prefix}/"));
                let ok = if let Some(key) = relative(&format!("{}/{name}", keys::NODES_PREFIX)) {
                    nodes.decode(key, &value).map(drop)
                } else if let Some(key) = relative(&format!("{}/{name}", keys::SERVICES_PREFIX)) {
                    services.decode(key, &value).map(drop)
                } else if let Some(key) = relative(keys::IDENTITY_ID_PREFIX) {
                    identities.decode(key, &value).map(drop)
                } else if let Some(key) = relative(keys::IPCACHE_DEFAULT_PREFIX) {
                    ipcache.decode(key, &value).map(drop)
                } else {
                    panic!("{key} is under no prefix the agent reads");
                };
                ok.unwrap_or_else(|err| panic!("cluster {id}: {key}: {err}"));
                decoded += 1;
            }
            assert_eq!(decoded, 3 + 2 + 3 + 65_540);
        }
    }
}
