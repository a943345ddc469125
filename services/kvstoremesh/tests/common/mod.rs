//! Shared helpers of kvstoremesh's tests: lab etcds holding Cilium-format remotes, and a
//! kvstoremesh started in-process over a local etcd.

#![allow(dead_code, missing_docs)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use meshwork_kvstore::{EtcdBackend, EtcdConfig, WatchEvent};
use meshwork_kvstoremesh::service::{KvstoreMesh, Settings};
use meshwork_lab::cilium::{Cluster, Sizes};
use meshwork_lab::etcd::EtcdServer;
use meshwork_lab::wait::Wait;
use prometheus_client::registry::Registry;

pub const SMALL: Sizes = Sizes {
    nodes: 3,
    services: 2,
    identities: 5,
    ipcache: 20,
};

pub fn cluster(name: &str, id: u32) -> Cluster {
    Cluster {
        name: name.to_owned(),
        id,
        sizes: SMALL,
    }
}

pub async fn connect(server: &EtcdServer) -> EtcdBackend {
    EtcdBackend::connect(
        &EtcdConfig::new([server.endpoint()]),
        Duration::from_secs(10),
    )
    .await
    .expect("connect to the lab etcd")
}

/// A lab etcd holding `cluster`'s config, state and canaries.
pub async fn loaded(cluster: &Cluster) -> EtcdServer {
    let server = EtcdServer::start().unwrap();
    let backend = connect(&server).await;
    let (key, value) = cluster.config();
    backend.put(&key, value).await.unwrap();
    backend.put_many(cluster.state(), 100).await.unwrap();
    backend.put_many(cluster.canaries(), 100).await.unwrap();
    server
}

/// Every key and value under `prefix`.
pub async fn list(backend: &EtcdBackend, prefix: &str) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut pages = backend.list(prefix, 1000);
    while let Some(page) = pages.recv().await {
        for kv in page.unwrap().kvs() {
            out.insert(kv.key_str().unwrap().to_owned(), kv.value().to_vec());
        }
    }
    out
}

/// `remote`'s state, as its cache keys in the local etcd should hold it.
pub async fn expected_cache(remote: &EtcdBackend, name: &str) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let pairs = [
        (
            format!("cilium/state/nodes/v1/{name}/"),
            format!("cilium/cache/nodes/v1/{name}/"),
        ),
        (
            format!("cilium/state/services/v1/{name}/"),
            format!("cilium/cache/services/v1/{name}/"),
        ),
        (
            "cilium/state/identities/v1/id/".to_owned(),
            format!("cilium/cache/identities/v1/{name}/id/"),
        ),
        (
            "cilium/state/ip/v1/default/".to_owned(),
            format!("cilium/cache/ip/v1/{name}/"),
        ),
    ];
    for (from, to) in pairs {
        for (key, value) in list(remote, &from).await {
            out.insert(format!("{to}{}", &key[from.len()..]), value);
        }
    }
    out
}

/// What the local etcd caches of `name`'s entries.
pub async fn cached(local: &EtcdBackend, name: &str) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for kind in ["nodes", "services", "identities", "ip"] {
        out.extend(list(local, &format!("cilium/cache/{kind}/v1/{name}/")).await);
    }
    out
}

/// Writes `<dir>/<name>` pointing at `server`.
pub fn configure(dir: &Path, name: &str, server: &EtcdServer) {
    meshwork_lab::agent::write_cluster_config(dir, name, &server.endpoint()).unwrap();
}

/// kvstoremesh of cluster `local` (ID 9) over `local_etcd`, reading `dir`, with a short
/// per-cluster timeout and removal grace (call inside an actix system).
pub async fn start(
    local_etcd: &EtcdServer,
    dir: &Path,
    grace: Duration,
) -> (KvstoreMesh, Registry) {
    let mut registry = Registry::default();
    let settings = Settings {
        per_cluster_ready_timeout: Duration::from_secs(5),
        removal_grace: grace,
        lease_ttl: Duration::from_secs(60),
        ..Settings::new("local", 9, dir)
    };
    let kvstoremesh = KvstoreMesh::start(connect(local_etcd).await, settings, &mut registry)
        .await
        .expect("kvstoremesh starts");
    (kvstoremesh, registry)
}

pub async fn ready(kvstoremesh: &KvstoreMesh) {
    let mut ready = kvstoremesh.ready();
    tokio::time::timeout(Duration::from_secs(30), ready.wait_for(|r| *r))
        .await
        .expect("kvstoremesh ready within 30 s")
        .unwrap();
}

/// Polls until the cache of `name` equals what `remote` holds.
pub async fn converged(local: &EtcdBackend, remote: &EtcdBackend, name: &str) {
    let expected = expected_cache(remote, name).await;
    Wait::new(format!(
        "the cache of {name} to equal its remote ({} keys)",
        expected.len()
    ))
    .until_async(
        || async { cached(local, name).await.into_keys().collect::<Vec<_>>() },
        |keys| *keys == expected.keys().cloned().collect::<Vec<_>>(),
    )
    .await
    .unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(
        cached(local, name).await,
        expected,
        "values are the remote's, byte for byte"
    );
}

/// Every event under `prefix` from `revision` until `until` holds for what was seen (or
/// the deadline), as `+key` / `-key`.
pub async fn watch_until(
    backend: &EtcdBackend,
    prefix: &str,
    revision: i64,
    until: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let mut watch = backend.watch(prefix, revision).await.unwrap();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !until(&seen) {
        let batch = tokio::time::timeout_at(deadline, watch.next())
            .await
            .unwrap_or_else(|_| panic!("watch deadline; saw {seen:#?}"))
            .unwrap()
            .unwrap();
        for event in batch {
            seen.push(match event {
                WatchEvent::Put { key, .. } => format!("+{}", String::from_utf8(key).unwrap()),
                WatchEvent::Delete { key, .. } => format!("-{}", String::from_utf8(key).unwrap()),
            });
        }
    }
    seen
}

/// Every event under `prefix` from `revision` up to now (a sentinel written under `prefix`
/// ends it), as `+key` / `-key`, sorted: events of different stores come in no set order.
pub async fn events_since(backend: &EtcdBackend, prefix: &str, revision: i64) -> Vec<String> {
    let sentinel = format!("{prefix}zz-sentinel");
    backend.put(&sentinel, "x").await.unwrap();
    let mut seen = watch_until(backend, prefix, revision, |seen| {
        seen.last().is_some_and(|e| e[1..] == sentinel)
    })
    .await;
    seen.pop();
    seen.sort();
    seen
}

/// The text of `registry`.
pub fn metrics(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
    out
}
