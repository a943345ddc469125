//! The restartable watch store against real etcd servers, mirroring Cilium's own tests; the
//! semantics run on both tables (keys beside values, values that name their keys).

mod common;

use std::sync::Arc;

use common::*;
use meshwork_kvstore::{Observer, RawDecoder, StoreStatus, WatchStore, WatchStoreOptions};
use meshwork_lab::etcd::{EtcdOptions, EtcdServer};
use tokio::sync::mpsc;

/// Runs each store test on both tables.
macro_rules! on_both_tables {
    ($($test:ident),* $(,)?) => {
        mod by_key {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs real etcd: `cargo xtask test` runs it"]
                async fn $test() {
                    super::$test::<super::TextByKey>().await;
                }
            )*
        }
        mod by_value {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs real etcd: `cargo xtask test` runs it"]
                async fn $test() {
                    super::$test::<super::TextByValue>().await;
                }
            )*
        }
    };
}

on_both_tables!(
    two_runs_on_different_data_delete_the_stale_key_at_list_done,
    drain_deletes_every_key_and_the_store_restarts,
    sync_callbacks_run_once_in_order_after_list_done,
    invalid_entries_are_counted_and_dropped_keeping_the_old_value,
    compaction_before_the_watch_relists_without_missing_a_delete,
);

async fn two_runs_on_different_data_delete_the_stale_key_at_list_done<K: Kind>() {
    init_tracing();
    let etcd_a = EtcdServer::start().unwrap();
    let etcd_b = EtcdServer::start().unwrap();
    let a = connect(&etcd_a).await;
    let b = connect(&etcd_b).await;
    a.put("foo/bar/key1", "value1A").await.unwrap();
    a.put("foo/bar/key2", "value2A").await.unwrap();
    // A sibling prefix must not leak into the store.
    a.put("foo/barbaz/key9", "sibling").await.unwrap();

    let (store, mut rx) = kind_store::<K>("qux");
    let status = store.status();
    assert_eq!(status.entries(), 0);
    assert!(!status.listed());

    let run = Running::start(store, &a, "foo/bar");
    assert_eq!(next(&mut rx).await, upsert("key1", "value1A"));
    assert_eq!(next(&mut rx).await, upsert("key2", "value2A"));
    status_until("first sync", &status, StoreStatus::listed).await;
    a.put("foo/bar/key2", "value2B").await.unwrap();
    a.put("foo/bar/key3", "value3A").await.unwrap();
    a.delete("foo/bar/key4").await.unwrap(); // unknown key: no event
    a.delete("foo/bar/key3").await.unwrap();
    assert_eq!(next(&mut rx).await, upsert("key2", "value2B"));
    assert_eq!(next(&mut rx).await, upsert("key3", "value3A"));
    assert_eq!(next(&mut rx).await, delete("key3", "value3A"));
    assert_eq!(status.entries(), 2);
    let store = run.stop().await;
    assert!(!status.listed(), "a stopped store is no longer synced");
    assert_drained(&mut rx);

    // The second run reads another cluster's data: key1 changed, key4 new, key2 gone.
    b.put("foo/bar/key1", "value1C").await.unwrap();
    b.put("foo/bar/key4", "value4A").await.unwrap();
    let run = Running::start(store, &b, "foo/bar/");
    assert_eq!(next(&mut rx).await, upsert("key1", "value1C"));
    assert_eq!(next(&mut rx).await, upsert("key4", "value4A"));
    assert_eq!(next(&mut rx).await, delete("key2", "value2B"));
    status_until("second sync", &status, StoreStatus::listed).await;
    b.put("foo/bar/key2", "value2C").await.unwrap();
    assert_eq!(next(&mut rx).await, upsert("key2", "value2C"));
    assert_eq!(status.entries(), 3);
    run.stop().await;
    assert_drained(&mut rx);
}

