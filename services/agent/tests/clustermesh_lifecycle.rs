//! The life of a remote cluster against real etcd servers (contract §2–§4): config changes,
//! invalid config files, cluster ID changes, reconnects, agent shutdown, capabilities, required configs and the
//! 511-cluster mode.

mod common;

use std::ops::Deref;
use std::time::Duration;

use common::*;
use meshwork_clustermesh::barrier_actor::GetMeshWait;
use meshwork_clustermesh::config_dir::ClusterConfigEvent;
use meshwork_clustermesh::mesh::ShutdownMesh;
use meshwork_clustermesh::status::{ClusterStatus, ListedFlags};
use meshwork_clustermesh::{SyncKind, WaitError, WaitOutcome};
use meshwork_kvstore::keys;
use meshwork_lab::cilium::{Cluster, Sizes};
use meshwork_lab::etcd::EtcdServer;
use meshwork_lab::wait::eventually_async;

const SMALL: Sizes = Sizes {
    nodes: 3,
    services: 2,
    identities: 5,
    ipcache: 20,
};
const ALL: [SyncKind; 3] = [SyncKind::Nodes, SyncKind::Services, SyncKind::IpIdentities];
/// How long a wait that must return at once may take.
const AT_ONCE: Duration = Duration::from_millis(500);
/// What `Harness::contribution_until` compares: nodes, services, ipcache entries.
type Counts = (usize, usize, usize);

fn cluster(name: &str, id: u32) -> Cluster {
    Cluster {
        name: name.to_owned(),
        id,
        sizes: SMALL,
    }
}

/// A cluster config with exactly the given capabilities.
fn config_json(id: u32, synced_canaries: bool, cached: bool, max_connected: u32) -> Vec<u8> {
    let mut capabilities = serde_json::Map::new();
    if synced_canaries {
        capabilities.insert("syncedCanaries".into(), true.into());
    }
    if cached {
        capabilities.insert("cached".into(), true.into());
    }
    capabilities.insert("maxConnectedClusters".into(), max_connected.into());
    serde_json::json!({"id": id, "capabilities": capabilities})
        .to_string()
        .into_bytes()
}

/// An etcd holding `cluster`'s config, state and canaries.
async fn loaded(cluster: &Cluster) -> EtcdServer {
    let server = EtcdServer::start().unwrap();
    load(&connect(&server).await, cluster).await.unwrap();
    server
}

/// The key of a state entry below the prefix its store watches (what events carry).
fn ipcache_key(full: &str) -> &str {
    full.strip_prefix(keys::IPCACHE_DEFAULT_PREFIX)
        .and_then(|k| k.strip_prefix('/'))
        .unwrap_or_else(|| panic!("{full} is not an ipcache key"))
}

/// The test agent of `common`, with a chosen `--max-connected-clusters`.
struct Harness {
    mesh: Mesh,
}

impl Deref for Harness {
    type Target = Mesh;

    fn deref(&self) -> &Mesh {
        &self.mesh
    }
}

impl Harness {
    /// Starts the agent (inside an actix system) for local cluster `local` with ID 9.
    async fn start(max_connected_clusters: u32) -> Self {
        let options = Options::new("local", 9, Duration::from_secs(60))
            .flag("--enable-bpf-datapath=false")
            .flag(format!("--max-connected-clusters={max_connected_clusters}"));
        Self {
            mesh: Mesh::start_with(options).await,
        }
    }

    /// The events after the first `from`, sorted.
    async fn events_since(&self, from: usize) -> Vec<String> {
        let mut events = self.events().await.split_off(from);
        events.sort();
        events
    }

    async fn counts(&self, cluster: &str) -> Counts {
        let c = self.contribution(cluster).await;
        (c.nodes, c.services, c.ipcache)
    }

    async fn contribution_until(&self, cluster: &str, expected: Counts) {
        let (nodes, services, ipcache) = expected;
        self.mesh
            .contribution_until(
                cluster,
                Contribution {
                    nodes,
                    services,
                    ipcache,
                },
            )
            .await;
    }

    async fn identities_until(&self, cluster: &str, expected: usize) {
        eventually_async(
            &format!("{cluster} registers {expected} identities"),
            || self.registered_identities(cluster),
            |n| *n == expected,
        )
        .await;
    }

