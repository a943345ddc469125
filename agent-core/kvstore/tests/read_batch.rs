//! Reads sent together (`EtcdBackend::with_batched_reads`) against real etcd: each caller's
//! answer is the one it would have read alone, in a few transactions, and a read etcd
//! refuses fails alone.

mod common;

use common::*;
use meshwork_kvstore::{EtcdBackend, KeyWrite, TxnRead};
use meshwork_lab::etcd::{Access, EtcdServer};

/// Clusters of the fixture: a config key and three canaries each.
const CLUSTERS: usize = 300;

async fn seed(backend: &EtcdBackend) {
    let mut writes = vec![KeyWrite::Put {
        key: "cilium/.heartbeat".to_owned(),
        value: b"beat".to_vec(),
        lease: 0,
    }];
    for c in 0..CLUSTERS {
        writes.push(KeyWrite::Put {
            key: format!("cilium/cluster-config/c{c}"),
            value: format!("{{\"id\":{c}}}").into_bytes(),
            lease: 0,
        });
        for kind in ["nodes", "identities", "ip"] {
            writes.push(KeyWrite::Put {
                key: format!("cilium/synced/c{c}/cilium/state/{kind}/v1"),
                value: format!("{c}-{kind}").into_bytes(),
                lease: 0,
            });
        }
    }
    backend.write_batch(&writes, 100).await.unwrap();
}

/// What a remote-cluster loop reads first, for cluster `c`.
async fn first_read(backend: EtcdBackend, c: usize) -> Result<TxnRead, String> {
    let config = format!("cilium/cluster-config/c{c}");
    // Every tenth asks for one canary at most: more are left to a list of their own.
    let limit = if c.is_multiple_of(10) { 1 } else { 64 };
    backend
        .get_all_and_list(
            &["cilium/.has-cluster-config", &config, "cilium/.heartbeat"],
            &format!("cilium/synced/c{c}/"),
            limit,
        )
        .await
        .map_err(|e| e.to_string())
}

/// A read as comparable text: values and listed keys, without the revision.
fn shown(read: &TxnRead) -> String {
    let listed = read.listed.as_ref().map(|page| {
        page.kvs()
            .map(|kv| {
                format!(
                    "{}={}",
                    kv.key_str().unwrap(),
                    String::from_utf8_lossy(kv.value())
                )
            })
            .collect::<Vec<_>>()
    });
    format!("{:?} {listed:?}", read.values)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn overlapping_reads_go_in_few_transactions_and_answer_as_alone() {
    init_tracing();
    let etcd = EtcdServer::start().unwrap();
    let alone = connect(&etcd).await;
    seed(&alone).await;
    let mut expected = Vec::new();
    for c in 0..CLUSTERS {
        expected.push(shown(&first_read(alone.clone(), c).await.unwrap()));
    }

    let batched = connect(&etcd).await.with_batched_reads();
    let txns = || etcd.metric("etcd_mvcc_txn_total").unwrap().unwrap();
    let before = txns();
    let reads: Vec<_> = (0..CLUSTERS)
        .map(|c| tokio::spawn(first_read(batched.clone(), c)))
        .collect();
    for (c, read) in reads.into_iter().enumerate() {
        let read = read.await.unwrap().unwrap();
        assert_eq!(shown(&read), expected[c], "cluster {c}");
        assert_eq!(read.values[1], Some(format!("{{\"id\":{c}}}").into_bytes()));
        assert_eq!(read.listed.is_some(), !c.is_multiple_of(10), "cluster {c}");
    }
    let sent = txns() - before;
    // 300 reads of two keys of their own (the other two shared) in transactions of at most
    // 128 operations: three at least, and the first read went alone.
    assert!(sent <= 12.0, "{sent} transactions for {CLUSTERS} reads");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn a_read_etcd_refuses_fails_alone() {
    init_tracing();
    let etcd = tls_etcd();
    etcd.ctl(&["put", "cilium/cluster-config/c1", "one"])
        .unwrap();
    etcd.ctl(&["put", "secret/key", "hidden"]).unwrap();
    // A user that may read `cilium/` only, as Cilium's remote users may read their own keys.
    let backend = connect_as(&etcd, "remote", "cilium/", Access::Read)
        .await
        .with_batched_reads();
    let reads: Vec<_> = (0..40)
        .map(|i| {
            let backend = backend.clone();
            tokio::spawn(async move {
                let key = if i == 17 {
                    "secret/key"
                } else {
                    "cilium/cluster-config/c1"
                };
                backend.get_all(&[key]).await.map_err(|e| e.to_string())
            })
        })
        .collect();
    for (i, read) in reads.into_iter().enumerate() {
        let read = read.await.unwrap();
        if i == 17 {
            let err = read.unwrap_err();
            assert!(err.contains("permission denied"), "{err}");
        } else {
            assert_eq!(read.unwrap().0, vec![Some(b"one".to_vec())], "read {i}");
        }
    }
}
