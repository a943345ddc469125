//! Service (lb4) and tunnel maps against real pinned BPF maps: programmed from remote events,
//! acknowledged to the barrier, and restored entries pruned only after the matching wait.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use actix::{Actor, Context, Handler};
use meshwork_agent_core::clustermesh::barrier_actor::{BarrierUpdate, SyncBarrierActor};
use meshwork_agent_core::clustermesh::events::{Change, RemoteEvent, RemoteEvents};
use meshwork_agent_core::clustermesh::remote_state::{RemoteStateActor, Settle};
use meshwork_agent_core::clustermesh::{Resource, SyncBarrier};
use meshwork_agent_core::datapath::lb_writer::LbWriter;
use meshwork_agent_core::datapath::maps::PinDir;
use meshwork_agent_core::datapath::writer_actor::{DatapathWriter, prune_restored_when_synced};
use meshwork_agent_core::types::{
    Address, AddressType, ClusterService, IpPrefix, L4Addr, L4Type, Node,
};
use meshwork_lab::bpffs::BpfRoot;

/// Records barrier updates.
#[derive(Default, Clone)]
struct Acks(Arc<Mutex<Vec<(String, u64)>>>);

impl Actor for Acks {
    type Context = Context<Self>;
}

impl Handler<BarrierUpdate> for Acks {
    type Result = ();
    fn handle(&mut self, msg: BarrierUpdate, _: &mut Context<Self>) {
        if let BarrierUpdate::ServicesProgrammed { cluster, seq } = msg {
            self.0.lock().unwrap().push((cluster, seq));
        }
    }
}

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

/// A batch of cluster `b`.
fn from_b(events: Vec<RemoteEvent>) -> RemoteEvents {
    RemoteEvents {
        cluster: Arc::from("b"),
        events,
    }
}

fn svc_event(seq: u64, s: Arc<ClusterService>) -> RemoteEvent {
    RemoteEvent::Service {
        seq,
        change: Change::Upsert(s),
    }
}

fn node_event(n: Arc<Node>) -> RemoteEvent {
    RemoteEvent::Node {
        change: Change::Upsert(n),
    }
}

fn count(pins: &PinDir, map: &str) -> usize {
    let out = std::process::Command::new("bpftool")
        .args(["map", "dump", "pinned"])
        .arg(pins.map(map))
        .args(["-j"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dump: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    dump.as_array().unwrap().len()
}

#[actix_rt::test]
async fn services_are_acked_after_programming_and_restored_state_waits_for_sync() {
    let root = BpfRoot::new().unwrap();
    let pins = PinDir::under(root.path());
    drop(pins.recreate_ipcache().unwrap());
    let acks = Acks::default();
    let recipient = acks.clone().start().recipient();

    let mut lb = LbWriter::open(&pins, recipient.clone()).unwrap();
    lb.apply(&from_b(vec![
        svc_event(1, service(&["10.214.2.10", "10.214.2.11"])),
        node_event(node("b-1", "10.213.0.2", "10.214.2.0")),
        node_event(node("b-2", "10.213.0.3", "10.214.3.0")),
    ]));
    assert_eq!(
        count(&pins, "cilium_lb4_services_v2"),
        3,
        "master + 2 slots"
    );
    assert_eq!(count(&pins, "cilium_lb4_backends_v3"), 2);
    assert_eq!(count(&pins, "cilium_tunnel_map"), 2);
    drop(lb);

    // A restarted agent: only one backend and one node are known again so far.
    let mut lb = LbWriter::open(&pins, recipient).unwrap();
    lb.apply(&from_b(vec![
        svc_event(1, service(&["10.214.2.10"])),
        node_event(node("b-1", "10.213.0.2", "10.214.2.0")),
    ]));
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
    lb.services_synced();
    assert_eq!(count(&pins, "cilium_lb4_backends_v3"), 1);
    assert_eq!(count(&pins, "cilium_lb4_services_v2"), 2);
    assert_eq!(count(&pins, "cilium_tunnel_map"), 2, "nodes not synced yet");
    lb.nodes_synced();
    assert_eq!(count(&pins, "cilium_tunnel_map"), 1);

    // Each programmed batch acknowledged its cluster's last service event.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while acks.0.lock().unwrap().len() < 2 {
        assert!(std::time::Instant::now() < deadline, "no acks");
        tokio::task::yield_now().await;
    }
    assert_eq!(
        *acks.0.lock().unwrap(),
        vec![("b".to_owned(), 1), ("b".to_owned(), 1)]
    );
}

#[actix_rt::test]
async fn the_agent_prunes_restored_state_only_after_each_mesh_wait() {
    let root = BpfRoot::new().unwrap();
    let pins = PinDir::under(root.path());
    drop(pins.recreate_ipcache().unwrap());
    // What a previous agent left pinned: a service with two backends and two nodes.
    let mut before = LbWriter::open(&pins, Acks::default().start().recipient()).unwrap();
    before.apply(&from_b(vec![
        svc_event(1, service(&["10.214.2.10", "10.214.2.11"])),
        node_event(node("b-1", "10.213.0.2", "10.214.2.0")),
        node_event(node("b-2", "10.213.0.3", "10.214.3.0")),
    ]));
    drop(before);

    // The restarted agent's wiring, against one remote cluster that has not synced yet.
    let mut barrier = SyncBarrier::new(std::time::Duration::from_secs(600));
    barrier.add_cluster("b");
    let barrier = SyncBarrierActor::new(barrier).start();
    let lb = LbWriter::open(&pins, barrier.clone().recipient()).unwrap();
    let writer = DatapathWriter::new(pins.recreate_ipcache().unwrap(), None)
        .with_lb(lb)
        .start();
    let remote = RemoteStateActor::new(barrier.clone().recipient())
        .without_service_acks()
        .with_subscriber(writer.clone().recipient())
        .start();
    prune_restored_when_synced(&writer, &barrier, &remote.clone().recipient());

    // Only one backend and one node are known again so far.
    remote.do_send(from_b(vec![
        svc_event(1, service(&["10.214.2.10"])),
        node_event(node("b-1", "10.213.0.2", "10.214.2.0")),
    ]));
    remote.send(Settle).await.unwrap();
    assert_eq!(
        count(&pins, "cilium_lb4_backends_v3"),
        2,
        "pruned before sync"
    );
    assert_eq!(count(&pins, "cilium_tunnel_map"), 2, "pruned before sync");

    // Nodes sync first: only the tunnel map is pruned.
    barrier.do_send(BarrierUpdate::Synced {
        cluster: "b".to_owned(),
        resource: Resource::Nodes,
    });
    common::eventually("the stale tunnel entry to go", || {
        count(&pins, "cilium_tunnel_map") == 1
    })
    .await;
    assert_eq!(
        count(&pins, "cilium_lb4_backends_v3"),
        2,
        "services not synced"
    );

    // Services sync (the writer acknowledged seq 1): the stale backend goes.
    barrier.do_send(BarrierUpdate::ServicesListDone {
        cluster: "b".to_owned(),
        last_seq: 1,
    });
    common::eventually("the stale backend to go", || {
        count(&pins, "cilium_lb4_backends_v3") == 1
    })
    .await;
    assert_eq!(count(&pins, "cilium_lb4_services_v2"), 2);
}
