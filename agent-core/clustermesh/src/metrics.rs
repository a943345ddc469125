//! Cluster mesh metrics (`meshwork_remote_cluster*`), refreshed from status snapshots.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::status::ClusterStatus;

/// The `target_cluster` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetCluster {
    /// The remote cluster.
    pub target_cluster: String,
}

type PerCluster = Family<TargetCluster, Gauge>;

/// Handles to the cluster mesh metrics.
#[derive(Debug, Default)]
pub struct MeshMetrics {
    remote_clusters: Gauge,
    readiness: PerCluster,
    failures: PerCluster,
    last_failure_ts: Family<TargetCluster, Gauge<f64, AtomicU64>>,
    nodes: PerCluster,
    services: PerCluster,
    ipcache: PerCluster,
    identities: PerCluster,
    known: Mutex<BTreeSet<String>>,
}

impl MeshMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "remote_clusters",
            "Number of remote clusters configured",
            m.remote_clusters.clone(),
        );
        registry.register(
            "remote_cluster_readiness_status",
            "Readiness of a remote cluster (1 ready, 0 not ready)",
            m.readiness.clone(),
        );
        registry.register(
            "remote_cluster_failures",
            "Connection failures of a remote cluster",
            m.failures.clone(),
        );
        registry.register(
            "remote_cluster_last_failure_ts",
            "Unix time of the last connection failure of a remote cluster (0: none)",
            m.last_failure_ts.clone(),
        );
        registry.register(
            "remote_cluster_nodes",
            "Nodes of a remote cluster",
            m.nodes.clone(),
        );
        registry.register(
            "remote_cluster_services",
            "Services of a remote cluster",
            m.services.clone(),
        );
        registry.register(
            "remote_cluster_endpoints",
            "ipcache entries of a remote cluster",
            m.ipcache.clone(),
        );
        registry.register(
            "remote_cluster_identities",
            "Identities of a remote cluster",
            m.identities.clone(),
        );
        m
    }

    /// Sets every series from `statuses`; series of clusters that are gone are removed.
    pub fn update(&self, statuses: &[ClusterStatus]) {
        self.remote_clusters.set(statuses.len() as i64);
        let mut known = self
            .known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now: BTreeSet<String> = statuses.iter().map(|s| s.name.clone()).collect();
        for gone in known.difference(&now) {
            let label = TargetCluster {
                target_cluster: gone.clone(),
            };
            for family in [
                &self.readiness,
                &self.failures,
                &self.nodes,
                &self.services,
                &self.ipcache,
                &self.identities,
            ] {
                family.remove(&label);
            }
            self.last_failure_ts.remove(&label);
        }
        *known = now;
        for status in statuses {
            let label = TargetCluster {
                target_cluster: status.name.clone(),
            };
            let set = |family: &PerCluster, value: u64| {
                family
                    .get_or_create(&label)
                    .set(i64::try_from(value).unwrap_or(i64::MAX));
            };
            set(&self.readiness, u64::from(status.ready()));
            set(&self.failures, status.failures);
            set(&self.nodes, status.entries.nodes);
            set(&self.services, status.entries.services);
            set(&self.ipcache, status.entries.ipcache);
            set(&self.identities, status.entries.identities);
            let ts = status
                .last_failure
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0.0, |d| d.as_secs_f64());
            self.last_failure_ts.get_or_create(&label).set(ts);
        }
    }
}