    async fn assert_all_waits_synced_at_once(&self) {
        for kind in ALL {
            assert_eq!(
                self.wait(kind, Some(AT_ONCE)).await,
                Ok(WaitOutcome::Synced),
                "{kind}"
            );
        }
    }
}

fn entries(status: &ClusterStatus) -> (u64, u64, u64, u64) {
    let e = status.entries;
    (e.nodes, e.services, e.identities, e.ipcache)
}

fn error_contains(status: &ClusterStatus, needle: &str) -> bool {
    status
        .last_error
        .as_deref()
        .is_some_and(|e| e.contains(needle))
}

/// `cluster` connected through `etcd`, ready, with the full SMALL fixture contributed.
async fn synced(h: &Harness, cluster: &Cluster, etcd: &EtcdServer) {
    h.add_server(&cluster.name, etcd).await;
    let status = h
        .status_until(&cluster.name, "ready", ClusterStatus::ready)
        .await;
    assert_eq!(entries(&status), (3, 2, 5, 20));
    h.contribution_until(&cluster.name, (3, 2, 20)).await;
    h.identities_until(&cluster.name, 5).await;
    h.assert_all_waits_synced_at_once().await;
}

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn a_config_change_reconnects_the_same_cluster_without_losing_data() {
    init_tracing();
    let h = Harness::start(255).await;
    let c1 = cluster("c1", 1);
    let a = loaded(&c1).await;
    synced(&h, &c1, &a).await;

    // B holds the same cluster without node 0 and with one more ipcache entry; it announces
    // its prefixes only later.
    let b = EtcdServer::start().unwrap();
    let backend = connect(&b).await;
    let (key, value) = c1.config();
    backend.put(&key, value).await.unwrap();
    let gone = c1.node(0).0;
    backend
        .put_many(c1.state().into_iter().filter(|(k, _)| *k != gone), 100)
        .await
        .unwrap();
    let (extra, value) = c1.ipcache(SMALL.ipcache);
    backend.put(&extra, value).await.unwrap();
    let mark = h.events().await.len();

    h.add_server("c1", &b).await;
    let status = h
        .status_until("c1", "connected to B", |s| {
            s.etcd_endpoints == b.endpoint() && s.connected
        })
        .await;
    assert!(
        !status.ready(),
        "B has not announced its prefixes: {status:#?}"
    );
    // The latches belong to the cluster object: they stay done while it reconnects.
    h.assert_all_waits_synced_at_once().await;
    assert_eq!(h.counts("c1").await, (3, 2, 20), "nothing is drained");

    backend.put_many(c1.canaries(), 100).await.unwrap();
    let status = h
        .status_until("c1", "ready on B", ClusterStatus::ready)
        .await;
    assert_eq!(status.etcd_endpoints, b.endpoint());
    assert_eq!(status.cluster_id, 1);
    assert_eq!(entries(&status), (2, 2, 5, 21));
    h.contribution_until("c1", (2, 2, 21)).await;
    // Exactly the difference: unchanged entries produce no event.
    assert_eq!(
        h.events_since(mark).await,
        [
            format!("ip+ c1 {}", ipcache_key(&extra)),
            "node- c1 c1-node-0".to_owned(),
        ]
    );
    h.identities_until("c1", 5).await;
    h.assert_all_waits_synced_at_once().await;
}

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn an_invalid_config_file_disconnects_but_keeps_what_the_cluster_contributed() {
    init_tracing();
    let h = Harness::start(255).await;
    let c1 = cluster("c1", 1);
    let etcd = loaded(&c1).await;
    synced(&h, &c1, &etcd).await;
    let mark = h.events().await.len();

    // As in Cilium, a config file that stops parsing closes the connection.
    h.agent
        .configure(ClusterConfigEvent::Invalid {
            name: "c1".to_owned(),
            error: "c1: invalid YAML".to_owned(),
        })
        .await;
    let status = h
        .status_until("c1", "disconnected, stores stopped", |s| {
            !s.connected && s.listed == ListedFlags::default()
        })
        .await;
    assert!(error_contains(&status, "invalid YAML"), "{status:#?}");
    assert!(!status.ready());
    // Nothing it contributed is drained, and the latches stay done.
    assert_eq!(entries(&status), (3, 2, 5, 20));
    assert_eq!(h.counts("c1").await, (3, 2, 20));
    h.identities_until("c1", 5).await;
    h.assert_all_waits_synced_at_once().await;

    // Changes made meanwhile arrive once the file is fixed: exactly the difference.
    let (extra, value) = c1.ipcache(SMALL.ipcache);
    connect(&etcd).await.put(&extra, value).await.unwrap();
    h.add_server("c1", &etcd).await;
    let status = h
        .status_until("c1", "ready again", |s| {
            s.ready() && entries(s) == (3, 2, 5, 21)
        })
        .await;
    assert_eq!(status.last_error, None);
    h.contribution_until("c1", (3, 2, 21)).await;
    assert_eq!(
        h.events_since(mark).await,
        [format!("ip+ c1 {}", ipcache_key(&extra))]
    );
    h.assert_all_waits_synced_at_once().await;
}

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn a_changed_cluster_id_drains_and_refills() {
    init_tracing();
    let h = Harness::start(255).await;
    let old = cluster("c1", 1);
    let etcd = loaded(&old).await;
    synced(&h, &old, &etcd).await;
    let backend = connect(&etcd).await;
    let mark = h.events().await.len();

    // The remote announces another ID; its data still carries the old one.
    let new = cluster("c1", 2);
    let (key, value) = new.config();
    backend.put(&key, value).await.unwrap();
    let status = h
        .status_until("c1", "ready with the new ID", |s| {
            s.cluster_id == 2 && s.ready()
        })
        .await;
    assert_eq!(entries(&status), (0, 0, 0, 0), "old-ID data is rejected");
    h.contribution_until("c1", (0, 0, 0)).await;
    h.identities_until("c1", 0).await;
    let drained = h.events_since(mark).await;
    assert_eq!(drained.len(), 3 + 2 + 20, "{drained:#?}");
    for i in 0..SMALL.ipcache {
        let deleted = format!("ip- c1 {}", ipcache_key(&old.ipcache(i).0));
        assert!(drained.contains(&deleted), "{deleted} in {drained:#?}");
    }
    for i in 0..SMALL.nodes {
        assert!(drained.contains(&format!("node- c1 {}", old.node_name(i))));
    }
    for i in 0..SMALL.services {
        assert!(drained.contains(&format!("svc- c1 default/svc-{i}")));
    }

    // The remote rewrites its data for the new ID: the cluster refills.
    let mark = h.events().await.len();
    backend.delete_prefix("cilium/state/").await.unwrap();
    backend.put_many(new.state(), 100).await.unwrap();
    h.contribution_until("c1", (3, 2, 20)).await;
    h.identities_until("c1", 5).await;
    let refilled = h.events_since(mark).await;
    for i in 0..SMALL.ipcache {
        let added = format!("ip+ c1 {}", ipcache_key(&new.ipcache(i).0));
        assert!(refilled.contains(&added), "{added} in {refilled:#?}");
    }
    assert!(
        refilled.iter().all(|e| e.contains('+')),
        "no deletes when refilling: {refilled:#?}"
    );
    let status = h
        .status_until("c1", "every new entry counted", |s| {
            entries(s) == (3, 2, 5, 20)
        })
        .await;
    assert!(status.ready() && status.cluster_id == 2, "{status:#?}");
    h.assert_all_waits_synced_at_once().await;
}

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn the_latches_stay_done_while_the_remote_etcd_is_down() {
    init_tracing();
    let h = Harness::start(255).await;
    let c1 = cluster("c1", 1);
    let mut etcd = loaded(&c1).await;
    synced(&h, &c1, &etcd).await;
    let mark = h.events().await.len();

    etcd.stop();
    let down = h
        .status_until("c1", "the failure is counted", |s| {
            s.failures >= 1 && !s.connected
        })
        .await;
    assert!(down.last_failure.is_some() && down.last_error.is_some());
    assert!(!down.ready());
    // Latches never reset on reconnect: every wait returns at once while etcd is down.
    h.assert_all_waits_synced_at_once().await;
    assert_eq!(h.counts("c1").await, (3, 2, 20), "nothing is drained");
    assert_eq!(h.registered_identities("c1").await, 5);

    etcd.restart().unwrap();
    let up = h
        .status_until("c1", "ready again", ClusterStatus::ready)
        .await;
    assert!(up.failures >= 1 && up.last_failure.is_some(), "{up:#?}");
    assert_eq!(entries(&up), (3, 2, 5, 20));
    assert_eq!(h.counts("c1").await, (3, 2, 20));
    h.identities_until("c1", 5).await;
    assert_eq!(
        h.events_since(mark).await,
        Vec::<String>::new(),
        "the same data listed again changes nothing"
    );
    h.assert_all_waits_synced_at_once().await;
}

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn agent_shutdown_drains_nothing_and_releases_pending_waits() {
    init_tracing();
    let h = Harness::start(255).await;
    let c1 = cluster("c1", 1);
    let etcd = loaded(&c1).await;
    synced(&h, &c1, &etcd).await;
    // c2 announces canaries but never writes them: it never syncs.
    let c2 = cluster("c2", 2);
    let stuck = EtcdServer::start().unwrap();
    let backend = connect(&stuck).await;
    let (key, value) = c2.config();
    backend.put(&key, value).await.unwrap();
    backend.put_many(c2.state(), 100).await.unwrap();
    h.add_server("c2", &stuck).await;
    h.status_until("c2", "c2 connected", |s| {
        s.connected && s.config_retrieved && s.cluster_id == 2
    })
    .await;
    assert!(matches!(
        h.wait(SyncKind::IpIdentities, Some(AT_ONCE)).await,
        Err(WaitError::CallerDeadline { .. })
    ));
    // A wait with its snapshot taken now (c1 and c2), with no deadline of its own.
    let wait = h
        .agent
        .barrier()
        .send(GetMeshWait::all(SyncKind::IpIdentities))
        .await
        .unwrap();
    assert_eq!(wait.clusters().count(), 2);
    let waiting = tokio::spawn(wait.wait(None));
    let mark = h.events().await.len();

    h.agent.mesh().send(ShutdownMesh).await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the pending wait is released")
        .unwrap();
    assert_eq!(outcome, Ok(WaitOutcome::Synced));
    // Every store has stopped: whatever they sent is queued before these questions.
    assert_eq!(h.events_since(mark).await, Vec::<String>::new());
    assert_eq!(h.counts("c1").await, (3, 2, 20));
    assert_eq!(h.counts("c2").await, (0, 0, 0));
    assert_eq!(h.registered_identities("c1").await, 5);
}

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn synced_canaries_gate_the_stores_and_their_absence_does_not() {
    init_tracing();
    let h = Harness::start(255).await;
    // c1 is an old-style remote: no `syncedCanaries`, no canaries.
    let c1 = cluster("c1", 1);
    let plain = EtcdServer::start().unwrap();
    let backend = connect(&plain).await;
    backend
        .put(
            "cilium/cluster-config/c1",
            config_json(1, false, false, 255),
        )
        .await
        .unwrap();
    backend.put_many(c1.state(), 100).await.unwrap();
    // c2 announces canaries; its state is written but not announced yet.
    let c2 = cluster("c2", 2);
    let gated = EtcdServer::start().unwrap();
    let gated_backend = connect(&gated).await;
    let (key, value) = c2.config();
    gated_backend.put(&key, value).await.unwrap();
    gated_backend.put_many(c2.state(), 100).await.unwrap();

    h.add_server("c1", &plain).await;
    h.add_server("c2", &gated).await;
    let status = h.status_until("c1", "c1 ready", ClusterStatus::ready).await;
    assert_eq!(entries(&status), (3, 2, 5, 20));
    h.contribution_until("c1", (3, 2, 20)).await;

    h.status_until("c2", "c2 connected", |s| {
        s.connected && s.config_retrieved && s.cluster_id == 2
    })
    .await;
    // Only the nodes are announced: their store starts, no other.
    let (canary, value) = c2.canary(keys::NODES_PREFIX);
    gated_backend.put(&canary, value).await.unwrap();
    let status = h
        .status_until("c2", "c2 nodes synced", |s| s.listed.nodes)
        .await;
    assert!(
        !status.listed.services && !status.listed.identities && !status.listed.ipcache,
        "{status:#?}"
    );
    assert!(!status.ready());
    assert_eq!(entries(&status), (3, 0, 0, 0));
    assert_eq!(
        h.wait(SyncKind::Nodes, Some(Duration::from_secs(10))).await,
        Ok(WaitOutcome::Synced)
    );
    assert!(matches!(
        h.wait(SyncKind::Services, Some(AT_ONCE)).await,
        Err(WaitError::CallerDeadline { .. })
    ));

    gated_backend.put_many(c2.canaries(), 100).await.unwrap();
    let status = h.status_until("c2", "c2 ready", ClusterStatus::ready).await;
    assert_eq!(entries(&status), (3, 2, 5, 20));
    h.contribution_until("c2", (3, 2, 20)).await;
    h.assert_all_waits_synced_at_once().await;
}

