//! Service (lb4) and tunnel maps against real pinned BPF maps: programmed from remote events,
//! and restored entries pruned only after the matching wait.

use std::collections::BTreeMap;
use std::sync::Arc;

use meshwork_datapath::maps::PinDir;
use meshwork_datapath::remote_maps::RemoteMaps;
use meshwork_lab::bpffs::BpfRoot;
use meshwork_types::{
    Address, AddressType, Change, ClusterService, IpPrefix, L4Addr, L4Type, Node, RemoteEvent,
    SyncKind,
};

/// Cluster b's global `web` on 172.20.0.1:80.
fn service(backends: &[&str]) -> Arc<ClusterService> {
    announced("b", 2, "web", "172.20.0.1", true, backends)
}

fn node(name: &str, ip: &str, cidr: &str) -> Arc<Node> {
    Arc::new(Node {
        name: name.to_owned(),
        cluster: "b".to_owned(),
        ip_addresses: vec![Address {
            address_type: AddressType::InternalIp,
            ip: Some(ip.parse().unwrap()),
        }],
        ipv4_alloc_cidr: Some(IpPrefix::new(cidr.parse().unwrap(), 24).unwrap()),
        cluster_id: 2,
        ..Node::default()
    })
}

fn svc_event(s: Arc<ClusterService>) -> RemoteEvent {
    RemoteEvent::Service {
        change: Change::Upsert(s),
    }
}

fn node_event(n: Arc<Node>) -> RemoteEvent {
    RemoteEvent::Node {
        change: Change::Upsert(n),
    }
}

fn count(pins: &PinDir, map: &str) -> usize {
    meshwork_lab::bpffs::pinned_len(&pins.map(map)).unwrap()
}

#[test]
#[ignore = "needs root and bpffs: `cargo xtask test` runs it"]
fn services_and_nodes_are_programmed_and_restored_state_waits_for_sync() {
    let root = BpfRoot::new().unwrap();
    let pins = PinDir::under(root.path());
    drop(pins.recreate_ipcache().unwrap());
    let b: Arc<str> = Arc::from("b");

    let mut lb = RemoteMaps::open(&pins).unwrap();
    lb.apply(
        &b,
        &[
            svc_event(service(&["10.214.2.10", "10.214.2.11"])),
            node_event(node("b-1", "10.213.0.2", "10.214.2.0")),
            node_event(node("b-2", "10.213.0.3", "10.214.3.0")),
        ],
    );
    assert_eq!(
        count(&pins, "cilium_lb4_services_v2"),
        3,
        "master + 2 slots"
    );
    assert_eq!(count(&pins, "cilium_lb4_backends_v3"), 2);
    assert_eq!(count(&pins, "cilium_tunnel_map"), 2);
    drop(lb);

    // A restarted agent: only one backend and one node are known again so far.
    let mut lb = RemoteMaps::open(&pins).unwrap();
    lb.apply(
        &b,
        &[
            svc_event(service(&["10.214.2.10"])),
            node_event(node("b-1", "10.213.0.2", "10.214.2.0")),
        ],
    );
    assert_eq!(
        count(&pins, "cilium_lb4_backends_v3"),
        2,
        "the restored backend stays before ServicesSynced"
    );
    assert_eq!(
        count(&pins, "cilium_tunnel_map"),
        2,
        "restored tunnel entry stays"
    );
    lb.synced(SyncKind::Services);
    assert_eq!(count(&pins, "cilium_lb4_backends_v3"), 1);
    assert_eq!(count(&pins, "cilium_lb4_services_v2"), 2);
    assert_eq!(count(&pins, "cilium_tunnel_map"), 2, "nodes not synced yet");
    lb.synced(SyncKind::Nodes);
    assert_eq!(count(&pins, "cilium_tunnel_map"), 1);
}

/// What the pinned lb4 maps hold, read with aya: each frontend (`vip:port`) with the backend
/// addresses its slots name (slot order), and every backend's address.
fn lb_content(pins: &PinDir) -> (BTreeMap<String, Vec<String>>, Vec<String>) {
    use aya::maps::{HashMap as BpfHashMap, Map, MapData};
    use meshwork_datapath::services::{Lb4Backend, Lb4Key, Lb4Service};
    let open = |name: &str| Map::from_map_data(MapData::from_pin(pins.map(name)).unwrap()).unwrap();
    let services: BpfHashMap<_, Lb4Key, Lb4Service> =
        BpfHashMap::try_from(open("cilium_lb4_services_v2")).unwrap();
    let backends: BpfHashMap<_, u32, Lb4Backend> =
        BpfHashMap::try_from(open("cilium_lb4_backends_v3")).unwrap();
    let addr = |b: &Lb4Backend| {
        format!(
            "{}:{}",
            std::net::Ipv4Addr::from(b.address),
            u16::from_be_bytes(b.port)
        )
    };
    let by_id: BTreeMap<u32, Lb4Backend> = backends.iter().map(Result::unwrap).collect();
    let mut frontends: BTreeMap<String, Vec<(u16, String)>> = BTreeMap::new();
    for (key, value) in services.iter().map(Result::unwrap) {
        let vip = format!(
            "{}:{}",
            std::net::Ipv4Addr::from(key.address),
            u16::from_be_bytes(key.dport)
        );
        let slots = frontends.entry(vip).or_default();
        if key.backend_slot != 0 {
            let backend = by_id
                .get(&value.backend_id)
                .map_or_else(|| format!("missing #{}", value.backend_id), addr);
            slots.push((key.backend_slot, backend));
        }
    }
    let frontends = frontends
        .into_iter()
        .map(|(vip, mut slots)| {
            slots.sort();
            (vip, slots.into_iter().map(|(_, b)| b).collect())
        })
        .collect();
    let mut all: Vec<String> = by_id.values().map(addr).collect();
    all.sort();
    (frontends, all)
}

