//! What the previous agent left in the service and tunnel maps is pruned only after the
//! mesh-wide wait that guards it: real pinned maps, the agent's own wiring, and real remote
//! etcds whose sync canaries decide when each remote has synced.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Mesh, Options, connect, load};
use meshwork_clustermesh::SyncKind;
use meshwork_clustermesh::barrier_actor::GetClusterWait;
use meshwork_datapath::maps::PinDir;
use meshwork_datapath::remote_maps::{BACKENDS_MAP, RemoteMaps, SERVICES_MAP, TUNNEL_MAP};
use meshwork_kvstore::keys;
use meshwork_lab::bpffs::BpfRoot;
use meshwork_lab::cilium::{Cluster, Sizes};
use meshwork_lab::etcd::EtcdServer;
use meshwork_lab::wait::eventually_async;
use meshwork_types::{Change, Decoder, NodeDecoder, RemoteEvent, ServiceDecoder};

fn cluster(name: &str, id: u32, nodes: u32, services: u32) -> Cluster {
    Cluster {
        name: name.to_owned(),
        id,
        sizes: Sizes {
            nodes,
            services,
            identities: 0,
            ipcache: 0,
        },
    }
}

/// `cluster`'s nodes and services as a store would hand them on.
fn events(cluster: &Cluster) -> Vec<RemoteEvent> {
    let nodes = NodeDecoder::new(&cluster.name, Some(cluster.id));
    let services = ServiceDecoder::new(&cluster.name, Some(cluster.id));
    // Keys as the stores see them: below `<prefix>/<cluster>/`.
    let relative =
        |key: &str, prefix: &str| key[prefix.len() + cluster.name.len() + 2..].to_owned();
    let mut events = Vec::new();
    for i in 0..cluster.sizes.nodes {
        let (key, value) = cluster.node(i);
        let node = nodes
            .decode(&relative(&key, keys::NODES_PREFIX), &value)
            .unwrap();
        events.push(RemoteEvent::Node {
            change: Change::Upsert(Arc::new(node)),
        });
    }
    for i in 0..cluster.sizes.services {
        let (key, value) = cluster.service(i);
        let service = services
            .decode(&relative(&key, keys::SERVICES_PREFIX), &value)
            .unwrap();
        events.push(RemoteEvent::Service {
            change: Change::Upsert(Arc::new(service)),
        });
    }
    events
}

/// Entries of a pinned map, as bpftool sees them.
fn count(pins: &PinDir, map: &str) -> usize {
    meshwork_lab::bpffs::pinned_len(&pins.map(map)).unwrap()
}

/// (services, backends, tunnel) entries pinned now.
fn counts(pins: &PinDir) -> (usize, usize, usize) {
    (
        count(pins, SERVICES_MAP),
        count(pins, BACKENDS_MAP),
        count(pins, TUNNEL_MAP),
    )
}

#[actix_rt::test]
#[ignore = "needs real etcd, root and bpffs: `cargo xtask test` runs it"]
async fn the_agent_prunes_restored_state_only_after_each_mesh_wait() {
    common::init_tracing();
    let root = BpfRoot::new().unwrap();
    let pins = PinDir::under(root.path());
    drop(pins.recreate_ipcache().unwrap());
    // What a previous agent left pinned: b's two services (master + one slot each, one
    // backend each) and b's two nodes.
    let before = cluster("b", 2, 2, 2);
    let mut previous = RemoteMaps::open(&pins).unwrap();
    previous.apply(&Arc::from("b"), &events(&before));
    drop(previous);
    assert_eq!(counts(&pins), (4, 2, 2));

    // Now b has one node and one service left and is synced; c is configured but announces
    // nothing yet, so no mesh-wide wait is over.
    let b = EtcdServer::start().unwrap();
    load(&connect(&b).await, &cluster("b", 2, 1, 1))
        .await
        .unwrap();
    let c = EtcdServer::start().unwrap();
    let c_backend = connect(&c).await;
    let c_cluster = cluster("c", 3, 0, 0);
    let (key, value) = c_cluster.config();
    c_backend.put(&key, value).await.unwrap();
    let config = tempfile::tempdir().unwrap();
    for (name, etcd) in [("b", &b), ("c", &c)] {
        meshwork_lab::agent::write_cluster_config(config.path(), name, &etcd.endpoint()).unwrap();
    }
    let mesh = Mesh::start_with(
        Options::new("local", 9, Duration::from_secs(600))
            .flag(format!("--bpf-root={}", root.path().display()))
            .flag(format!("--clustermesh-config={}", config.path().display())),
    )
    .await;
    for kind in [SyncKind::Nodes, SyncKind::Services] {
        let wait = mesh
            .agent
            .barrier()
            .send(GetClusterWait {
                cluster: "b".to_owned(),
                kind,
            })
            .await
            .unwrap()
            .expect("b is configured");
        tokio::time::timeout(Duration::from_secs(30), wait.wait())
            .await
            .expect("b syncs")
            .unwrap();
    }
    // b's lists are in the maps; what it no longer has stays while c is pending.
    assert_eq!(
        counts(&pins),
        (4, 2, 2),
        "pruned before the mesh-wide waits"
    );

    // c's nodes are announced (none): NodesSynced prunes the tunnel map only.
    let (canary, value) = c_cluster.canary(keys::NODES_PREFIX);
    c_backend.put(&canary, value).await.unwrap();
    eventually_async(
        "the stale tunnel entry to go",
        || std::future::ready(counts(&pins)),
        |&(_, _, tunnel)| tunnel == 1,
    )
    .await;
    assert_eq!(counts(&pins), (4, 2, 1), "services are not synced");

    // c's services are announced: ServicesSynced prunes b's old service and its backend.
    let (canary, value) = c_cluster.canary(keys::SERVICES_PREFIX);
    c_backend.put(&canary, value).await.unwrap();
    eventually_async(
        "the stale service and backend to go",
        || std::future::ready(counts(&pins)),
        |&(services, backends, _)| (services, backends) == (2, 1),
    )
    .await;
    mesh.agent.shutdown().await;
}
