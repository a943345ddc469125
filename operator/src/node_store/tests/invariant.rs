//! The invariant — every pool IP's `resource` is an ENI in `status.eni.enis` — checked on
//! every version published while ENIs are attached and addresses assigned concurrently,
//! on both backends; and the same runs with the order reversed must break it, which proves
//! the check can fail.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use meshwork_kvstore::{EtcdBackend, EtcdConfig, WatchEvent};
use meshwork_lab::etcd::{EtcdOptions, EtcdServer};

use super::apiserver::{SimulatedApiServer, mock_client};
use super::harness::{Shared, drive, publish_loop};
use crate::node_store::etcd::decode;
use crate::node_store::{EtcdStore, KEY_PREFIX, KubeStore};

/// Versions every correct run must check.
const TARGET_VERSIONS: usize = 10_000;

/// The longest a run may take.
const RUN_DEADLINE: Duration = Duration::from_secs(90);

/// True when the observer has seen enough: the target, or (reversed runs) a violation.
fn done(shared: &Shared, stop_on_violation: bool) -> bool {
    shared.observed.versions() >= TARGET_VERSIONS
        || (stop_on_violation && shared.observed.violated())
}

/// Driver and publisher on the Kubernetes backend against the simulated API server, whose
/// every applied write is a version the observer checks.
async fn kube_run(reversed: bool) -> Arc<Shared> {
    let shared = Arc::new(Shared::default());
    let (client, handle) = mock_client();
    let observer = Arc::clone(&shared);
    let server = tokio::spawn(SimulatedApiServer::new().serve(handle, move |node| {
        observer.observed.record(node);
        if done(&observer, reversed) {
            observer.stop.store(true, Ordering::SeqCst);
        }
    }));
    let driver = tokio::spawn(drive(Arc::clone(&shared)));
    let store = KubeStore::new(client);
    let store = if reversed { store.reversed() } else { store };
    let publisher = tokio::spawn(publish_loop(store, Arc::clone(&shared)));
    tokio::time::timeout(RUN_DEADLINE, async {
        publisher.await.expect("publisher");
        driver.await.expect("driver");
        server.await.expect("server");
    })
    .await
    .expect("the run ends within its deadline");
    shared
}

/// Driver and publisher on the etcd backend against a real etcd; the observer is a watch
/// on the CiliumNode prefix opened before the first write, so it sees every revision.
async fn etcd_run(reversed: bool) -> Arc<Shared> {
    let etcd = EtcdServer::start_with(EtcdOptions {
        data_in_memory: true,
        ..EtcdOptions::default()
    })
    .expect("etcd");
    let backend =
        EtcdBackend::connect(&EtcdConfig::new([etcd.endpoint()]), Duration::from_secs(10))
            .await
            .expect("connect");
    // From the next revision on: nothing is stored yet.
    let mut watch = backend.watch(KEY_PREFIX, 0).await.expect("watch");
    let shared = Arc::new(Shared::default());
    let observer = Arc::clone(&shared);
    let observing = tokio::spawn(async move {
        let mut last_revision = 0;
        while !done(&observer, reversed) {
            let events = watch.next().await.expect("watch").expect("watch open");
            for event in events {
                let WatchEvent::Put {
                    key,
                    value,
                    mod_revision,
                } = event
                else {
                    panic!("nothing deletes nodes here");
                };
                assert!(mod_revision > last_revision, "versions arrive in order");
                last_revision = mod_revision;
                let key = String::from_utf8(key).expect("UTF-8 key");
                let node = decode(&key, &value, mod_revision).expect("decodes");
                observer.observed.record(&node);
            }
        }
        observer.stop.store(true, Ordering::SeqCst);
    });
    let driver = tokio::spawn(drive(Arc::clone(&shared)));
    let store = EtcdStore::new(backend);
    let store = if reversed { store.reversed() } else { store };
    let publisher = tokio::spawn(publish_loop(store, Arc::clone(&shared)));
    tokio::time::timeout(RUN_DEADLINE, async {
        observing.await.expect("observer");
        publisher.await.expect("publisher");
        driver.await.expect("driver");
    })
    .await
    .expect("the run ends within its deadline");
    drop(etcd);
    shared
}

fn assert_held(backend: &str, shared: &Shared, started: Instant) {
    let versions = shared.observed.versions();
    eprintln!(
        "{backend}: {versions} versions observed, {} publishes, {} nodes, {:.1?}",
        shared.published.load(Ordering::SeqCst),
        shared.node.load(Ordering::SeqCst) + 1,
        started.elapsed()
    );
    assert!(versions >= TARGET_VERSIONS, "only {versions} versions");
    assert_eq!(shared.observed.first_violation(), None);
}

fn assert_broken(backend: &str, shared: &Shared, started: Instant) {
    let violation = shared.observed.first_violation();
    eprintln!(
        "{backend} reversed: violation after {} versions, {:.1?}: {violation:?}",
        shared.observed.versions(),
        started.elapsed()
    );
    assert!(violation.is_some(), "the reversed order went unnoticed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kube_every_published_version_names_only_known_enis() {
    let started = Instant::now();
    let shared = kube_run(false).await;
    assert_held("kubernetes", &shared, started);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kube_spec_before_status_is_caught() {
    let started = Instant::now();
    let shared = kube_run(true).await;
    assert_broken("kubernetes", &shared, started);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn etcd_every_published_version_names_only_known_enis() {
    let started = Instant::now();
    let shared = etcd_run(false).await;
    assert_held("etcd", &shared, started);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn etcd_pool_newer_than_status_is_caught() {
    let started = Instant::now();
    let shared = etcd_run(true).await;
    assert_broken("etcd", &shared, started);
}