/// `cluster`'s state in kvstoremesh's cache layout, and its canaries there.
fn cached_layout(cluster: &Cluster) -> Vec<(String, Vec<u8>)> {
    let name = &cluster.name;
    let moves = [
        (
            format!("{}/{name}/", keys::NODES_PREFIX),
            format!("cilium/cache/nodes/v1/{name}/"),
        ),
        (
            format!("{}/{name}/", keys::SERVICES_PREFIX),
            format!("cilium/cache/services/v1/{name}/"),
        ),
        (
            format!("{}/", keys::IDENTITY_ID_PREFIX),
            format!("cilium/cache/identities/v1/{name}/id/"),
        ),
        (
            format!("{}/", keys::IPCACHE_DEFAULT_PREFIX),
            format!("cilium/cache/ip/v1/{name}/"),
        ),
    ];
    let mut pairs: Vec<(String, Vec<u8>)> = cluster
        .state()
        .into_iter()
        .map(|(key, value)| {
            let (from, to) = moves
                .iter()
                .find(|(from, _)| key.starts_with(from.as_str()))
                .unwrap_or_else(|| panic!("unexpected fixture key {key}"));
            (format!("{to}{}", &key[from.len()..]), value)
        })
        .collect();
    for kind in ["nodes", "services", "identities", "ip"] {
        pairs.push(cluster.canary(&format!("cilium/cache/{kind}/v1")));
    }
    pairs
}

