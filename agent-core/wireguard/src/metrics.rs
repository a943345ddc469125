//! WireGuard metrics (`meshwork_wireguard_*`): rejected remote nodes and peer counts.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::peers::PeerError;

/// The `reason` label of a rejection: `duplicate_key` or `malformed_key`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectionLabels {
    /// Why.
    pub reason: &'static str,
}

impl RejectionLabels {
    const DUPLICATE: Self = Self {
        reason: "duplicate_key",
    };
    const MALFORMED: Self = Self {
        reason: "malformed_key",
    };
}

impl From<&PeerError> for RejectionLabels {
    fn from(err: &PeerError) -> Self {
        match err {
            PeerError::Duplicate { .. } => Self::DUPLICATE,
            PeerError::Malformed { .. } => Self::MALFORMED,
        }
    }
}

/// Handles to the WireGuard metrics; cheap to clone (the values are shared).
#[derive(Clone, Debug, Default)]
pub struct WireguardMetrics {
    rejected: Family<RejectionLabels, Counter>,
    peers: Gauge,
    pending_gc: Gauge,
}

impl WireguardMetrics {
    /// Creates the metrics and registers them in `registry` (prefixed `meshwork_` there).
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        // Both reasons from the start: a scrape shows 0 rather than nothing.
        for labels in [RejectionLabels::DUPLICATE, RejectionLabels::MALFORMED] {
            let _ = m.rejected.get_or_create(&labels);
        }
        registry.register(
            "wireguard_rejected_peers",
            "Remote nodes whose WireGuard peer was rejected, by reason",
            m.rejected.clone(),
        );
        registry.register(
            "wireguard_peers",
            "WireGuard peers on the device, as far as the agent knows",
            m.peers.clone(),
        );
        registry.register(
            "wireguard_restored_peers_pending_gc",
            "Peers restored from the device that wait for remote nodes to sync before removal",
            m.pending_gc.clone(),
        );
        m
    }

    /// Counts a rejected node.
    pub fn rejected(&self, err: &PeerError) {
        self.rejected.get_or_create(&err.into()).inc();
    }

    /// Sets the peer gauges.
    pub fn set_peers(&self, peers: usize, pending_gc: usize) {
        self.peers.set(i64::try_from(peers).unwrap_or(i64::MAX));
        self.pending_gc
            .set(i64::try_from(pending_gc).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Key;

    fn encoded(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    #[test]
    fn rejections_are_counted_by_reason_and_peers_gauged() {
        let mut registry = Registry::with_prefix("meshwork");
        let metrics = WireguardMetrics::register(&mut registry);
        let text = encoded(&registry);
        assert!(
            text.contains(r#"meshwork_wireguard_rejected_peers_total{reason="duplicate_key"} 0"#),
            "{text}"
        );
        metrics.rejected(&PeerError::Duplicate {
            node: "c2/n2".into(),
            key: Key([1; 32]),
            owner: "c2/n1".into(),
        });
        metrics.rejected(&PeerError::Malformed {
            node: "c2/n3".into(),
            key: "x".into(),
        });
        metrics.rejected(&PeerError::Malformed {
            node: "c2/n4".into(),
            key: "y".into(),
        });
        metrics.set_peers(7, 2);
        let text = encoded(&registry);
        for line in [
            r#"meshwork_wireguard_rejected_peers_total{reason="duplicate_key"} 1"#,
            r#"meshwork_wireguard_rejected_peers_total{reason="malformed_key"} 2"#,
            "meshwork_wireguard_peers 7",
            "meshwork_wireguard_restored_peers_pending_gc 2",
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
    }
}
