//! The agent reading every remote through kvstoremesh: one etcd connection (the local one),
//! the cached config's `cached: true`, the cache prefixes, and every wait returning; and a
//! kvstoremesh SIGKILLed and restarted under it, which the agent sees as only the remote's
//! own changes; and the heartbeat kvstoremesh writes for the agents reading the cache.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Contribution, Mesh, Options, connect, init_tracing, load};
use meshwork_clustermesh::remote_cluster::heartbeat::HeartbeatSettings;
use meshwork_clustermesh::{SyncKind, WaitOutcome};
use meshwork_kvstoremesh::service::{KvstoreMesh, Settings};
use meshwork_lab::cilium::{Cluster, Sizes};
use meshwork_lab::etcd::EtcdServer;
use meshwork_lab::kvstoremesh::{KvstoremeshOptions, KvstoremeshProcess};
use prometheus_client::registry::Registry;

const SIZES: Sizes = Sizes {
    nodes: 3,
    services: 2,
    identities: 5,
    ipcache: 20,
};

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn an_agent_syncs_three_remotes_through_kvstoremesh() {
    init_tracing();
    let local = EtcdServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut remotes = Vec::new();
    for id in 1..=3 {
        let cluster = Cluster {
            name: format!("c{id}"),
            id,
            sizes: SIZES,
        };
        let server = EtcdServer::start().unwrap();
        load(&connect(&server).await, &cluster).await.unwrap();
        meshwork_lab::agent::write_cluster_config(dir.path(), &cluster.name, &server.endpoint())
            .unwrap();
        remotes.push(server);
    }
    let mut registry = Registry::default();
    let settings = Settings::new("local", 9, dir.path());
    let kvstoremesh = KvstoreMesh::start(connect(&local).await, settings, &mut registry)
        .await
        .unwrap();

    // Every remote points at the local etcd: the agent reads only the cache.
    let mesh = Mesh::start("local", 9, Duration::from_secs(60)).await;
    for name in ["c1", "c2", "c3"] {
        mesh.add_server(name, &local).await;
    }
    for kind in [SyncKind::Nodes, SyncKind::Services, SyncKind::IpIdentities] {
        assert_eq!(
            mesh.wait(kind, Some(Duration::from_secs(30))).await,
            Ok(WaitOutcome::Synced),
            "{kind}"
        );
    }
    for (id, name) in (1..).zip(["c1", "c2", "c3"]) {
        let status = mesh.status_until(name, "ready", |s| s.ready()).await;
        // kvstoremesh marks its etcd config-required: an early agent waits for the cached
        // config instead of reading the local cluster's own prefixes as the remote's.
        assert!(status.config_required && status.config_retrieved, "{name}");
        assert_eq!(status.cluster_id, id, "{name}: the cached config's ID");
        assert_eq!(
            status.etcd_endpoints,
            local.endpoint(),
            "{name}: only the local etcd"
        );
        assert_eq!(
            (
                status.entries.nodes,
                status.entries.services,
                status.entries.identities,
                status.entries.ipcache
            ),
            (3, 2, 5, 20),
            "{name}: what the remote holds"
        );
        let contributed = mesh.contribution(name).await;
        assert_eq!(
            (contributed.nodes, contributed.services, contributed.ipcache),
            (3, 2, 20)
        );
        assert_eq!(mesh.registered_identities(name).await, 5);
    }
    kvstoremesh.shutdown().await;
}