/// A remote etcd as kvstoremesh fills it: cluster config with `cached`, data and canaries
/// in the cache layout, and a decoy entry in the state layout that must not be read.
async fn kvstoremesh(cluster: &Cluster) -> EtcdServer {
    let etcd = EtcdServer::start().unwrap();
    let backend = connect(&etcd).await;
    backend
        .put(
            &format!("cilium/cluster-config/{}", cluster.name),
            config_json(cluster.id, true, true, 255),
        )
        .await
        .unwrap();
    backend.put_many(cached_layout(cluster), 100).await.unwrap();
    let mut decoy = cluster.clone();
    decoy.sizes.nodes = 5;
    backend.put_many([decoy.node(4)], 100).await.unwrap();
    for (key, value) in decoy.canaries() {
        backend.put(&key, value).await.unwrap();
    }
    etcd
}

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn the_cached_layout_syncs_nodes_services_and_ipcache() {
    init_tracing();
    let h = Harness::start(255).await;
    let c1 = cluster("c1", 1);
    let etcd = kvstoremesh(&c1).await;
    h.add_server("c1", &etcd).await;
    let status = h.status_until("c1", "ready", ClusterStatus::ready).await;
    assert_eq!(
        (
            status.entries.nodes,
            status.entries.services,
            status.entries.ipcache
        ),
        (3, 2, 20),
        "{status:#?}"
    );
    h.contribution_until("c1", (3, 2, 20)).await;
    h.assert_all_waits_synced_at_once().await;
    // Live updates in the cache layout arrive too.
    let backend = connect(&etcd).await;
    let (key, _) = c1.ipcache(0);
    backend
        .delete(&format!("cilium/cache/ip/v1/c1/{}", ipcache_key(&key)))
        .await
        .unwrap();
    h.contribution_until("c1", (3, 2, 19)).await;
}

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn the_cached_layout_syncs_identities() {
    init_tracing();
    let h = Harness::start(255).await;
    let c1 = cluster("c1", 1);
    let etcd = kvstoremesh(&c1).await;
    h.add_server("c1", &etcd).await;
    let status = h.status_until("c1", "ready", ClusterStatus::ready).await;
    assert_eq!(entries(&status), (3, 2, 5, 20), "{status:#?}");
    h.identities_until("c1", 5).await;
}

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn a_required_but_missing_cluster_config_is_retried_until_written() {
    init_tracing();
    let h = Harness::start(255).await;
    let c1 = cluster("c1", 1);
    let etcd = EtcdServer::start().unwrap();
    let backend = connect(&etcd).await;
    backend
        .put(keys::HAS_CLUSTER_CONFIG_KEY, "true")
        .await
        .unwrap();
    backend.put_many(c1.state(), 100).await.unwrap();
    backend.put_many(c1.canaries(), 100).await.unwrap();
    h.add_server("c1", &etcd).await;
    let status = h
        .status_until("c1", "the missing config is reported", |s| {
            error_contains(s, "cluster configuration expected but not found")
        })
        .await;
    assert!(
        status.config_required && !status.config_retrieved,
        "{status:#?}"
    );
    assert!(!status.ready() && status.failures >= 1);
    assert_eq!(entries(&status), (0, 0, 0, 0), "no store started");
    assert!(matches!(
        h.wait(SyncKind::Nodes, Some(AT_ONCE)).await,
        Err(WaitError::CallerDeadline { .. })
    ));

    let (key, value) = c1.config();
    backend.put(&key, value).await.unwrap();
    let status = h.status_until("c1", "ready", ClusterStatus::ready).await;
    assert!(status.config_required && status.config_retrieved);
    assert_eq!((status.cluster_id, status.last_error.as_deref()), (1, None));
    assert_eq!(entries(&status), (3, 2, 5, 20));
    h.assert_all_waits_synced_at_once().await;
}

