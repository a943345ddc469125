//! kvstoremesh's metrics (`meshwork_kvstoremesh_*`): the agent's remote-cluster metrics and
//! kvstore metrics under that prefix, and the cache writer's own.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use meshwork_clustermesh::metrics::MeshMetrics;
use meshwork_kvstore::KvstoreMetrics;

/// Handles to kvstoremesh's metrics; clones share the series.
#[derive(Clone, Debug, Default)]
pub struct CacheMetrics {
    /// Puts and deletes sent to the local etcd (unchanged values are not sent).
    pub writes: Counter,
    /// Failed write attempts (each retried).
    pub write_failures: Counter,
    /// Keys in the cache now.
    pub cached_keys: Gauge,
    /// Seconds from start until ready (0 until then), as Cilium's `bootstrap_seconds`.
    pub bootstrap_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
}

impl CacheMetrics {
    /// Registers kvstoremesh's metrics under `kvstoremesh` in `registry`; returns them with
    /// the remote-cluster and kvstore metrics registered there too.
    pub fn register(registry: &mut Registry) -> (Self, MeshMetrics, KvstoreMetrics) {
        let sub = registry.sub_registry_with_prefix("kvstoremesh");
        let m = Self::default();
        sub.register(
            "cache_writes",
            "Puts and deletes sent to the local etcd (values equal to the cached ones are not sent)",
            m.writes.clone(),
        );
        sub.register(
            "cache_write_failures",
            "Failed write requests to the local etcd (each is retried)",
            m.write_failures.clone(),
        );
        sub.register(
            "cached_keys",
            "Keys kvstoremesh holds in the local cache",
            m.cached_keys.clone(),
        );
        sub.register(
            "bootstrap_seconds",
            "Seconds from start until every remote known at start was cached (0 until then)",
            m.bootstrap_seconds.clone(),
        );
        let mesh = MeshMetrics::register(sub);
        let kvstore = KvstoreMetrics::register(sub);
        (m, mesh, kvstore)
    }
}
