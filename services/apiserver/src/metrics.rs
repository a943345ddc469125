//! The apiserver's metrics (`meshwork_apiserver_*`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The `reason` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Reason {
    /// Why a request was refused.
    pub reason: String,
}

/// Handles to the metrics; clones share them.
#[derive(Debug, Clone, Default)]
pub struct ApiserverMetrics {
    /// Requests refused, by reason.
    pub refused: Family<Reason, Counter>,
    /// Nodes known.
    pub nodes: Gauge,
    /// Endpoints known.
    pub endpoints: Gauge,
    /// Identities allocated.
    pub identities: Gauge,
    /// Services declared.
    pub services: Gauge,
    /// Writes to etcd that failed (each retried).
    pub write_errors: Counter,
    /// Lease keep-alive rounds that succeeded.
    pub lease_renewals: Counter,
    /// Keys written again because their lease vanished.
    pub lease_rewrites: Counter,
}

impl ApiserverMetrics {
    /// Creates the metrics and registers them under `registry`'s prefix + `apiserver_`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let registry = registry.sub_registry_with_prefix("apiserver");
        registry.register(
            "refused_requests",
            "gRPC requests refused, by reason",
            m.refused.clone(),
        );
        registry.register(
            "nodes",
            "Nodes known (connected or within their GC grace)",
            m.nodes.clone(),
        );
        registry.register("endpoints", "Endpoints known", m.endpoints.clone());
        registry.register("identities", "Identities allocated", m.identities.clone());
        registry.register("services", "Global services declared", m.services.clone());
        registry.register(
            "write_errors",
            "Writes to etcd that failed (each is retried)",
            m.write_errors.clone(),
        );
        registry.register(
            "lease_renewals",
            "Rounds of lease keep-alives that succeeded",
            m.lease_renewals.clone(),
        );
        registry.register(
            "lease_rewrites",
            "Keys written again because their lease vanished",
            m.lease_rewrites.clone(),
        );
        m
    }

    /// Counts a refusal.
    pub fn refuse(&self, reason: &str) {
        self.refused
            .get_or_create(&Reason {
                reason: reason.to_owned(),
            })
            .inc();
    }
}