/// A cluster with ID `id` (valid in both modes) whose identities and ipcache entries lie in
/// the 511-mode range of `id` (`[id << 15, (id << 15) + 32767]`); the lab fixture's
/// identities are in the 255-mode range.
fn extended_cluster(name: &str, id: u32) -> (Cluster, Vec<(String, Vec<u8>)>) {
    let cluster = Cluster {
        name: name.to_owned(),
        id,
        sizes: Sizes {
            nodes: 2,
            services: 1,
            identities: 0,
            ipcache: 0,
        },
    };
    let mut pairs = cluster.state();
    for i in 0..4 {
        let identity = (id << 15) + 256 + i;
        pairs.push((
            format!("{}/{identity}", keys::IDENTITY_ID_PREFIX),
            format!(
                "k8s:app=app-{i};k8s:io.cilium.k8s.policy.cluster={name};k8s:io.kubernetes.pod.namespace=default;"
            )
            .into_bytes(),
        ));
        let ip = format!("10.{}.0.{i}", 200 + id);
        pairs.push((
            format!("{}/{ip}", keys::IPCACHE_DEFAULT_PREFIX),
            serde_json::json!({
                "IP": ip, "Mask": null, "HostIP": format!("10.{}.0.0", 100 + id),
                "ID": identity, "Key": 0, "Metadata": "", "K8sNamespace": "default",
                "K8sPodName": format!("pod-{i}"),
            })
            .to_string()
            .into_bytes(),
        ));
    }
    pairs.extend(cluster.canaries());
    (cluster, pairs)
}

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn in_511_mode_a_remote_must_announce_the_same_maximum() {
    init_tracing();
    let h = Harness::start(511).await;
    let (c1, pairs) = extended_cluster("c1", 3);
    let etcd = EtcdServer::start().unwrap();
    let backend = connect(&etcd).await;
    let config_key = format!("cilium/cluster-config/{}", c1.name);
    backend
        .put(&config_key, config_json(3, true, false, 255))
        .await
        .unwrap();
    backend.put_many(pairs, 100).await.unwrap();
    h.add_server("c1", &etcd).await;
    let status = h
        .status_until("c1", "the mismatch is reported", |s| {
            error_contains(s, "mismatched MaxConnectedClusters; local=511, remote=255")
        })
        .await;
    assert!(!status.ready() && !status.config_retrieved && status.failures >= 1);
    assert_eq!(entries(&status), (0, 0, 0, 0));

    backend
        .put(&config_key, config_json(3, true, false, 511))
        .await
        .unwrap();
    let status = h.status_until("c1", "ready", ClusterStatus::ready).await;
    assert_eq!(status.cluster_id, 3);
    assert_eq!(entries(&status), (2, 1, 4, 4));
    h.contribution_until("c1", (2, 1, 4)).await;
    h.identities_until("c1", 4).await;
    h.assert_all_waits_synced_at_once().await;
}
