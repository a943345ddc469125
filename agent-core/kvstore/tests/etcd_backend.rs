//! The etcd backend against real etcd: leases, conditional creates and puts, watches with
//! revisions, TLS with etcd users.

mod common;

use std::time::Duration;

use common::*;
use meshwork_kvstore::{
    ConditionalPut, EtcdBackend, EtcdConfig, KeyWrite, KvstoreError, WatchEvent,
};
use meshwork_lab::etcd::{Access, EtcdOptions, EtcdServer, EtcdTls};

#[tokio::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn leased_keys_vanish_with_their_lease() {
    init_tracing();
    let etcd = EtcdServer::start().unwrap();
    let backend = connect(&etcd).await;
    let lease = backend.lease_grant(30).await.unwrap();
    backend
        .put_with_lease("cilium/state/nodes/v1/c1/n1", "{}", lease)
        .await
        .unwrap();
    assert!(backend.lease_keep_alive_once(lease).await.unwrap());
    assert!(backend.lease_ttl(lease).await.unwrap() > 0);
    assert!(
        backend
            .get("cilium/state/nodes/v1/c1/n1")
            .await
            .unwrap()
            .is_some()
    );
    backend.lease_revoke(lease).await.unwrap();
    assert_eq!(
        backend.get("cilium/state/nodes/v1/c1/n1").await.unwrap(),
        None
    );
    assert!(!backend.lease_keep_alive_once(lease).await.unwrap());
}

#[tokio::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn create_if_absent_creates_once() {
    init_tracing();
    let etcd = EtcdServer::start().unwrap();
    let backend = connect(&etcd).await;
    assert!(backend.create_if_absent("k", "v1").await.unwrap());
    assert!(!backend.create_if_absent("k", "v2").await.unwrap());
    assert_eq!(backend.get("k").await.unwrap().unwrap().0, b"v1");
}

#[tokio::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn put_if_mod_revision_writes_at_the_expected_revision_and_answers_the_current_value() {
    init_tracing();
    let etcd = EtcdServer::start().unwrap();
    let backend = connect(&etcd).await;
    let ConditionalPut::Written { revision: created } =
        backend.put_if_mod_revision("k", "v1", 0).await.unwrap()
    else {
        panic!("0 creates an absent key");
    };
    assert_eq!(
        backend.get("k").await.unwrap(),
        Some((b"v1".to_vec(), created))
    );
    // 0 on an existing key, or a revision it is no longer at: nothing is written, and the
    // conflict carries what is there.
    for stale in [0, created - 1] {
        assert_eq!(
            backend
                .put_if_mod_revision("k", "lost", stale)
                .await
                .unwrap(),
            ConditionalPut::Conflict {
                current: Some((b"v1".to_vec(), created))
            },
            "expected revision {stale}"
        );
    }
    let ConditionalPut::Written { revision: updated } = backend
        .put_if_mod_revision("k", "v2", created)
        .await
        .unwrap()
    else {
        panic!("the key's own revision writes");
    };
    assert!(updated > created);
    assert_eq!(
        backend.get("k").await.unwrap(),
        Some((b"v2".to_vec(), updated))
    );
    assert_eq!(
        backend
            .put_if_mod_revision("gone", "x", updated)
            .await
            .unwrap(),
        ConditionalPut::Conflict { current: None },
        "a key that does not exist is at no revision but 0"
    );
    assert_eq!(backend.get("gone").await.unwrap(), None);
}

#[tokio::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn a_watch_answers_the_revision_of_every_change() {
    init_tracing();
    let etcd = EtcdServer::start().unwrap();
    let backend = connect(&etcd).await;
    let start = backend.put("p/a", "0").await.unwrap();
    let mut watch = backend.watch("p/", start + 1).await.unwrap();
    let put = backend.put("p/a", "1").await.unwrap();
    assert!(backend.delete("p/a").await.unwrap());
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let batch = tokio::time::timeout(EVENT_TIMEOUT, watch.next())
            .await
            .expect("events in time")
            .unwrap()
            .expect("the watch stays open");
        seen.extend(batch);
    }
    assert_eq!(
        seen[0],
        WatchEvent::Put {
            key: b"p/a".to_vec(),
            value: b"1".to_vec(),
            mod_revision: put,
        }
    );
    let WatchEvent::Delete { key, mod_revision } = &seen[1] else {
        panic!("{seen:?}");
    };
    assert_eq!(key, b"p/a");
    assert!(*mod_revision > put, "{seen:?}");

    // From a compacted revision it fails, so the caller re-lists.
    backend.compact(*mod_revision).await.unwrap();
    let mut old = backend.watch("p/", start).await.unwrap();
    let err = tokio::time::timeout(EVENT_TIMEOUT, old.next())
        .await
        .expect("an answer in time")
        .unwrap_err();
    assert!(err.is_compacted(), "{err:?}");
}

