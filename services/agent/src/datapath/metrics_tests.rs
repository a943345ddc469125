use meshwork_datapath::pinned_sync::SyncStats;
use meshwork_datapath::remote_maps::RemoteMapStats;
use meshwork_datapath::socket_lb_stats::SocketLbHook;

use super::*;

/// Encodes `scraped` as the agent's collector does at a scrape.
#[derive(Debug)]
struct Fixed(Scraped);

impl Collector for Fixed {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        self.0.encode(&mut encoder)
    }
}

fn encoded(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text
}

fn entries(n: u64) -> SyncStats {
    SyncStats {
        entries: n,
        ..SyncStats::default()
    }
}

fn scraped() -> Scraped {
    let mut report = WriterReport {
        entries: 11,
        ..WriterReport::default()
    };
    report.rejected.insert("zero_identity", 2);
    report.stats.map_full = 1;
    report.remote_maps = Some(RemoteMapStats {
        services: SyncStats {
            errors: 4,
            ..entries(2)
        },
        backends: entries(1),
        rev_nat: entries(1),
        tunnel: entries(2),
    });
    Scraped {
        drops: Some(vec![
            (DropReason::UnknownDestination, 3),
            (DropReason::PolicyDenied, 0),
            (DropReason::Malformed, 1),
        ]),
        socket_lb: Some(SocketLbStats {
            translations: vec![
                (SocketLbHook::Connect4, 20),
                (SocketLbHook::Sendmsg4, 1),
                (SocketLbHook::Recvmsg4, 1),
                (SocketLbHook::Getpeername4, 20),
            ],
            refusals: 1,
        }),
        report,
    }
}

#[test]
fn a_scrape_encodes_the_counters_and_the_report_under_the_prefix() {
    let mut registry = Registry::with_prefix("meshwork");
    registry.register_collector(Box::new(Fixed(scraped())));
    let text = encoded(&registry);
    for line in [
        "# TYPE meshwork_datapath_drops counter",
        r#"meshwork_datapath_drops_total{reason="unknown_destination"} 3"#,
        r#"meshwork_datapath_drops_total{reason="policy_denied"} 0"#,
        r#"meshwork_datapath_drops_total{reason="malformed"} 1"#,
        "# TYPE meshwork_datapath_map_entries gauge",
        r#"meshwork_datapath_map_entries{map_name="cilium_ipcache"} 11"#,
        r#"meshwork_datapath_map_entries{map_name="cilium_lb4_services_v2"} 2"#,
        r#"meshwork_datapath_map_entries{map_name="cilium_lb4_backends_v3"} 1"#,
        r#"meshwork_datapath_map_entries{map_name="cilium_lb4_reverse_nat"} 1"#,
        r#"meshwork_datapath_map_entries{map_name="cilium_tunnel_map"} 2"#,
        r#"meshwork_datapath_map_errors_total{map_name="cilium_ipcache"} 1"#,
        r#"meshwork_datapath_map_errors_total{map_name="cilium_lb4_services_v2"} 4"#,
        // Every reason, the ones never seen at 0.
        r#"meshwork_datapath_ipcache_rejections_total{reason="unparsable_ip"} 0"#,
        r#"meshwork_datapath_ipcache_rejections_total{reason="mask_too_long"} 0"#,
        r#"meshwork_datapath_ipcache_rejections_total{reason="zero_identity"} 2"#,
        r#"meshwork_socket_lb_translations_total{hook="connect4"} 20"#,
        r#"meshwork_socket_lb_translations_total{hook="sendmsg4"} 1"#,
        r#"meshwork_socket_lb_translations_total{hook="recvmsg4"} 1"#,
        r#"meshwork_socket_lb_translations_total{hook="getpeername4"} 20"#,
        "# TYPE meshwork_socket_lb_refusals counter",
        "meshwork_socket_lb_refusals_total 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
    }
}

#[test]
fn an_unreadable_map_leaves_only_its_series_out() {
    let mut registry = Registry::with_prefix("meshwork");
    registry.register_collector(Box::new(Fixed(Scraped {
        drops: None,
        socket_lb: None,
        report: WriterReport::default(),
    })));
    let text = encoded(&registry);
    assert!(!text.contains("datapath_drops"), "{text}");
    assert!(!text.contains("socket_lb"), "{text}");
    // Without service maps (yet), the ipcache alone.
    assert!(
        text.contains(r#"meshwork_datapath_map_entries{map_name="cilium_ipcache"} 0"#),
        "{text}"
    );
    assert!(!text.contains("cilium_lb4"), "{text}");
}

#[test]
fn regenerations_are_counted_by_outcome_and_timed() {
    let mut registry = Registry::with_prefix("meshwork");
    let metrics = EndpointMetrics::default();
    metrics.register(&mut registry);
    let text = encoded(&registry);
    assert!(
        text.contains(r#"meshwork_endpoint_regenerations_total{outcome="fail"} 0"#),
        "{text}"
    );
    metrics.regenerated(true, Duration::from_millis(3));
    metrics.regenerated(true, Duration::from_millis(40));
    metrics.regenerated(false, Duration::from_secs(2));
    let text = encoded(&registry);
    for line in [
        r#"meshwork_endpoint_regenerations_total{outcome="success"} 2"#,
        r#"meshwork_endpoint_regenerations_total{outcome="fail"} 1"#,
        "# TYPE meshwork_endpoint_regeneration_duration_seconds histogram",
        "meshwork_endpoint_regeneration_duration_seconds_count 3",
        r#"meshwork_endpoint_regeneration_duration_seconds_bucket{le="0.001"} 0"#,
        r#"meshwork_endpoint_regeneration_duration_seconds_bucket{le="0.005"} 1"#,
        r#"meshwork_endpoint_regeneration_duration_seconds_bucket{le="0.05"} 2"#,
        r#"meshwork_endpoint_regeneration_duration_seconds_bucket{le="2.5"} 3"#,
        r#"meshwork_endpoint_regeneration_duration_seconds_bucket{le="10.0"} 3"#,
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
    }
}
