//! kvstoremesh against real etcd: remotes cached byte for byte, hostile entries never
//! cached, a restart that deletes only what the remote no longer has, Cilium's drain order
//! on removal (also of a remote removed while kvstoremesh was down), a cached config put back
//! when someone else touches it, and a remote that goes away and comes back.

mod common;

use std::time::Duration;

use common::*;
use meshwork_lab::wait::Wait;

const NO_GRACE: Duration = Duration::from_millis(0);

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn three_remotes_are_cached_byte_for_byte_and_hostile_entries_never() {
    let local = meshwork_lab::etcd::EtcdServer::start().unwrap();
    let remotes = [cluster("c1", 1), cluster("c2", 2), cluster("c3", 3)];
    let mut servers = Vec::new();
    for remote in &remotes {
        servers.push(loaded(remote).await);
    }
    // c2 also holds what its agent would refuse: another cluster's node, an identity of
    // cluster 1's range, and an ipcache value that is not JSON.
    let c2 = connect(&servers[1]).await;
    let hostile = [
        (
            "cilium/state/nodes/v1/c2/spoofed",
            r#"{"Name":"spoofed","Cluster":"c1","ClusterID":1}"#,
        ),
        ("cilium/state/identities/v1/id/65800", "k8s:app=x;"),
        ("cilium/state/ip/v1/default/10.202.9.9", "{not json"),
    ];
    for (key, value) in hostile {
        c2.put(key, value).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    for (remote, server) in remotes.iter().zip(&servers) {
        configure(dir.path(), &remote.name, server);
    }
    let (kvstoremesh, registry) = start(&local, dir.path(), NO_GRACE).await;
    ready(&kvstoremesh).await;

    let backend = connect(&local).await;
    for (remote, server) in remotes.iter().zip(&servers) {
        let name = &remote.name;
        let mut expected = expected_cache(&connect(server).await, name).await;
        expected.retain(|key, _| {
            !key.contains("spoofed") && !key.ends_with("/65800") && !key.ends_with("/10.202.9.9")
        });
        let cache = cached(&backend, name).await;
        assert_eq!(
            cache.len(),
            30,
            "{name}: 3 nodes, 2 services, 5 identities, 20 entries"
        );
        assert_eq!(cache, expected, "{name}");
        let canaries = list(&backend, &format!("cilium/synced/{name}/")).await;
        assert_eq!(
            canaries.keys().collect::<Vec<_>>(),
            [
                &format!("cilium/synced/{name}/cilium/cache/identities/v1"),
                &format!("cilium/synced/{name}/cilium/cache/ip/v1"),
                &format!("cilium/synced/{name}/cilium/cache/nodes/v1"),
                &format!("cilium/synced/{name}/cilium/cache/services/v1"),
            ]
        );
        let (config, _) = backend
            .get(&format!("cilium/cluster-config/{name}"))
            .await
            .unwrap()
            .expect("the cached cluster config");
        assert_eq!(
            String::from_utf8(config).unwrap(),
            format!(
                r#"{{"id":{},"capabilities":{{"syncedCanaries":true,"cached":true,"maxConnectedClusters":255}}}}"#,
                remote.id
            )
        );
    }
    let text = metrics(&registry);
    let errors: u64 = text
        .lines()
        .filter(|l| l.starts_with("kvstoremesh_kvstore_decode_errors_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(errors, 3, "each hostile entry counted once:\n{text}");
    let statuses = kvstoremesh.status().await;
    assert!(statuses.iter().all(|s| s.ready()), "{statuses:#?}");
    kvstoremesh.shutdown().await;
}

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn a_restart_deletes_only_what_the_remote_no_longer_has() {
    let local = meshwork_lab::etcd::EtcdServer::start().unwrap();
    let c1 = cluster("c1", 1);
    let server = loaded(&c1).await;
    let dir = tempfile::tempdir().unwrap();
    configure(dir.path(), "c1", &server);
    let (kvstoremesh, _) = start(&local, dir.path(), NO_GRACE).await;
    ready(&kvstoremesh).await;
    kvstoremesh.shutdown().await;

    // While kvstoremesh is down the remote loses a node and gains an ipcache entry.
    let remote = connect(&server).await;
    let (gone, _) = c1.node(0);
    remote.delete(&gone).await.unwrap();
    let (key, value) = c1.ipcache(99);
    remote.put(&key, value).await.unwrap();
    let backend = connect(&local).await;
    let from = backend.revision("cilium/").await.unwrap() + 1;

    let (kvstoremesh, _) = start(&local, dir.path(), NO_GRACE).await;
    ready(&kvstoremesh).await;
    converged(&backend, &remote, "c1").await;
    let seen = events_since(&backend, "cilium/cache/", from).await;
    assert_eq!(
        seen,
        [
            format!(
                "+cilium/cache/ip/v1/c1/{}",
                &key["cilium/state/ip/v1/default/".len()..]
            ),
            "-cilium/cache/nodes/v1/c1/c1-node-0".to_owned(),
        ],
        "only the vanished node is deleted, only the new entry written"
    );
    kvstoremesh.shutdown().await;
}

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn a_removed_remote_is_drained_config_first_then_canaries_then_entries() {
    let local = meshwork_lab::etcd::EtcdServer::start().unwrap();
    let (c1, c2) = (cluster("c1", 1), cluster("c2", 2));
    let (s1, s2) = (loaded(&c1).await, loaded(&c2).await);
    let dir = tempfile::tempdir().unwrap();
    configure(dir.path(), "c1", &s1);
    configure(dir.path(), "c2", &s2);
    let grace = Duration::from_millis(500);
    let (kvstoremesh, _) = start(&local, dir.path(), grace).await;
    ready(&kvstoremesh).await;
    let backend = connect(&local).await;
    let from = backend.revision("cilium/").await.unwrap() + 1;

    std::fs::remove_file(dir.path().join("c2")).unwrap();
    drained_in_order(&backend, from, "c2").await;
    assert_eq!(cached(&backend, "c1").await.len(), 30, "c1 untouched");
    kvstoremesh.shutdown().await;
}

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn a_remote_removed_while_kvstoremesh_was_down_is_drained_at_its_next_start() {
    let local = meshwork_lab::etcd::EtcdServer::start().unwrap();
    let (c1, c2) = (cluster("c1", 1), cluster("c2", 2));
    let (s1, s2) = (loaded(&c1).await, loaded(&c2).await);
    let dir = tempfile::tempdir().unwrap();
    configure(dir.path(), "c1", &s1);
    configure(dir.path(), "c2", &s2);
    let (kvstoremesh, _) = start(&local, dir.path(), NO_GRACE).await;
    ready(&kvstoremesh).await;
    kvstoremesh.shutdown().await;
    let backend = connect(&local).await;
    let from = backend.revision("cilium/").await.unwrap() + 1;

    // Its leases would be kept alive by the next kvstoremesh's adoption: it must be drained.
    std::fs::remove_file(dir.path().join("c2")).unwrap();
    let (kvstoremesh, _) = start(&local, dir.path(), Duration::from_millis(300)).await;
    drained_in_order(&backend, from, "c2").await;
    ready(&kvstoremesh).await;
    assert_eq!(cached(&backend, "c1").await.len(), 30, "c1 untouched");
    kvstoremesh.shutdown().await;
}

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn a_cached_config_deleted_or_changed_by_someone_else_is_put_back_at_once() {
    let local = meshwork_lab::etcd::EtcdServer::start().unwrap();
    let c1 = cluster("c1", 1);
    let server = loaded(&c1).await;
    let dir = tempfile::tempdir().unwrap();
    configure(dir.path(), "c1", &server);
    let (kvstoremesh, _) = start(&local, dir.path(), NO_GRACE).await;
    ready(&kvstoremesh).await;
    let backend = connect(&local).await;
    let key = "cilium/cluster-config/c1";
    let (cached, _) = backend.get(key).await.unwrap().expect("the cached config");

    let tampered: [Option<&[u8]>; 2] = [None, Some(br#"{"id":1,"capabilities":{}}"#)];
    for tamper in tampered {
        match tamper {
            None => assert!(backend.delete(key).await.unwrap()),
            Some(value) => {
                backend.put(key, value).await.unwrap();
            }
        }
        // Well within the 5-minute re-check: the watch puts it back.
        Wait::new(format!("{key} put back after {tamper:?}"))
            .timeout(Duration::from_secs(10))
            .until_async(
                || async { backend.get(key).await.unwrap().map(|(v, _)| v) },
                |value| value.as_deref() == Some(cached.as_slice()),
            )
            .await
            .unwrap_or_else(|err| panic!("{err}"));
    }
    kvstoremesh.shutdown().await;
}

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn a_remote_that_goes_away_keeps_its_cache_and_is_listed_again_on_return() {
    let local = meshwork_lab::etcd::EtcdServer::start().unwrap();
    let c1 = cluster("c1", 1);
    let mut server = loaded(&c1).await;
    let dir = tempfile::tempdir().unwrap();
    configure(dir.path(), "c1", &server);
    let (kvstoremesh, _) = start(&local, dir.path(), NO_GRACE).await;
    ready(&kvstoremesh).await;
    let backend = connect(&local).await;

    server.kill();
    Wait::new("c1 to show disconnected")
        .until_async(
            || kvstoremesh.status(),
            |s| s.iter().any(|s| s.name == "c1" && !s.connected),
        )
        .await
        .unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(
        cached(&backend, "c1").await.len(),
        30,
        "the cache stays while the remote is gone"
    );

    server.restart().unwrap();
    let remote = connect(&server).await;
    let (gone, _) = c1.node(1);
    remote.delete(&gone).await.unwrap();
    converged(&backend, &remote, "c1").await;
    assert_eq!(cached(&backend, "c1").await.len(), 29);
    kvstoremesh.shutdown().await;
}

/// Waits for `cluster`'s drain after `from` and checks Cilium's order: its cached config, its
/// four canaries, then its 30 entries. Other clusters see no delete (their canaries may be
/// written again meanwhile, with a new time, after a re-list).
async fn drained_in_order(backend: &meshwork_kvstore::EtcdBackend, from: i64, cluster: &str) {
    let (inner, last) = (format!("/{cluster}/"), format!("/{cluster}"));
    let of_cluster = |e: &String| e.contains(&inner) || e.ends_with(&last);
    let seen = watch_until(backend, "cilium/", from, |seen| {
        seen.iter().filter(|e| of_cluster(e)).count() >= 35
    })
    .await;
    let (ours, others): (Vec<String>, Vec<String>) = seen.into_iter().partition(of_cluster);
    assert!(others.iter().all(|e| e.starts_with('+')), "{others:#?}");
    assert!(ours.iter().all(|e| e.starts_with('-')), "{ours:#?}");
    assert_eq!(ours[0], format!("-cilium/cluster-config/{cluster}"));
    let canaries = format!("-cilium/synced/{cluster}/");
    assert!(
        ours[1..5].iter().all(|e| e.starts_with(&canaries)),
        "{ours:#?}"
    );
    assert!(
        ours[5..].iter().all(|e| e.starts_with("-cilium/cache/")),
        "{ours:#?}"
    );
    assert!(cached(backend, cluster).await.is_empty());
}
