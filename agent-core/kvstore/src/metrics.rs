//! Metrics of the kvstore layer (`meshwork_kvstore_*`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of `kvstore_initial_sync_completed`, as Cilium names them.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SyncLabels {
    /// The key scope, e.g. `nodes/v1`.
    pub scope: String,
    /// The cluster the data comes from.
    pub source: String,
    /// `read` for watch stores.
    pub action: String,
}

/// Labels of `kvstore_decode_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PrefixLabels {
    /// The watched prefix.
    pub prefix: String,
}

/// Labels of `kvstore_quorum_errors_total`, as Cilium's.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QuorumErrorLabels {
    /// What failed, e.g. `no event received` (a stale heartbeat).
    pub error: String,
}

/// Handles to the kvstore metrics; clones share the same series.
#[derive(Clone, Debug, Default)]
pub struct KvstoreMetrics {
    /// 1 once a watch store has listed its prefix, 0 while it (re)starts or is stopped.
    pub initial_sync_completed: Family<SyncLabels, Gauge>,
    /// Entries dropped because they did not decode or validate.
    pub decode_errors: Family<PrefixLabels, Counter>,
    /// Quorum errors of remote connections (each stale heartbeat check counts one).
    pub quorum_errors: Family<QuorumErrorLabels, Counter>,
}

impl KvstoreMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "kvstore_initial_sync_completed",
            "Whether the initial synchronization from the kvstore has completed",
            metrics.initial_sync_completed.clone(),
        );
        registry.register(
            "kvstore_decode_errors",
            "Number of kvstore entries dropped because they failed to decode or validate",
            metrics.decode_errors.clone(),
        );
        registry.register(
            "kvstore_quorum_errors",
            "Number of quorum errors of remote kvstore connections",
            metrics.quorum_errors.clone(),
        );
        metrics
    }
}
