//! The cluster mesh against real etcd servers, one per remote cluster (contract §2–§4).

mod common;

use std::time::Duration;

use common::*;
use meshwork_clustermesh::barrier_actor::GetMeshWait;
use meshwork_clustermesh::{SyncKind, WaitError, WaitOutcome};
use meshwork_kvstore::{EtcdConfig, keys};
use meshwork_lab::cilium::{Cluster, Sizes};
use meshwork_lab::etcd::{Access, EtcdOptions, EtcdServer, EtcdTls};
use meshwork_lab::wait::eventually_async;

const SMALL: Sizes = Sizes {
    nodes: 3,
    services: 2,
    identities: 5,
    ipcache: 20,
};
const ALL: [SyncKind; 3] = [SyncKind::Nodes, SyncKind::Services, SyncKind::IpIdentities];

fn cluster(name: &str, id: u32) -> Cluster {
    Cluster {
        name: name.to_owned(),
        id,
        sizes: SMALL,
    }
}

async fn loaded(name: &str, id: u32) -> EtcdServer {
    let server = EtcdServer::start().unwrap();
    load(&connect(&server).await, &cluster(name, id))
        .await
        .unwrap();
    server
}

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn three_remotes_sync_and_every_wait_returns() {
    init_tracing();
    let mesh = Mesh::start("local", 9, Duration::from_secs(60)).await;
    let servers = [
        loaded("c1", 1).await,
        loaded("c2", 2).await,
        loaded("c3", 3).await,
    ];
    for (i, server) in servers.iter().enumerate() {
        mesh.add_server(&format!("c{}", i + 1), server).await;
    }
    for kind in ALL {
        assert_eq!(
            mesh.wait(kind, Some(Duration::from_secs(30))).await,
            Ok(WaitOutcome::Synced),
            "{kind}"
        );
    }
    for name in ["c1", "c2", "c3"] {
        let status = mesh.status_until(name, "ready", |s| s.ready()).await;
        assert_eq!(status.entries.nodes, 3);
        assert_eq!(status.entries.services, 2);
        assert_eq!(status.entries.identities, 5);
        assert_eq!(status.entries.ipcache, 20);
        assert!(status.config_retrieved);
        let contributed = mesh.contribution(name).await;
        assert_eq!(
            (contributed.nodes, contributed.services, contributed.ipcache),
            (3, 2, 20)
        );
    }
}

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn zero_remotes_return_at_once() {
    let mesh = Mesh::start("local", 1, Duration::from_secs(60)).await;
    for kind in ALL {
        assert_eq!(
            mesh.wait(kind, Some(Duration::from_millis(100))).await,
            Ok(WaitOutcome::Synced)
        );
    }
}

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn a_remote_removed_before_it_synced_releases_the_waits_and_removal_drains() {
    init_tracing();
    let mesh = Mesh::start("local", 9, Duration::from_secs(60)).await;
    let synced = loaded("c1", 1).await;
    mesh.add_server("c1", &synced).await;
    // c2 announces canaries but never writes them: it never syncs.
    let stuck = EtcdServer::start().unwrap();
    let backend = connect(&stuck).await;
    let (key, value) = cluster("c2", 2).config();
    backend.put(&key, value).await.unwrap();
    backend
        .put_many(cluster("c2", 2).state(), 100)
        .await
        .unwrap();
    mesh.add_server("c2", &stuck).await;
    mesh.status_until("c1", "c1 ready", |s| s.ready()).await;

    let waiting = tokio::spawn({
        let wait = mesh
            .agent
            .barrier()
            .send(GetMeshWait::all(SyncKind::IpIdentities));
        async move { wait.await.unwrap().wait(None).await }
    });
    mesh.status_until("c2", "c2 connected", |s| s.connected && s.config_retrieved)
        .await;
    assert!(!waiting.is_finished(), "c2 has not synced");
    mesh.remove("c2").await;
    let outcome = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("released at once")
        .unwrap();
    assert_eq!(outcome, Ok(WaitOutcome::Synced));

    // Removing a synced cluster drains everything it contributed.
    assert_eq!(mesh.contribution("c1").await.ipcache, 20);
    mesh.remove("c1").await;
    eventually_async("c1 drained", || mesh.contribution("c1"), |c| c.ipcache == 0).await;
    let drained = mesh.contribution("c1").await;
    assert_eq!((drained.nodes, drained.services), (0, 0));
}

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn the_breaker_fires_when_a_remote_stops_mid_sync_and_the_state_converges_after() {
    init_tracing();
    let mesh = Mesh::start("local", 9, Duration::from_secs(2)).await;
    let mut etcd = EtcdServer::start().unwrap();
    let backend = connect(&etcd).await;
    let c1 = cluster("c1", 1);
    let (key, value) = c1.config();
    backend.put(&key, value).await.unwrap();
    backend.put_many(c1.state(), 100).await.unwrap();
    // Only the nodes are announced complete before etcd goes away.
    let (canary, value) = c1.canary(keys::NODES_PREFIX);
    backend.put(&canary, value).await.unwrap();
    mesh.add_server("c1", &etcd).await;
    mesh.status_until("c1", "nodes synced", |s| s.listed.nodes)
        .await;
    etcd.stop();

    let started = tokio::time::Instant::now();
    let outcome = mesh.wait(SyncKind::IpIdentities, None).await;
    assert_eq!(
        outcome,
        Ok(WaitOutcome::BreakerFired {
            pending: vec!["c1".to_owned()]
        })
    );
    assert!(started.elapsed() >= Duration::from_secs(2));
    let status = mesh
        .status_until("c1", "the failure is counted", |s| s.failures > 0)
        .await;
    assert!(!status.ready() && status.last_error.is_some() && status.last_failure.is_some());

    // etcd comes back: a node is gone meanwhile, the rest is announced. The stale node is
    // deleted, nothing else is lost.
    etcd.restart().unwrap();
    let backend = connect(&etcd).await;
    backend.delete(&c1.node(0).0).await.unwrap();
    backend.put_many(c1.canaries(), 100).await.unwrap();
    let status = mesh.status_until("c1", "ready again", |s| s.ready()).await;
    assert_eq!(status.entries.nodes, 2);
    assert_eq!(status.entries.ipcache, 20);
    eventually_async(
        "the node delete reached the state",
        || mesh.contribution("c1"),
        |c| c.nodes == 2,
    )
    .await;
    assert_eq!(
        mesh.wait(SyncKind::IpIdentities, Some(Duration::from_secs(10)))
            .await,
        Ok(WaitOutcome::Synced)
    );
}

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn a_caller_that_gives_up_first_gets_an_error() {
    let mesh = Mesh::start("local", 9, Duration::from_secs(60)).await;
    let never = EtcdServer::start().unwrap();
    let backend = connect(&never).await;
    let (key, value) = cluster("c1", 1).config();
    backend.put(&key, value).await.unwrap();
    mesh.add_server("c1", &never).await;
    let outcome = mesh
        .wait(SyncKind::Nodes, Some(Duration::from_millis(500)))
        .await;
    assert!(
        matches!(
            outcome,
            Err(WaitError::CallerDeadline {
                kind: SyncKind::Nodes,
                ..
            })
        ),
        "{outcome:?}"
    );
}

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn a_duplicate_cluster_id_keeps_the_second_cluster_not_ready() {
    init_tracing();
    let mesh = Mesh::start("local", 9, Duration::from_secs(60)).await;
    let first = loaded("c1", 5).await;
    let second = loaded("c2", 5).await;
    let local = loaded("c3", 9).await;
    mesh.add_server("c1", &first).await;
    mesh.status_until("c1", "c1 ready", |s| s.ready()).await;
    mesh.add_server("c2", &second).await;
    mesh.add_server("c3", &local).await;
    let c2 = mesh
        .status_until("c2", "the duplicate is reported", |s| {
            s.last_error.as_deref() == Some("clusterID 5 is already used")
        })
        .await;
    assert!(!c2.ready());
    let c3 = mesh
        .status_until("c3", "the local ID is refused", |s| {
            s.last_error.as_deref() == Some("clusterID 9 is already used")
        })
        .await;
    assert!(!c3.ready());
    assert!(mesh.status("c1").await.ready());
    // Once c1 is gone, c2 gets the ID on its next try.
    mesh.remove("c1").await;
    mesh.status_until("c2", "c2 ready after c1 left", |s| s.ready())
        .await;
}

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn entries_claiming_another_cluster_or_out_of_range_are_rejected_and_counted() {
    init_tracing();
    let metrics_port = meshwork_lab::wait::free_port().unwrap();
    let mesh = Mesh::start_with(
        Options::new("local", 9, Duration::from_secs(60))
            .flag("--enable-bpf-datapath=false")
            .flag(format!("--prometheus-serve-addr=127.0.0.1:{metrics_port}")),
    )
    .await;
    let etcd = loaded("c1", 1).await;
    let backend = connect(&etcd).await;
    // Under c1's prefixes, but claiming cluster c2 / ID 2 / an identity of cluster 2.
    backend
        .put(
            "cilium/state/nodes/v1/c1/intruder",
            r#"{"Name":"intruder","Cluster":"c2","ClusterID":1}"#,
        )
        .await
        .unwrap();
    backend
        .put(
            "cilium/state/nodes/v1/c1/wrong-id",
            r#"{"Name":"wrong-id","Cluster":"c1","ClusterID":2}"#,
        )
        .await
        .unwrap();
    backend
        .put(
            "cilium/state/identities/v1/id/131328",
            "k8s:app=x;k8s:io.cilium.k8s.policy.cluster=c1;",
        )
        .await
        .unwrap();
    backend
        .put(
            "cilium/state/ip/v1/default/10.99.0.1",
            r#"{"IP":"10.99.0.1","HostIP":"10.101.0.1","ID":131328}"#,
        )
        .await
        .unwrap();
    backend
        .put(
            "cilium/state/services/v1/c1/default/evil",
            r#"{"cluster":"c2","namespace":"default","name":"evil","shared":true,"clusterID":1}"#,
        )
        .await
        .unwrap();
    mesh.add_server("c1", &etcd).await;
    let status = mesh.status_until("c1", "ready", |s| s.ready()).await;
    assert_eq!(
        (
            status.entries.nodes,
            status.entries.identities,
            status.entries.ipcache,
            status.entries.services
        ),
        (3, 5, 20, 2)
    );
    let contributed = mesh.contribution("c1").await;
    assert_eq!(
        (contributed.nodes, contributed.services, contributed.ipcache),
        (3, 2, 20)
    );
    // Blocking I/O off this test's single thread, which also serves the metrics.
    let encoded = tokio::task::spawn_blocking(move || prometheus::scrape(metrics_port))
        .await
        .unwrap()
        .expect("the agent serves /metrics");
    let rejected: f64 = encoded
        .lines()
        .filter(|l| l.starts_with("meshwork_kvstore_decode_errors_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert_eq!(rejected, 5.0, "{encoded}");
}

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn tls_with_a_read_only_user_works_and_a_wrong_ca_is_a_clear_status_error() {
    init_tracing();
    let mesh = Mesh::start("local", 9, Duration::from_secs(60)).await;
    let etcd = EtcdServer::start_with(EtcdOptions {
        tls: true,
        ..EtcdOptions::default()
    })
    .unwrap();
    let tls = etcd.tls().unwrap().clone();
    let root = etcd.add_user("loader", "", Access::ReadWrite).unwrap();
    let loader = meshwork_kvstore::EtcdBackend::connect(
        &EtcdConfig {
            endpoints: vec![etcd.endpoint()],
            trusted_ca_file: Some(tls.ca_file.clone()),
            cert_file: Some(root.cert_file),
            key_file: Some(root.key_file),
        },
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    load(&loader, &cluster("c1", 1)).await.unwrap();
    let remote = etcd.add_user("remote", "cilium/", Access::Read).unwrap();
    let good = EtcdConfig {
        endpoints: vec![etcd.endpoint()],
        trusted_ca_file: Some(tls.ca_file.clone()),
        cert_file: Some(remote.cert_file.clone()),
        key_file: Some(remote.key_file.clone()),
    };
    mesh.add("c1", good).await;
    mesh.status_until("c1", "ready over TLS as a read-only user", |s| s.ready())
        .await;

    let other = tempfile::tempdir().unwrap();
    let wrong = EtcdConfig {
        endpoints: vec![etcd.endpoint()],
        trusted_ca_file: Some(EtcdTls::foreign_ca(other.path()).unwrap()),
        cert_file: Some(remote.cert_file),
        key_file: Some(remote.key_file),
    };
    mesh.add("c2", wrong).await;
    let status = mesh
        .status_until("c2", "a connect error", |s| {
            s.last_error.is_some() && s.failures > 0
        })
        .await;
    assert!(!status.ready() && !status.connected);
    assert!(
        status
            .last_error
            .as_deref()
            .unwrap()
            .contains(&etcd.endpoint()),
        "{status:?}"
    );
}