async fn drain_deletes_every_key_and_the_store_restarts<K: Kind>() {
    init_tracing();
    let etcd = EtcdServer::start().unwrap();
    let backend = connect(&etcd).await;
    backend.put("foo/bar/key1", "value1A").await.unwrap();
    backend.put("foo/bar/key2", "value2A").await.unwrap();

    let (store, mut rx) = kind_store::<K>("qux");
    let status = store.status();
    let run = Running::start(store, &backend, "foo/bar");
    assert_eq!(next(&mut rx).await, upsert("key1", "value1A"));
    assert_eq!(next(&mut rx).await, upsert("key2", "value2A"));
    status_until("sync", &status, StoreStatus::listed).await;
    backend.put("foo/bar/key3", "value3A").await.unwrap();
    backend.delete("foo/bar/key2").await.unwrap();
    assert_eq!(next(&mut rx).await, upsert("key3", "value3A"));
    assert_eq!(next(&mut rx).await, delete("key2", "value2A"));
    let mut store = run.stop().await;

    store.drain();
    assert_eq!(
        next_n_sorted(&mut rx, 2).await,
        vec![delete("key1", "value1A"), delete("key3", "value3A")]
    );
    assert_eq!(status.entries(), 0);
    assert!(store.is_empty());

    // After a drain the store starts over: everything listed is new again.
    let run = Running::start(store, &backend, "foo/bar");
    assert_eq!(next(&mut rx).await, upsert("key1", "value1A"));
    assert_eq!(next(&mut rx).await, upsert("key3", "value3A"));
    let mut store = run.stop().await;
    store.drain();
    assert_eq!(
        next_n_sorted(&mut rx, 2).await,
        vec![delete("key1", "value1A"), delete("key3", "value3A")]
    );
    assert_drained(&mut rx);
}

async fn sync_callbacks_run_once_in_order_after_list_done<K: Kind>() {
    init_tracing();
    let mut etcd = EtcdServer::start().unwrap();
    let backend = connect(&etcd).await;
    backend.put("foo/bar/key1", "value1A").await.unwrap();

    let (mut store, mut rx) = kind_store::<K>("qux");
    let status = store.status();
    for name in ["1", "2"] {
        let tx = store.observer().tx.clone();
        store.on_sync(move || {
            let _ = tx.send(Seen::Callback(name));
        });
    }

    // Run 1 never completes its list (etcd is down): no callback, not synced.
    etcd.stop();
    let run = Running::start(store, &backend, "foo/bar");
    status_until("a list error", &status, |s| s.last_error().is_some()).await;
    let store = run.stop().await;
    assert!(!status.listed());
    assert_drained(&mut rx);

    // Run 2 lists: the callbacks run in order after the listed keys, before later events.
    etcd.restart().unwrap();
    let backend = connect(&etcd).await;
    let run = Running::start(store, &backend, "foo/bar");
    assert_eq!(next(&mut rx).await, upsert("key1", "value1A"));
    assert_eq!(next(&mut rx).await, Seen::Callback("1"));
    assert_eq!(next(&mut rx).await, Seen::Callback("2"));
    backend.put("foo/bar/key2", "value2A").await.unwrap();
    assert_eq!(next(&mut rx).await, upsert("key2", "value2A"));
    let store = run.stop().await;

    // Run 3 (a reconnect): the stale key goes, the callbacks do not run again.
    backend.delete("foo/bar/key2").await.unwrap();
    let run = Running::start(store, &backend, "foo/bar");
    assert_eq!(next(&mut rx).await, delete("key2", "value2A"));
    status_until("third sync", &status, StoreStatus::listed).await;
    backend.put("foo/bar/key3", "value3A").await.unwrap();
    assert_eq!(next(&mut rx).await, upsert("key3", "value3A"));
    run.stop().await;
    assert_drained(&mut rx);
}

