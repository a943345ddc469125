//! Datapath metrics (`meshwork_datapath_*`, `meshwork_socket_lb_*`, `meshwork_endpoint_*`).
//!
//! What the datapath owns elsewhere — the drop and socket-LB counters in their pinned maps,
//! the map writer's report — is read at each scrape by a [`Collector`], prometheus-client's
//! way for values kept elsewhere: nothing is copied between scrapes, and the pinned counters,
//! which the programs keep bumping while the agent restarts, stay monotonic across agents.
//! Endpoint regenerations are counted and timed where they happen.

use std::fmt;
use std::time::Duration;

use meshwork_datapath::drops::{self, DropReason};
use meshwork_datapath::ipcache_map::EntryError;
use meshwork_datapath::maps::{IPCACHE_MAP, PinDir};
use meshwork_datapath::remote_maps::{BACKENDS_MAP, REV_NAT_MAP, SERVICES_MAP, TUNNEL_MAP};
use meshwork_datapath::socket_lb_stats::{self, SocketLbStats};
use meshwork_datapath::writer::WriterReport;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::TypedMetric;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

/// Bounds of the regeneration histogram, in seconds: 1 ms to 10 s in 1-2.5-5 steps. A
/// regeneration (ELF load, the verifier, tc attach) takes tens of milliseconds on an idle
/// node, and seconds only when the node is starved.
const REGENERATION_BOUNDS: [f64; 13] = [
    0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The `outcome` label of a regeneration: Cilium's `success` and `fail`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `success` or `fail`.
    pub outcome: &'static str,
}

/// Endpoint regenerations, counted and timed by the endpoint manager; cheap to clone (the
/// values are shared).
#[derive(Clone, Debug)]
pub struct EndpointMetrics {
    regenerations: Family<OutcomeLabels, Counter>,
    duration: Histogram,
}

impl Default for EndpointMetrics {
    fn default() -> Self {
        let m = Self {
            regenerations: Family::default(),
            duration: Histogram::new(REGENERATION_BOUNDS),
        };
        // Both outcomes from the start: a scrape shows 0 rather than nothing.
        for outcome in ["success", "fail"] {
            let _ = m.regenerations.get_or_create(&OutcomeLabels { outcome });
        }
        m
    }
}

impl EndpointMetrics {
    /// Counts a finished regeneration that took `took`.
    pub fn regenerated(&self, succeeded: bool, took: Duration) {
        let outcome = if succeeded { "success" } else { "fail" };
        self.regenerations
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
        self.duration.observe(took.as_secs_f64());
    }

    fn register(&self, registry: &mut Registry) {
        registry.register(
            "endpoint_regenerations",
            "Endpoint regenerations (program loaded and attached) by outcome",
            self.regenerations.clone(),
        );
        registry.register(
            "endpoint_regeneration_duration_seconds",
            "Time to regenerate an endpoint: its program loaded, verified and attached (every outcome)",
            self.duration.clone(),
        );
    }
}

/// Registers the datapath's metrics in `registry` (prefixed `meshwork_` there): the maps
/// under `pins` and the writer's `report` read at each scrape, and `endpoints`.
pub fn register(
    registry: &mut Registry,
    pins: PinDir,
    report: watch::Receiver<WriterReport>,
    endpoints: &EndpointMetrics,
) {
    registry.register_collector(Box::new(DatapathCollector { pins, report }));
    endpoints.register(registry);
}

/// Reads the datapath at each scrape.
#[derive(Debug)]
struct DatapathCollector {
    pins: PinDir,
    report: watch::Receiver<WriterReport>,
}

impl Collector for DatapathCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        // A copy, so the writer is never held up while the maps are read.
        let report = self.report.borrow().clone();
        Scraped::read(&self.pins, report).encode(&mut encoder)
    }
}

/// What one scrape read: the pinned counters (`None` when a map is unreadable: its series
/// are left out) and the writer's report.
#[derive(Debug, Clone, Default)]
struct Scraped {
    /// Drops by reason.
    drops: Option<Vec<(DropReason, u64)>>,
    /// The socket-LB counters.
    socket_lb: Option<SocketLbStats>,
    /// The map writer's report.
    report: WriterReport,
}

impl Scraped {
    fn read(pins: &PinDir, report: WriterReport) -> Self {
        let drops = drops::read(pins)
            .inspect_err(|err| tracing::warn!(%err, "metrics: the drop counters are unreadable"))
            .ok();
        let socket_lb = socket_lb_stats::read(pins)
            .inspect_err(
                |err| tracing::warn!(%err, "metrics: the socket-LB counters are unreadable"),
            )
            .ok();
        Self {
            drops,
            socket_lb,
            report,
        }
    }

    /// Encodes every series (see the module docs).
    fn encode(&self, encoder: &mut DescriptorEncoder<'_>) -> fmt::Result {
        if let Some(drops) = &self.drops {
            family(
                encoder,
                "datapath_drops",
                "Packets the endpoint programs dropped, by reason (pinned: counts across agent restarts).",
                "reason",
                drops.iter().map(|(reason, n)| (reason.label(), *n)),
                ConstCounter::new,
            )?;
        }
        let report = &self.report;
        let mut entries = vec![(IPCACHE_MAP, report.entries as u64)];
        let mut errors = vec![(
            IPCACHE_MAP,
            report.stats.map_full + report.stats.write_errors,
        )];
        if let Some(maps) = &report.remote_maps {
            for (name, stats) in [
                (SERVICES_MAP, maps.services),
                (BACKENDS_MAP, maps.backends),
                (REV_NAT_MAP, maps.rev_nat),
                (TUNNEL_MAP, maps.tunnel),
            ] {
                entries.push((name, stats.entries));
                errors.push((name, stats.errors));
            }
        }
        family(
            encoder,
            "datapath_map_entries",
            "Entries the agent keeps in each BPF map it writes.",
            "map_name",
            entries,
            ConstGauge::new,
        )?;
        family(
            encoder,
            "datapath_map_errors",
            "Failed writes and deletes by map (the ipcache's include writes refused because it was full).",
            "map_name",
            errors,
            ConstCounter::new,
        )?;
        family(
            encoder,
            "datapath_ipcache_rejections",
            "ipcache entries rejected before reaching the map, by reason.",
            "reason",
            EntryError::REASONS
                .map(|reason| (reason, report.rejected.get(reason).copied().unwrap_or(0))),
            ConstCounter::new,
        )?;
        if let Some(socket_lb) = &self.socket_lb {
            family(
                encoder,
                "socket_lb_translations",
                "Socket-LB translations by hook: frontend to backend (connect4, sendmsg4), backend back to frontend (recvmsg4, getpeername4).",
                "hook",
                socket_lb
                    .translations
                    .iter()
                    .map(|(hook, n)| (hook.label(), *n)),
                ConstCounter::new,
            )?;
            let refusals = ConstCounter::new(socket_lb.refusals);
            refusals.encode(encoder.encode_descriptor(
                "socket_lb_refusals",
                "Connects and sends socket-LB refused, nearly all to a frontend without backends (EHOSTUNREACH).",
                None,
                ConstCounter::<u64>::TYPE,
            )?)?;
        }
        Ok(())
    }
}

/// One family of `metric`s, one per `(label value, value)`. Callers end `help` with a full
/// stop, which the registry adds only to what is registered in it.
fn family<'v, M: EncodeMetric + TypedMetric>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    label: &str,
    values: impl IntoIterator<Item = (&'v str, u64)>,
    metric: fn(u64) -> M,
) -> fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, M::TYPE)?;
    for (value, n) in values {
        metric(n).encode(family.encode_family(&[(label, value)])?)?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