/// kvstoremesh (the apiserver binary, built beside the agent by the workspace build)
/// caching the remotes of `dir` in `local`.
fn kvstoremesh(local: &EtcdServer, dir: &Path, logs: &Path) -> KvstoremeshOptions {
    let binary =
        Path::new(env!("CARGO_BIN_EXE_meshwork-agent")).with_file_name("meshwork-apiserver");
    assert!(
        binary.exists(),
        "{} is missing: build the workspace",
        binary.display()
    );
    KvstoremeshOptions::new(&binary, ("local", 9), &local.endpoint(), dir, logs).unwrap()
}

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn a_kvstoremesh_sigkill_and_restart_shows_the_agent_only_the_remotes_changes() {
    init_tracing();
    let local = EtcdServer::start().unwrap();
    let (dir, logs) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let c1 = Cluster {
        name: "c1".to_owned(),
        id: 1,
        sizes: SIZES,
    };
    let server = EtcdServer::start().unwrap();
    let remote = connect(&server).await;
    load(&remote, &c1).await.unwrap();
    meshwork_lab::agent::write_cluster_config(dir.path(), "c1", &server.endpoint()).unwrap();
    let options = kvstoremesh(&local, dir.path(), logs.path())
        .with_metrics()
        .unwrap();
    let mut first = KvstoremeshProcess::start(&options, 1).unwrap();

    let mesh = Mesh::start("local", 9, Duration::from_secs(60)).await;
    mesh.add_server("c1", &local).await;
    assert_eq!(
        mesh.wait(SyncKind::IpIdentities, Some(Duration::from_secs(30)))
            .await,
        Ok(WaitOutcome::Synced)
    );
    let before = Contribution {
        nodes: 3,
        services: 2,
        ipcache: 20,
    };
    mesh.contribution_until("c1", before).await;
    let seen_before = mesh.events().await.len();
    let port = options.metrics_port.unwrap();
    let metrics = tokio::task::spawn_blocking(move || meshwork_lab::prometheus::scrape(port))
        .await
        .unwrap()
        .expect("kvstoremesh serves /metrics");
    assert!(
        metrics.contains("meshwork_kvstoremesh_remote_clusters"),
        "{metrics}"
    );
    meshwork_lab::prometheus::assert_promtool_clean(&metrics);

    // While kvstoremesh is dead the remote loses a node and gains a node and an entry.
    first.process().kill();
    let (gone, _) = c1.node(0);
    remote.delete(&gone).await.unwrap();
    let (added, value) = c1.node(7);
    remote.put(&added, value).await.unwrap();
    let (entry, value) = c1.ipcache(99);
    remote.put(&entry, value).await.unwrap();
    let _second = KvstoremeshProcess::start(&options, 2).unwrap();

    mesh.contribution_until(
        "c1",
        Contribution {
            ipcache: 21,
            ..before
        },
    )
    .await;
    let mut changes = mesh.events().await.split_off(seen_before);
    changes.sort();
    assert_eq!(
        changes.len(),
        3,
        "only the remote's three changes: {changes:#?}"
    );
    assert_eq!(changes[1], "node+ c1 c1-node-7", "{changes:#?}");
    assert_eq!(
        changes[2], "node- c1 c1-node-0",
        "no delete of a live entry: {changes:#?}"
    );
    assert!(changes[0].starts_with("ip+ c1 "), "{changes:#?}");
    assert!(mesh.status("c1").await.ready());
}

/// kvstoremesh writes the local etcd's heartbeat, which the agents reading the cache watch
/// as they watch a remote's: with no apiserver on the local etcd, a short
/// `--kvstore-heartbeat-interval` (1 s, the shortest whose heartbeats, written in whole
/// seconds, all differ: stale after 2 s, a reconnect 2.75 s after the last one) holds for
/// seconds.
#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn kvstoremesh_writes_the_heartbeat_agents_reading_the_cache_watch() {
    init_tracing();
    let local = EtcdServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = EtcdServer::start().unwrap();
    let c1 = Cluster {
        name: "c1".to_owned(),
        id: 1,
        sizes: SIZES,
    };
    load(&connect(&server).await, &c1).await.unwrap();
    meshwork_lab::agent::write_cluster_config(dir.path(), "c1", &server.endpoint()).unwrap();
    let mut registry = Registry::default();
    let mut settings = Settings::new("local", 9, dir.path());
    settings.heartbeat = HeartbeatSettings {
        interval: Duration::from_secs(1),
        // The remote itself writes no heartbeat: kvstoremesh must not reconnect to it here.
        max_consecutive_quorum_errors: u32::MAX,
    };
    let kvstoremesh = KvstoreMesh::start(connect(&local).await, settings, &mut registry)
        .await
        .unwrap();

    let options = Options::new("local", 9, Duration::from_secs(60))
        .flag("--enable-bpf-datapath=false")
        .flag("--kvstore-heartbeat-interval=1s");
    let mesh = Mesh::start_with(options).await;
    mesh.add_server("c1", &local).await;
    let ready = mesh.status_until("c1", "ready", |s| s.ready()).await;
    let first = ready.last_heartbeat.expect("kvstoremesh wrote a heartbeat");
    // Written in whole seconds: 6 s later in its own time is at least 5 s in ours.
    let held = mesh
        .status_until("c1", "6 s of kvstoremesh's heartbeats", |s| {
            s.last_heartbeat.is_some_and(|at| {
                at.duration_since(first).unwrap_or_default() >= Duration::from_secs(6)
            })
        })
        .await;
    // An agent early to the cache may have retried for its config before it was ready.
    assert_eq!(
        held.failures, ready.failures,
        "the cache's heartbeat went stale: {held:#?}"
    );
    assert!(held.cached && held.ready());
    kvstoremesh.shutdown().await;
}