async fn invalid_entries_are_counted_and_dropped_keeping_the_old_value<K: Kind>() {
    init_tracing();
    let etcd = EtcdServer::start().unwrap();
    let backend = connect(&etcd).await;
    backend.put("foo/bar/key1", "good").await.unwrap();
    backend
        .put("foo/bar/key2", "bad-from-the-start")
        .await
        .unwrap();

    let (store, mut rx) = kind_store::<K>("qux");
    let status = store.status();
    let run = Running::start(store, &backend, "foo/bar");
    assert_eq!(next(&mut rx).await, upsert("key1", "good"));
    status_until("sync", &status, StoreStatus::listed).await;
    assert_eq!(status.decode_errors(), 1);
    backend.put("foo/bar/key1", "bad-update").await.unwrap();
    backend.put("foo/bar/key1", "good2").await.unwrap();
    // The bad update produced no event: the next one is the good value that followed it.
    assert_eq!(next(&mut rx).await, upsert("key1", "good2"));
    assert_eq!(status.decode_errors(), 2);
    let store = run.stop().await;

    // A restart that lists a now-invalid value keeps the old one instead of deleting it.
    backend.put("foo/bar/key1", "bad-again").await.unwrap();
    backend.put("foo/bar/key5", "v5").await.unwrap();
    let run = Running::start(store, &backend, "foo/bar");
    assert_eq!(next(&mut rx).await, upsert("key5", "v5"));
    status_until("sync", &status, StoreStatus::listed).await;
    let store = run.stop().await;
    assert_drained(&mut rx);
    assert_eq!(
        store.get("key1").map(|v| v.to_string()).as_deref(),
        Some("good2")
    );
    assert_eq!(store.get("key2"), None);
    assert_eq!(status.decode_errors(), 4);
}

/// Blocks inside the list on the key `zz-gate` until the test releases it, so the test can
/// change and compact etcd between the list and the watch that follows it.
struct GateRecorder {
    inner: Recorder,
    reached: Option<std::sync::mpsc::Sender<()>>,
    release: std::sync::mpsc::Receiver<()>,
}

impl<V: std::fmt::Display + Send + Sync> Observer<V> for GateRecorder {
    fn on_upsert(&mut self, key: &str, value: &Arc<V>) {
        self.inner.on_upsert(key, value);
        if key == "zz-gate"
            && let Some(reached) = self.reached.take()
        {
            reached.send(()).unwrap();
            self.release
                .recv_timeout(EVENT_TIMEOUT)
                .expect("the test releases the gate");
        }
    }

    fn on_delete(&mut self, key: &str, value: &Arc<V>) {
        self.inner.on_delete(key, value);
    }
}

