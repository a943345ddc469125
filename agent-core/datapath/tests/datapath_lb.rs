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

fn service(backends: &[&str]) -> Arc<ClusterService> {
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
        cluster: "b".to_owned(),
        namespace: "default".to_owned(),
        name: "web".to_owned(),
        frontends: BTreeMap::from([("172.20.0.1".to_owned(), port(80))]),
        backends: backends
            .iter()
            .map(|b| ((*b).to_owned(), port(8080)))
            .collect(),
        shared: true,
        cluster_id: 2,
        ..ClusterService::default()
    })
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
