//! The canary-gated watch store manager against a real etcd server.

mod common;

use common::*;
use futures::FutureExt;
use meshwork_kvstore::{KvstoreMetrics, WatchStoreManager, keys};
use meshwork_lab::etcd::EtcdServer;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

fn register_all(
    manager: &mut WatchStoreManager,
    prefixes: &[&'static str],
) -> mpsc::UnboundedReceiver<&'static str> {
    let (tx, rx) = mpsc::unbounded_channel();
    for &prefix in prefixes {
        let tx = tx.clone();
        manager.register(prefix, move |cancel: CancellationToken| {
            // Reported when the manager starts the function (in its own task, in order),
            // not when the spawned future first runs.
            let _ = tx.send(prefix);
            async move { cancel.cancelled().await }.boxed()
        });
    }
    rx
}

async fn started(rx: &mut mpsc::UnboundedReceiver<&'static str>) -> &'static str {
    tokio::time::timeout(EVENT_TIMEOUT, rx.recv())
        .await
        .expect("a function starts before the deadline")
        .expect("channel open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn sync_manager_starts_exactly_the_prefixes_whose_canary_appears() {
    init_tracing();
    let etcd = EtcdServer::start().unwrap();
    let backend = connect(&etcd).await;
    let mut manager = WatchStoreManager::sync(backend.clone(), "foo", KvstoreMetrics::default());
    let mut rx = register_all(&mut manager, &["bar", "bax", "qux", "zzz"]);
    let cancel = CancellationToken::new();
    let run = tokio::spawn(manager.run(cancel.clone()));

    // A canary of another cluster (a sibling prefix) must not count.
    backend
        .put(&keys::canary_key("foo2", "bax"), "t")
        .await
        .unwrap();
    backend
        .put(&keys::canary_key("foo", "bar"), "t")
        .await
        .unwrap();
    backend
        .put(&keys::canary_key("foo", "not-registered"), "t")
        .await
        .unwrap();
    backend
        .put(&keys::canary_key("foo", "qux"), "t")
        .await
        .unwrap();
    // Rewriting a canary must not start its function twice.
    backend
        .put(&keys::canary_key("foo", "bar"), "t2")
        .await
        .unwrap();
    backend
        .put(&keys::canary_key("foo", "zzz"), "t")
        .await
        .unwrap();

    let mut seen = vec![
        started(&mut rx).await,
        started(&mut rx).await,
        started(&mut rx).await,
    ];
    // zzz's canary came last: once it started, every earlier canary has been handled.
    assert_eq!(seen.pop(), Some("zzz"));
    seen.sort_unstable();
    assert_eq!(seen, ["bar", "qux"]);
    assert!(
        rx.try_recv().is_err(),
        "bax has no canary and must not start"
    );

    cancel.cancel();
    tokio::time::timeout(EVENT_TIMEOUT, run)
        .await
        .expect("the manager stops when cancelled")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn immediate_manager_starts_everything() {
    init_tracing();
    let mut manager = WatchStoreManager::immediate("foo");
    let mut rx = register_all(&mut manager, &["bar", "bax", "qux"]);
    let cancel = CancellationToken::new();
    let run = tokio::spawn(manager.run(cancel.clone()));
    let mut seen = vec![
        started(&mut rx).await,
        started(&mut rx).await,
        started(&mut rx).await,
    ];
    seen.sort_unstable();
    assert_eq!(seen, ["bar", "bax", "qux"]);
    cancel.cancel();
    tokio::time::timeout(EVENT_TIMEOUT, run)
        .await
        .expect("the manager stops when cancelled")
        .unwrap();
}
