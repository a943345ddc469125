//! The datapath's series on a real agent's `/metrics`: the binary with its BPF datapath, a
//! restored endpoint attached in lab namespaces, a real remote etcd, and packets the endpoint
//! program drops; the scrape counts what happened and `promtool check metrics` accepts it.

mod common;
use common::binaries::agent_binary;
use common::prometheus;

use std::net::IpAddr;
use std::time::Duration;

use meshwork_datapath::endpoint::{EndpointSpec, EndpointStore};
use meshwork_lab::agent::{AgentOptions, AgentProcess, write_cluster_config};
use meshwork_lab::bpffs::BpfRoot;
use meshwork_lab::etcd::EtcdServer;
use meshwork_lab::net::LabNet;
use meshwork_lab::wait::{self, Wait};

const POD_IP: &str = "10.214.7.10";
const GATEWAY: &str = "10.214.7.1";
/// In no ipcache entry: dropped as `unknown_destination`.
const UNKNOWN: &str = "10.214.99.99";
/// One of c2's ipcache entries (`meshwork_lab::cilium`: its entry 1), whose identity the pod
/// may not reach: dropped as `policy_denied`.
const DENIED: &str = "10.2.0.1";

/// The value of the sample `series` (name and labels, exactly as encoded).
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// A scrape (empty while nothing serves) and the samples of `series` in it.
fn scrape_samples(port: u16, series: &[&str]) -> (String, Vec<Option<f64>>) {
    let metrics = prometheus::scrape(port).unwrap_or_default();
    let values = series.iter().map(|s| sample(&metrics, s)).collect();
    (metrics, values)
}

#[test]
#[ignore = "needs real etcd, root, bpffs, network namespaces and promtool: `cargo xtask test` runs it"]
fn datapath_series_count_regenerations_map_entries_and_real_drops() {
    // The pod: its address, a default route through a gateway that is never asked for (a
    // permanent neighbour), so its packets reach the endpoint program on the node's lxc1.
    let lab = LabNet::new().unwrap();
    let node = lab.netns("dpm-node").unwrap();
    let pod = lab.netns("dpm-pod").unwrap();
    node.veth_to("lxc1", &pod, "eth0").unwrap();
    pod.add_addr("eth0", &format!("{POD_IP}/24")).unwrap();
    pod.ip(&[
        "neigh",
        "add",
        GATEWAY,
        "lladdr",
        "02:00:00:00:00:01",
        "dev",
        "eth0",
        "nud",
        "permanent",
    ])
    .unwrap();
    pod.add_route_via("default", GATEWAY).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    EndpointStore::new(&state)
        .save(&EndpointSpec {
            id: 1,
            interface: "lxc1".to_owned(),
            netns: Some(node.path().to_owned()),
            ips: vec![POD_IP.parse().unwrap()],
            identity: 1001,
            allowed_identities: vec![2000],
            host: false,
            labels: Vec::new(),
            pod: None,
        })
        .unwrap();
    // c2: 10 ipcache entries, one global service with one backend, two nodes.
    let remote = EtcdServer::start().unwrap();
    let c2 = common::small_c2();
    assert!(
        c2.ipcache(1).0.ends_with(&format!("/{DENIED}")),
        "DENIED is c2's entry"
    );
    common::load_blocking(&remote, &c2);
    let config = dir.path().join("clustermesh");
    write_cluster_config(&config, &c2.name, &remote.endpoint()).unwrap();
    let bpf = BpfRoot::new().unwrap();
    let port = wait::free_port().unwrap();
    let options = AgentOptions::new(agent_binary(), "c1", 1, &state)
        .clustermesh_config(&config)
        .bpf_root(bpf.path())
        .metrics_port(port);
    let agent = AgentProcess::start(&options).unwrap();

    // The restored endpoint regenerates once c2's entries are in the map.
    let expected = [
        (
            r#"meshwork_endpoint_regenerations_total{outcome="success"}"#,
            1.0,
        ),
        (
            r#"meshwork_endpoint_regenerations_total{outcome="fail"}"#,
            0.0,
        ),
        ("meshwork_endpoint_regeneration_duration_seconds_count", 1.0),
        // c2's 10 entries and the pod's own.
        (
            r#"meshwork_datapath_map_entries{map_name="cilium_ipcache"}"#,
            11.0,
        ),
        // The service's master and its one slot; its backend; its rev-NAT entry.
        (
            r#"meshwork_datapath_map_entries{map_name="cilium_lb4_services_v2"}"#,
            2.0,
        ),
        (
            r#"meshwork_datapath_map_entries{map_name="cilium_lb4_backends_v3"}"#,
            1.0,
        ),
        (
            r#"meshwork_datapath_map_entries{map_name="cilium_lb4_reverse_nat"}"#,
            1.0,
        ),
        // c2's two nodes' pod CIDRs.
        (
            r#"meshwork_datapath_map_entries{map_name="cilium_tunnel_map"}"#,
            2.0,
        ),
        (
            r#"meshwork_datapath_map_errors_total{map_name="cilium_ipcache"}"#,
            0.0,
        ),
        (
            r#"meshwork_datapath_ipcache_rejections_total{reason="zero_identity"}"#,
            0.0,
        ),
        // Socket-LB is off: its counters exist and count nothing.
        (
            r#"meshwork_socket_lb_translations_total{hook="connect4"}"#,
            0.0,
        ),
        ("meshwork_socket_lb_refusals_total", 0.0),
        (r#"meshwork_datapath_drops_total{reason="malformed"}"#, 0.0),
    ];
    let series: Vec<&str> = expected.iter().map(|(s, _)| *s).collect();
    let want: Vec<Option<f64>> = expected.iter().map(|(_, v)| Some(*v)).collect();
    let (metrics, _) = Wait::new("the endpoint regenerated onto c2's entries, as scraped")
        .timeout(Duration::from_secs(60))
        .every(Duration::from_millis(100))
        .until(
            || scrape_samples(port, &series),
            |(_, values)| *values == want,
        )
        .unwrap_or_else(|err| panic!("{err}; log:\n{}", agent.log_tail()));
    let took = sample(
        &metrics,
        "meshwork_endpoint_regeneration_duration_seconds_sum",
    )
    .unwrap();
    assert!(took > 0.0 && took < 10.0, "{took} s:\n{metrics}");

    // One SYN out of the pod to each, dropped by the program the regeneration attached (the
    // attempt ends before the first retransmission; nothing else the pod sends is IPv4).
    for dest in [UNKNOWN, DENIED] {
        let dest: IpAddr = dest.parse().unwrap();
        assert!(!pod.can_reach(dest, Duration::from_millis(200)).unwrap());
    }
    let drops = [
        r#"meshwork_datapath_drops_total{reason="unknown_destination"}"#,
        r#"meshwork_datapath_drops_total{reason="policy_denied"}"#,
    ];
    let (metrics, _) = Wait::new("one drop of each, as scraped")
        .until(
            || scrape_samples(port, &drops),
            |(_, values)| values.iter().all(|v| *v == Some(1.0)),
        )
        .unwrap_or_else(|err| panic!("{err}"));
    prometheus::assert_promtool_clean(&metrics);
}