#[tokio::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn tls_with_a_read_only_user_reads_and_cannot_write() {
    init_tracing();
    let etcd = tls_etcd();
    etcd.ctl(&["put", "cilium/cluster-config/c1", r#"{"id":1}"#])
        .unwrap();
    let backend = connect_as(&etcd, "remote", "cilium/", Access::Read).await;
    let (value, _) = backend
        .get("cilium/cluster-config/c1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(value, br#"{"id":1}"#);
    let err = backend
        .put("cilium/cluster-config/c1", "x")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("permission denied"), "{err}");
}

#[tokio::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn tls_with_a_wrong_ca_fails_with_a_clear_error() {
    init_tracing();
    let etcd = EtcdServer::start_with(EtcdOptions {
        tls: true,
        ..EtcdOptions::default()
    })
    .unwrap();
    let remote = etcd.add_user("remote", "cilium/", Access::Read).unwrap();
    let other = tempfile::tempdir().unwrap();
    let config = EtcdConfig {
        endpoints: vec![etcd.endpoint()],
        trusted_ca_file: Some(EtcdTls::foreign_ca(other.path()).unwrap()),
        cert_file: Some(remote.cert_file),
        key_file: Some(remote.key_file),
    };
    let err = EtcdBackend::connect(&config, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        matches!(err, KvstoreError::Connect { .. } | KvstoreError::Timeout(_)),
        "{err:?}"
    );
    assert!(err.to_string().contains(&etcd.endpoint()), "{err}");
}

#[tokio::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn missing_tls_files_are_named_in_the_error() {
    let config = EtcdConfig {
        endpoints: vec!["https://127.0.0.1:1".to_owned()],
        trusted_ca_file: Some("/nonexistent/ca.crt".into()),
        ..EtcdConfig::default()
    };
    let err = EtcdBackend::connect(&config, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("trusted-ca-file /nonexistent/ca.crt"),
        "{err}"
    );
}

#[tokio::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn shared_backends_open_one_connection_per_etcd_until_evicted() {
    use meshwork_kvstore::shared::SharedBackends;
    let (a, b) = (EtcdServer::start().unwrap(), EtcdServer::start().unwrap());
    let (config_a, config_b) = (
        EtcdConfig::new([a.endpoint()]),
        EtcdConfig::new([b.endpoint()]),
    );
    let shared = SharedBackends::default();
    let timeout = Duration::from_secs(5);
    // Asked at once, as the remotes of one mesh ask: one connection.
    let (first, second) = tokio::join!(
        shared.connect(&config_a, timeout),
        shared.connect(&config_a, timeout)
    );
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!(first.generation, second.generation);
    first.backend.put("k", "v").await.unwrap();
    assert!(second.backend.get("k").await.unwrap().is_some());
    let other = shared.connect(&config_b, timeout).await.unwrap();
    assert_ne!(
        other.generation, first.generation,
        "another etcd, another connection"
    );
    assert!(other.backend.get("k").await.unwrap().is_none());

    // An eviction of an older connection changes nothing; of the current one, the next
    // connect opens a new one.
    shared.evict(&config_a, first.generation + 100).await;
    assert_eq!(
        shared.connect(&config_a, timeout).await.unwrap().generation,
        first.generation
    );
    shared.evict(&config_a, first.generation).await;
    let again = shared.connect(&config_a, timeout).await.unwrap();
    assert_ne!(again.generation, first.generation);
    assert!(again.backend.get("k").await.unwrap().is_some());
}

#[tokio::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn get_all_reads_present_and_absent_keys_at_one_revision() {
    let server = EtcdServer::start().unwrap();
    let backend = connect(&server).await;
    backend.put("a", "1").await.unwrap();
    let written = backend.put("c", "3").await.unwrap();
    let (values, revision) = backend.get_all(&["a", "b", "c"]).await.unwrap();
    assert_eq!(values, [Some(b"1".to_vec()), None, Some(b"3".to_vec())]);
    assert_eq!(revision, written, "read at the last write's revision");
}

