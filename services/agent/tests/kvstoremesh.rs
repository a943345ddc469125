//! The agent reading every remote through kvstoremesh: one etcd connection (the local one),
//! the cached config's `cached: true`, the cache prefixes, and every wait returning.

mod common;

use std::time::Duration;

use common::{Mesh, connect, init_tracing, load};
use meshwork_clustermesh::{SyncKind, WaitOutcome};
use meshwork_kvstoremesh::service::{KvstoreMesh, Settings};
use meshwork_lab::cilium::{Cluster, Sizes};
use meshwork_lab::etcd::EtcdServer;
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