async fn compaction_before_the_watch_relists_without_missing_a_delete<K: Kind>() {
    init_tracing();
    let etcd = EtcdServer::start().unwrap();
    let backend = connect(&etcd).await;
    backend.put("foo/bar/a", "A").await.unwrap();
    backend.put("foo/bar/b", "B").await.unwrap();
    backend.put("foo/bar/zz-gate", "gate").await.unwrap();

    let (tx, mut rx) = mpsc::unbounded_channel();
    let (reached_tx, reached_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel();
    let observer = GateRecorder {
        inner: Recorder { tx: tx.clone() },
        reached: Some(reached_tx),
        release: release_rx,
    };
    let mut store = K::store(observer, fast_retry("qux"));
    store.on_sync(move || {
        let _ = tx.send(Seen::Callback("synced"));
    });
    let status = store.status();
    let run = Running::start(store, &backend, "foo/bar");

    tokio::task::spawn_blocking(move || reached_rx.recv_timeout(EVENT_TIMEOUT))
        .await
        .unwrap()
        .expect("the list reaches the gate");
    // The list read revision R. Delete a key, add one and compact past R: the watch from
    // R + 1 must fail, and only a fresh list can reveal the delete.
    backend.delete("foo/bar/a").await.unwrap();
    let revision = backend.put("foo/bar/c", "C").await.unwrap();
    backend.compact(revision).await.unwrap();
    release_tx.send(()).unwrap();

    assert_eq!(next(&mut rx).await, upsert("a", "A"));
    assert_eq!(next(&mut rx).await, upsert("b", "B"));
    assert_eq!(next(&mut rx).await, upsert("zz-gate", "gate"));
    assert_eq!(next(&mut rx).await, Seen::Callback("synced"));
    assert_eq!(next(&mut rx).await, upsert("c", "C"));
    assert_eq!(next(&mut rx).await, delete("a", "A"));
    status_until("the relist is counted", &status, |s| s.relists() == 1).await;
    backend.put("foo/bar/d", "D").await.unwrap();
    assert_eq!(next(&mut rx).await, upsert("d", "D"));
    run.stop().await;
    assert_drained(&mut rx);
}

/// Counts entries without keeping them.
struct Counter(u64);

impl Observer<Vec<u8>> for Counter {
    fn on_upsert(&mut self, _key: &str, _value: &Arc<Vec<u8>>) {
        self.0 += 1;
    }

    fn on_delete(&mut self, _key: &str, _value: &Arc<Vec<u8>>) {
        self.0 -= 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn lists_100k_keys_in_pages_under_the_4_mib_limit() {
    init_tracing();
    let etcd = EtcdServer::start_with(EtcdOptions {
        max_txn_ops: Some(10_000),
        ..EtcdOptions::default()
    })
    .unwrap();
    let backend = connect(&etcd).await;
    let pairs: Vec<(String, Vec<u8>)> = (0..100_000u32)
        .map(|i| {
            let ip = format!("10.{}.{}.{}", i >> 16, (i >> 8) & 0xff, i & 0xff);
            let value = format!(
                r#"{{"IP":"{ip}","Mask":null,"HostIP":"192.168.{}.1","ID":{},"Key":0,"Metadata":"cilium-global:default:node-{}:{i}","K8sNamespace":"default","K8sPodName":"pod-{i}","NamedPorts":null}}"#,
                i % 250,
                100_000 + i % 5000,
                i % 250
            );
            (format!("cilium/state/ip/v1/default/{ip}"), value.into_bytes())
        })
        .collect();
    let total: usize = pairs.iter().map(|(k, v)| k.len() + v.len()).sum();
    assert!(
        total > 4 * 1024 * 1024,
        "the data set must not fit one response ({total} bytes)"
    );
    backend.put_many(pairs, 5000).await.unwrap();

    // One page for everything would be refused by the client; the store must page (and
    // halve an oversized page) to get through.
    let mut options = WatchStoreOptions::new("c1");
    options.page_size = 100_000;
    let store = WatchStore::new(RawDecoder, Counter(0), options);
    let status = store.status();
    let run = Running::start(store, &backend, "cilium/state/ip/v1/default");
    status_until("100k keys listed", &status, StoreStatus::listed).await;
    let store = run.stop().await;
    assert_eq!(status.entries(), 100_000);
    assert_eq!(store.observer().0, 100_000);
    assert_eq!(status.decode_errors(), 0);
    assert_eq!(status.relists(), 0);
}

/// Range requests etcd has answered.
fn ranges(etcd: &EtcdServer) -> f64 {
    let name = r#"grpc_server_handled_total{grpc_code="OK",grpc_method="Range",grpc_service="etcdserverpb.KV",grpc_type="unary"}"#;
    etcd.metric(name).unwrap().unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn a_list_read_ahead_is_the_first_list_and_the_watch_follows_from_its_revision() {
    init_tracing();
    let etcd = EtcdServer::start().unwrap();
    let backend = connect(&etcd).await;
    backend.put("foo/bar/key1", "value1A").await.unwrap();
    let read = backend
        .get_all_and_list(&["foo/config"], "foo/bar/", 64)
        .await
        .unwrap();
    assert_eq!(read.values, [None]);
    let page = read.listed.expect("one key fits the limit");
    // Written after the read: only a watch from the read's revision sees it.
    backend.put("foo/bar/key2", "value2A").await.unwrap();

    let before = ranges(&etcd);
    let (mut store, mut rx) = text_store("qux");
    store.list_ahead(page);
    let status = store.status();
    let run = Running::start(store, &backend, "foo/bar/");
    assert_eq!(next(&mut rx).await, upsert("key1", "value1A"));
    assert_eq!(next(&mut rx).await, upsert("key2", "value2A"));
    assert!(status.listed());
    assert_eq!(ranges(&etcd), before, "the store listed nothing itself");
    run.stop().await;

    // The negative control: without the page the store lists.
    let (store, mut rx) = text_store("qux");
    let run = Running::start(store, &backend, "foo/bar/");
    next_n_sorted(&mut rx, 2).await;
    assert!(ranges(&etcd) > before);
    run.stop().await;

    // A prefix with more keys than the limit is not read ahead.
    let read = backend.get_all_and_list(&[], "foo/bar/", 1).await.unwrap();
    assert!(read.listed.is_none());
}
