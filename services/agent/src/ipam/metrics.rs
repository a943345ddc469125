//! IPAM metrics (`meshwork_ipam_*`): gauges refreshed from the pool before each scrape,
//! counters bumped where the event happens.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use meshwork_ipam::{AllocateError, Mode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The `reason` label of an allocation failure ([`AllocateError::reason`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    /// Why.
    pub reason: &'static str,
}

/// Bounds of the allocation histogram, in seconds: every 0.25 ms from 1 to 2 ms and 2 ms
/// itself, so a p99 read near the 2 ms goal is off by at most a quarter of a millisecond.
const ALLOCATION_BOUNDS: [f64; 24] = [
    0.000_05, 0.000_1, 0.000_15, 0.000_2, 0.000_3, 0.000_4, 0.000_5, 0.000_65, 0.000_8, 0.001,
    0.001_25, 0.001_5, 0.001_75, 0.002, 0.002_5, 0.003, 0.004, 0.005, 0.007_5, 0.01, 0.025, 0.05,
    0.1, 1.0,
];

fn allocation_histogram() -> Histogram {
    Histogram::new(ALLOCATION_BOUNDS)
}

/// Handles to the IPAM metrics; cheap to clone (the values are shared).
#[derive(Clone, Debug)]
pub struct IpamMetrics {
    available: Gauge,
    used: Gauge,
    orphans: Gauge,
    failures: Family<FailureLabels, Counter>,
    snapshot_age: Gauge<f64, AtomicU64>,
    inconsistent: Counter,
    connected: Gauge,
    allocation_duration: Histogram,
}

impl Default for IpamMetrics {
    fn default() -> Self {
        Self {
            available: Gauge::default(),
            used: Gauge::default(),
            orphans: Gauge::default(),
            failures: Family::default(),
            snapshot_age: Gauge::default(),
            inconsistent: Counter::default(),
            connected: Gauge::default(),
            allocation_duration: allocation_histogram(),
        }
    }
}

/// The pool's numbers at a scrape.
#[derive(Clone, Copy, Debug, Default)]
pub struct Gauges {
    /// IPs the pool may hand out.
    pub available: u64,
    /// IPs handed out.
    pub used: u64,
    /// Allocations outside the pool.
    pub orphans: u64,
    /// ENI mode: seconds since the held generation arrived (0 without one).
    pub snapshot_age_seconds: f64,
    /// ENI mode: the operator stream is up.
    pub connected: bool,
}

impl IpamMetrics {
    /// Creates the metrics of `mode` and registers them in `registry` (prefixed `meshwork_`
    /// there); the snapshot and operator series exist in ENI mode only.
    pub fn register(registry: &mut Registry, mode: Mode) -> Self {
        let m = Self::default();
        // Every reason from the start: a scrape shows 0 rather than nothing.
        for reason in AllocateError::REASONS {
            let _ = m.failures.get_or_create(&FailureLabels { reason });
        }
        registry.register(
            "ipam_available_ips",
            "IPs the agent may hand out (the pool minus those in a release handshake; the pod CIDR's hosts in cluster-pool)",
            m.available.clone(),
        );
        registry.register("ipam_used_ips", "IPs handed out", m.used.clone());
        registry.register(
            "ipam_orphaned_allocations",
            "Restored allocations whose IP is not in the pool (kept for their owner, never handed out again)",
            m.orphans.clone(),
        );
        registry.register(
            "ipam_allocation_failures",
            "Allocations that handed out nothing, by reason",
            m.failures.clone(),
        );
        registry.register(
            "ipam_allocation_duration_seconds",
            "Time to hand out a new IP: the request to the fsynced checkpoint (an owner's existing IP is not counted)",
            m.allocation_duration.clone(),
        );
        if mode == Mode::Eni {
            registry.register(
                "ipam_snapshot_generation_age_seconds",
                "Seconds since the held operator snapshot generation first arrived (0: none held)",
                m.snapshot_age.clone(),
            );
            registry.register(
                "ipam_inconsistent_snapshots",
                "Operator snapshots refused because a pool IP named an ENI they lacked (or could not be read)",
                m.inconsistent.clone(),
            );
            registry.register(
                "ipam_operator_connected",
                "Whether the operator's snapshot stream is up (1) or not (0)",
                m.connected.clone(),
            );
        }
        m
    }

    /// Counts a failed allocation.
    pub fn failed(&self, err: &AllocateError) {
        self.failures
            .get_or_create(&FailureLabels {
                reason: err.reason(),
            })
            .inc();
    }

    /// Records a new IP handed out in `took`.
    pub fn allocated(&self, took: Duration) {
        self.allocation_duration.observe(took.as_secs_f64());
    }

    /// Counts a refused snapshot.
    pub fn inconsistent(&self) {
        self.inconsistent.inc();
    }

    /// Sets the gauges.
    pub fn set(&self, gauges: Gauges) {
        let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.available.set(int(gauges.available));
        self.used.set(int(gauges.used));
        self.orphans.set(int(gauges.orphans));
        self.snapshot_age.set(gauges.snapshot_age_seconds);
        self.connected.set(i64::from(gauges.connected));
    }
}