/// A service of `cluster` (ID `id`) on port 80 of `vip`, backends on 8080.
fn announced(
    cluster: &str,
    id: u32,
    name: &str,
    vip: &str,
    shared: bool,
    backends: &[&str],
) -> Arc<ClusterService> {
    let port = |p| {
        BTreeMap::from([(
            "http".to_owned(),
            L4Addr {
                protocol: L4Type::Tcp,
                port: p,
            },
        )])
    };
    Arc::new(ClusterService {
        cluster: cluster.to_owned(),
        namespace: "default".to_owned(),
        name: name.to_owned(),
        frontends: BTreeMap::from([(vip.to_owned(), port(80))]),
        backends: backends
            .iter()
            .map(|b| ((*b).to_owned(), port(8080)))
            .collect(),
        shared,
        cluster_id: id,
        ..ClusterService::default()
    })
}

#[test]
#[ignore = "needs root and bpffs: `cargo xtask test` runs it"]
fn restored_services_are_pruned_in_two_passes_local_ones_first_global_ones_after_services_synced() {
    let root = BpfRoot::new().unwrap();
    let pins = PinDir::under(root.path());
    drop(pins.recreate_ipcache().unwrap());
    let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
    // a's own `web` (not shared), a's global `api` with b's announcement of it, and b's
    // global `echo`.
    let local = |web: &[&str]| {
        vec![
            announced("a", 1, "web", "172.20.1.1", false, web),
            announced("a", 1, "api", "172.20.1.2", true, &["10.214.1.20"]),
        ]
    };
    let remote = |api: &[&str], echo: &[&str]| {
        [
            svc_event(announced("b", 2, "api", "172.20.2.2", true, api)),
            svc_event(announced("b", 2, "echo", "172.20.2.3", true, echo)),
        ]
    };
    let mut lb = RemoteMaps::open(&pins).unwrap();
    lb.expect_local_services();
    lb.apply_local(&a, 1, local(&["10.214.1.10", "10.214.1.11"]));
    lb.apply(&b, &remote(&["10.214.2.20"], &["10.214.2.30"]));
    let before = lb_content(&pins);
    assert_eq!(
        before.0,
        BTreeMap::from([
            (
                "172.20.1.1:80".to_owned(),
                vec!["10.214.1.10:8080".to_owned(), "10.214.1.11:8080".to_owned()]
            ),
            // A global service: every cluster's backends behind each cluster's frontend.
            (
                "172.20.1.2:80".to_owned(),
                vec!["10.214.1.20:8080".to_owned(), "10.214.2.20:8080".to_owned()]
            ),
            (
                "172.20.2.2:80".to_owned(),
                vec!["10.214.1.20:8080".to_owned(), "10.214.2.20:8080".to_owned()]
            ),
            (
                "172.20.2.3:80".to_owned(),
                vec!["10.214.2.30:8080".to_owned()]
            ),
        ])
    );
    drop(lb);

    // The agent restarts; b is late. Nothing is pruned before the local state is known, not
    // even after ServicesSynced (the breaker): a's services would go with it.
    let mut lb = RemoteMaps::open(&pins).unwrap();
    lb.expect_local_services();
    lb.synced(SyncKind::Services);
    assert_eq!(lb_content(&pins), before, "pruned before the local state");

    // Started again (the breaker already fired above, so this start shows the passes one by
    // one). The first pass: a's services are known (web lost 10.214.1.11). Its stale slot
    // and the local backend nothing names any more go; everything b contributed stays.
    let mut lb = RemoteMaps::open(&pins).unwrap();
    lb.expect_local_services();
    lb.apply_local(&a, 1, local(&["10.214.1.10"]));
    let first = lb_content(&pins);
    assert_eq!(first.0["172.20.1.1:80"], ["10.214.1.10:8080"]);
    assert!(
        !first.1.contains(&"10.214.1.11:8080".to_owned()),
        "{first:?}"
    );
    assert_eq!(
        first.0["172.20.2.3:80"],
        ["10.214.2.30:8080"],
        "b's echo stays"
    );
    assert!(
        first.1.contains(&"10.214.2.20:8080".to_owned()),
        "b's api backend stays"
    );
    assert!(
        first.0["172.20.2.2:80"].contains(&"10.214.2.20:8080".to_owned()),
        "b's frontend keeps its restored slots: {first:?}"
    );

    // The second pass, once b is synced too (ServicesSynced by the breaker, b still late):
    // b's echo and b's backends go; a's global api keeps its own backend.
    lb.synced(SyncKind::Services);
    let second = lb_content(&pins);
    assert_eq!(
        second.0,
        BTreeMap::from([
            (
                "172.20.1.1:80".to_owned(),
                vec!["10.214.1.10:8080".to_owned()]
            ),
            (
                "172.20.1.2:80".to_owned(),
                vec!["10.214.1.20:8080".to_owned()]
            ),
        ])
    );
    assert_eq!(second.1, ["10.214.1.10:8080", "10.214.1.20:8080"]);

    // b arrives late: its backends join a's global frontend as they come.
    lb.apply(&b, &remote(&["10.214.2.21"], &["10.214.2.30"]));
    let late = lb_content(&pins);
    assert_eq!(
        late.0["172.20.1.2:80"],
        ["10.214.1.20:8080", "10.214.2.21:8080"]
    );
    assert_eq!(late.0["172.20.2.3:80"], ["10.214.2.30:8080"]);
}
