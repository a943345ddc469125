//! A remote cluster's config file removed and re-created 100 times in quick succession —
//! within one debounce window, and again while the removal's drain runs — against real etcd,
//! the real config directory watcher and the real pinned ipcache: the cluster ends with its
//! latches present, its cluster ID reserved once, and exactly the remote's ipcache entries in
//! the map (nothing lost to a late drain, nothing left over).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use common::{Mesh, Options, connect, load};
use meshwork_clustermesh::SyncKind;
use meshwork_clustermesh::barrier_actor::GetClusterWait;
use meshwork_clustermesh::config_dir::{ClusterConfigEvent, RemoteClusterConfig};
use meshwork_datapath::ipcache_map::IpCacheKey;
use meshwork_datapath::maps::PinDir;
use meshwork_kvstore::{EtcdConfig, keys};
use meshwork_lab::bpffs::BpfRoot;
use meshwork_lab::cilium::{Cluster, Sizes};
use meshwork_lab::etcd::EtcdServer;
use meshwork_lab::wait::{Wait, eventually_async};

/// Enough entries that draining them takes a moment.
const ENTRIES: u32 = 20_000;
const CHURN: usize = 100;

/// The pinned ipcache's keys now.
fn pinned(pins: &PinDir) -> BTreeSet<IpCacheKey> {
    pins.open_ipcache()
        .and_then(|map| map.entries())
        .map(|entries| entries.into_iter().map(|(key, _)| key).collect())
        .unwrap_or_default()
}

/// Removes and re-creates `file` `CHURN` times, ending with it present.
fn churn(file: &Path, content: &str) {
    for _ in 0..CHURN {
        std::fs::remove_file(file).unwrap();
        std::fs::write(file, content).unwrap();
    }
}

/// Whether the barrier has latches for `cluster`, and they complete.
async fn latches_done(mesh: &Mesh, cluster: &str) -> Option<bool> {
    let wait = mesh
        .agent
        .barrier()
        .send(GetClusterWait {
            cluster: cluster.to_owned(),
            kind: SyncKind::IpIdentities,
        })
        .await
        .unwrap()?;
    Some(
        tokio::time::timeout(Duration::from_millis(100), wait.wait())
            .await
            .is_ok_and(|done| done.is_ok()),
    )
}

/// How the churn reaches the mesh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    /// Through the file and the real watcher, which collapses changes within its debounce.
    Watcher,
    /// Every change handed to the mesh as its own event.
    EveryChange,
}

/// Churns c1's config 100 times within one debounce window and 100 times right after a
/// removal reached the mesh (its drain running), and checks the end state.
async fn churned_ends_with_exactly_the_remote(delivery: Delivery) {
    common::init_tracing();
    let remote = Cluster {
        name: "c1".to_owned(),
        id: 1,
        sizes: Sizes {
            nodes: 3,
            services: 2,
            identities: 5,
            ipcache: ENTRIES,
        },
    };
    let etcd = EtcdServer::start().unwrap();
    load(&connect(&etcd).await, &remote).await.unwrap();
    let expected: BTreeSet<IpCacheKey> = (0..ENTRIES)
        .map(|i| {
            let (key, _) = remote.ipcache(i);
            let ip = &key[keys::IPCACHE_DEFAULT_PREFIX.len() + 1..];
            IpCacheKey::parse(ip, 0).unwrap()
        })
        .collect();

    let config = tempfile::tempdir().unwrap();
    let file = config.path().join("c1");
    let content = format!("endpoints:\n- {}\n", etcd.endpoint());
    std::fs::write(&file, &content).unwrap();
    let bpf = BpfRoot::new().unwrap();
    let pins = PinDir::under(bpf.path());
    let mesh = Mesh::start_with(
        Options::new("local", 9, Duration::from_secs(60))
            .flag(format!("--bpf-root={}", bpf.path().display()))
            .flag(format!("--clustermesh-config={}", config.path().display())),
    )
    .await;
    let in_map = |what: &'static str| {
        eventually_async(
            what,
            || std::future::ready(pinned(&pins).len()),
            |n| *n == expected.len(),
        )
    };
    in_map("the remote's entries in the map").await;

    match delivery {
        Delivery::Watcher => {
            // Within one debounce window of the watcher.
            churn(&file, &content);
            // Again right after the removal reached the mesh (the barrier forgets the
            // cluster as its drain starts).
            std::fs::remove_file(&file).unwrap();
            eventually_async(
                "the removal to reach the mesh",
                || latches_done(&mesh, "c1"),
                Option::is_none,
            )
            .await;
            std::fs::write(&file, &content).unwrap();
            churn(&file, &content);
        }
        Delivery::EveryChange => {
            let upsert = || ClusterConfigEvent::Upsert {
                name: "c1".to_owned(),
                config: RemoteClusterConfig {
                    name: "c1".to_owned(),
                    etcd: EtcdConfig::new([etcd.endpoint()]),
                    hash: 0,
                },
            };
            let remove = || ClusterConfigEvent::Remove {
                name: "c1".to_owned(),
            };
            mesh.agent.configure(remove()).await;
            for _ in 0..CHURN {
                mesh.agent.configure(upsert()).await;
                mesh.agent.configure(remove()).await;
            }
            mesh.agent.configure(upsert()).await;
        }
    }

    let status = mesh
        .status_until("c1", "c1 ready again", |s| s.ready())
        .await;
    assert_eq!(status.cluster_id, 1);
    Wait::new("c1's latches present and done")
        .until_async(|| latches_done(&mesh, "c1"), |done| *done == Some(true))
        .await
        .unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(
        mesh.reserved_ids().await,
        BTreeMap::from([(1, "c1".to_owned()), (9, "local".to_owned())]),
        "c1's ID is reserved once"
    );
    in_map("exactly the remote's entries in the map").await;
    let in_map_now = pinned(&pins);
    assert!(
        in_map_now == expected,
        "the map holds other keys than the remote's: {} missing, {} extra",
        expected.difference(&in_map_now).count(),
        in_map_now.difference(&expected).count()
    );
    mesh.agent.shutdown().await;
}

#[actix_rt::test]
#[ignore = "needs real etcd, root and bpffs: `cargo xtask test` runs it"]
async fn a_config_file_churned_100_times_ends_with_exactly_the_remote() {
    churned_ends_with_exactly_the_remote(Delivery::Watcher).await;
}

/// Every one of the churn's removals and re-creations handed to the mesh as the watcher
/// would if it saw each (its debounce collapses them), back to back after a removal whose
/// drain is still running: the lifecycle's hardest path, deterministically.
#[actix_rt::test]
#[ignore = "needs real etcd, root and bpffs: `cargo xtask test` runs it"]
async fn every_change_of_a_churn_during_a_drain_ends_with_exactly_the_remote() {
    churned_ends_with_exactly_the_remote(Delivery::EveryChange).await;
}
