//! Shared watches against real etcd: many watches of one backend are one etcd watcher, each
//! sees exactly its own events, and whatever the shared watch cannot serve gets a watch of
//! its own.

mod common;

use std::time::Duration;

use common::*;
use meshwork_kvstore::{Watch, WatchEvent};
use meshwork_lab::etcd::{Access, EtcdServer};

const WATCHERS: &str = "etcd_debugging_mvcc_watcher_total";

fn watchers(etcd: &EtcdServer) -> f64 {
    etcd.metric(WATCHERS)
        .unwrap()
        .expect("etcd counts its watchers")
}

/// The next batch, within the deadline.
async fn next(watch: &mut Watch) -> Vec<WatchEvent> {
    tokio::time::timeout(EVENT_TIMEOUT, watch.next())
        .await
        .expect("events in time")
        .unwrap()
        .expect("the watch stays open")
}

fn keys(batch: &[WatchEvent]) -> Vec<Vec<u8>> {
    batch.iter().map(|event| event.key().to_vec()).collect()
}

#[tokio::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn twenty_watches_of_a_sharing_backend_are_one_etcd_watcher_each_seeing_its_own() {
    init_tracing();
    let etcd = EtcdServer::start().unwrap();
    let writer = connect(&etcd).await;
    let start = writer.put("cilium/.heartbeat", "0").await.unwrap() + 1;
    let before = watchers(&etcd);

    let shared = connect(&etcd).await.with_shared_watches(&["cilium/"]);
    let mut watches = Vec::new();
    for i in 0..20 {
        let watch = shared
            .watch(&format!("cilium/cache/ip/v1/c{i}/"), start)
            .await
            .unwrap();
        assert!(watch.is_shared(), "watch {i}");
        watches.push(watch);
    }
    assert_eq!(watchers(&etcd), before + 1.0, "one etcd watcher for twenty");

    // The negative control: the same watches without sharing are twenty watchers.
    let plain = connect(&etcd).await;
    let mut own = Vec::new();
    for i in 0..20 {
        let watch = plain
            .watch(&format!("cilium/cache/ip/v1/c{i}/"), start)
            .await
            .unwrap();
        assert!(!watch.is_shared());
        own.push(watch);
    }
    assert_eq!(watchers(&etcd), before + 21.0);

    // c1/ and c10/ share the start of their names, not their keys.
    for i in (0..20).rev() {
        writer
            .put(&format!("cilium/cache/ip/v1/c{i}/10.0.0.{i}"), "{}")
            .await
            .unwrap();
    }
    for (i, (shared, own)) in watches.iter_mut().zip(&mut own).enumerate() {
        let expected = vec![format!("cilium/cache/ip/v1/c{i}/10.0.0.{i}").into_bytes()];
        assert_eq!(keys(&next(shared).await), expected, "shared watch {i}");
        assert_eq!(keys(&next(own).await), expected, "own watch {i}");
    }

    // Dropped shares leave; the last one leaving ends the etcd watcher.
    drop(watches);
    drop(own);
    writer.put("cilium/cache/ip/v1/c0/x", "{}").await.unwrap();
    let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
    while watchers(&etcd) > before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "etcd still holds {} watchers",
            watchers(&etcd)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn a_watch_from_a_revision_the_shared_watch_has_passed_gets_its_own_and_misses_nothing() {
    init_tracing();
    let etcd = EtcdServer::start().unwrap();
    let writer = connect(&etcd).await;
    let start = writer.put("cilium/.heartbeat", "0").await.unwrap() + 1;
    let shared = connect(&etcd).await.with_shared_watches(&["cilium/"]);
    let mut first = shared.watch("cilium/a/", start).await.unwrap();
    assert!(first.is_shared());
    let a = writer.put("cilium/a/x", "1").await.unwrap();
    let b = writer.put("cilium/b/y", "1").await.unwrap();
    assert_eq!(keys(&next(&mut first).await), [b"cilium/a/x".to_vec()]);

    // The shared watch has handed out revision `a`: a watch from it must not join.
    let mut late = shared.watch("cilium/b/", a).await.unwrap();
    assert!(!late.is_shared());
    let batch = next(&mut late).await;
    assert_eq!(keys(&batch), [b"cilium/b/y".to_vec()]);
    assert!(
        batch[0].mod_revision() == b && matches!(batch[0], WatchEvent::Put { .. }),
        "{batch:?}"
    );
    // One from after everything written joins.
    let mut joined = shared.watch("cilium/b/", b + 1).await.unwrap();
    assert!(joined.is_shared());
    writer.put("cilium/b/z", "1").await.unwrap();
    assert_eq!(keys(&next(&mut joined).await), [b"cilium/b/z".to_vec()]);
    // Outside the root, and from "now", a watch is always its own.
    assert!(!shared.watch("other/", b + 1).await.unwrap().is_shared());
    assert!(!shared.watch("cilium/b/", 0).await.unwrap().is_shared());
}

#[tokio::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn a_compacted_shared_watch_fails_its_shares_and_the_next_watch_starts_a_new_one() {
    init_tracing();
    let etcd = EtcdServer::start().unwrap();
    let writer = connect(&etcd).await;
    let start = writer.put("cilium/a/x", "0").await.unwrap();
    let now = writer.put("cilium/a/x", "1").await.unwrap();
    writer.compact(now).await.unwrap();
    let shared = connect(&etcd).await.with_shared_watches(&["cilium/"]);

    let mut old = shared.watch("cilium/a/", start).await.unwrap();
    assert!(old.is_shared());
    let err = tokio::time::timeout(EVENT_TIMEOUT, old.next())
        .await
        .expect("an answer in time")
        .unwrap_err();
    assert!(err.is_compacted(), "{err:?}");

    let mut fresh = shared.watch("cilium/a/", now + 1).await.unwrap();
    assert!(fresh.is_shared());
    writer.put("cilium/a/x", "2").await.unwrap();
    assert_eq!(keys(&next(&mut fresh).await), [b"cilium/a/x".to_vec()]);
}

#[tokio::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn a_user_who_may_read_only_part_of_the_root_watches_each_prefix_alone() {
    init_tracing();
    let etcd = tls_etcd();
    etcd.ctl(&["put", "cilium/state/ip/v1/default/a", "{}"])
        .unwrap();
    // Every change since etcd's first revision.
    let start = 1;
    let backend = connect_as(&etcd, "remote", "cilium/state/", Access::Read)
        .await
        .with_shared_watches(&["cilium/"]);
    let mut watch = backend
        .watch("cilium/state/ip/v1/default/", start)
        .await
        .unwrap();
    assert!(!watch.is_shared(), "etcd refuses the watch on cilium/");
    assert_eq!(
        keys(&next(&mut watch).await),
        [b"cilium/state/ip/v1/default/a".to_vec()]
    );
}