#[tokio::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn list_pages_read_in_place_hold_what_etcd_clients_range_answers() {
    init_tracing();
    let server = EtcdServer::start().unwrap();
    let backend = connect(&server).await;
    let lease = backend.lease_grant(60).await.unwrap();
    for i in 0..40 {
        let key = format!("p/{i:02}");
        // Empty values, values under a lease, keys written twice (version 2).
        let value = if i % 5 == 0 {
            String::new()
        } else {
            "v".repeat(i * 13)
        };
        match i % 3 {
            0 => backend.put_with_lease(&key, value, lease).await.unwrap(),
            1 => {
                backend.put(&key, "first").await.unwrap();
                backend.put(&key, value).await.unwrap();
            }
            _ => {
                backend.put(&key, value).await.unwrap();
            }
        }
    }
    backend.put("q/outside", "x").await.unwrap();

    let options = etcd_client::GetOptions::new().with_prefix();
    let reference = backend
        .client()
        .kv_client()
        .get("p/", Some(options))
        .await
        .unwrap();
    let expected: Vec<_> = reference
        .kvs()
        .iter()
        .map(|kv| {
            let numbers = (
                kv.create_revision(),
                kv.mod_revision(),
                kv.version(),
                kv.lease(),
            );
            (kv.key().to_vec(), kv.value().to_vec(), numbers)
        })
        .collect();
    assert_eq!(expected.len(), 40);
    let revision = reference.header().unwrap().revision();

    let mut listed = Vec::new();
    let mut pages = backend.list("p/", 7);
    let mut first = true;
    while let Some(page) = pages.recv().await {
        let page = page.unwrap();
        assert_eq!(page.revision, revision, "every page at the list's revision");
        if std::mem::take(&mut first) {
            assert_eq!(page.remaining, 40, "the first page counts the whole list");
        }
        listed.extend(page.kvs().map(|kv| {
            let numbers = (
                kv.create_revision(),
                kv.mod_revision(),
                kv.version(),
                kv.lease(),
            );
            (kv.key().to_vec(), kv.value().to_vec(), numbers)
        }));
    }
    assert_eq!(listed, expected);

    // The same keys read in a transaction (the page read along with a cluster config).
    let read = backend
        .get_all_and_list(&["q/outside"], "p/", 64)
        .await
        .unwrap();
    let page = read.listed.expect("40 keys fit the limit");
    let in_txn: Vec<_> = page
        .kvs()
        .map(|kv| {
            let numbers = (
                kv.create_revision(),
                kv.mod_revision(),
                kv.version(),
                kv.lease(),
            );
            (kv.key().to_vec(), kv.value().to_vec(), numbers)
        })
        .collect();
    assert_eq!(in_txn, expected);
    assert_eq!((page.revision, page.remaining), (revision, 40));
}

#[tokio::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn more_lists_than_turns_on_one_connection_all_complete_whole() {
    init_tracing();
    let server = EtcdServer::start().unwrap();
    let backend = connect(&server).await;
    let lists = 3 * meshwork_kvstore::etcd::RANGES_IN_FLIGHT;
    for list in 0..lists {
        let writes: Vec<_> = (0..25)
            .map(|i| KeyWrite::Put {
                key: format!("l/{list:03}/{i:02}"),
                value: format!("{i}").into_bytes(),
                lease: 0,
            })
            .collect();
        backend.write_batch(&writes, 100).await.unwrap();
    }
    // One turn held meanwhile, as a raw reader on the same connection holds one.
    let held = backend.range_turn().await;
    let tasks: Vec<_> = (0..lists)
        .map(|list| {
            let backend = backend.clone();
            tokio::spawn(async move {
                // Pages of 10: every list takes three turns, given back between pages.
                let mut pages = backend.list(&format!("l/{list:03}/"), 10);
                let mut keys = Vec::new();
                while let Some(page) = pages.recv().await {
                    keys.extend(
                        page.unwrap()
                            .kvs()
                            .map(|kv| kv.key_str().unwrap().to_owned()),
                    );
                }
                keys
            })
        })
        .collect();
    for (list, task) in tasks.into_iter().enumerate() {
        let keys = tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("a list waited for a turn that was never given back")
            .unwrap();
        let expected: Vec<_> = (0..25).map(|i| format!("l/{list:03}/{i:02}")).collect();
        assert_eq!(keys, expected, "list {list}");
    }
    drop(held);
}
