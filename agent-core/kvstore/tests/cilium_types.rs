//! Cilium's objects through real etcd: Go field names and lowercase names decode alike;
//! entries that claim another cluster, another ID or an impossible value are rejected,
//! counted and never reach the observer.

mod common;

use std::sync::Arc;

use common::*;
use meshwork_kvstore::{Decoder, Observer, StoreStatus, WatchStore, WatchStoreOptions, keys};
use meshwork_lab::etcd::EtcdServer;
use meshwork_types::{IdentityDecoder, IpCacheDecoder, Node, NodeDecoder};
use tokio::sync::mpsc;

struct Forward<V>(mpsc::UnboundedSender<(String, Arc<V>)>);

impl<V: Send + Sync> Observer<V> for Forward<V> {
    fn on_upsert(&mut self, key: &str, value: &Arc<V>) {
        let _ = self.0.send((key.to_owned(), Arc::clone(value)));
    }

    fn on_delete(&mut self, _key: &str, _value: &Arc<V>) {}
}

/// Lists `prefix` once through a store with `decoder`; returns what reached the observer
/// (sorted by key) and the number of rejected entries.
async fn list_once<D: Decoder>(
    server: &EtcdServer,
    prefix: &str,
    decoder: D,
) -> (Vec<(String, Arc<D::Value>)>, u64) {
    let backend = connect(server).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let store = WatchStore::new(decoder, Forward(tx), WatchStoreOptions::new("cluster1"));
    let status = store.status();
    let run = Running::start(store, &backend, prefix);
    status_until("the list", &status, StoreStatus::listed).await;
    run.stop().await;
    let mut seen = Vec::new();
    while let Ok(item) = rx.try_recv() {
        seen.push(item);
    }
    seen.sort_by(|a, b| a.0.cmp(&b.0));
    (seen, status.decode_errors())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn nodes_decode_with_go_and_lowercase_names_and_foreign_ones_are_rejected() {
    init_tracing();
    let etcd = EtcdServer::start().unwrap();
    let backend = connect(&etcd).await;
    let prefix = format!("{}/cluster1", keys::NODES_PREFIX);
    let go = r#"{"Name":"n1","Cluster":"cluster1","IPAddresses":[{"Type":"InternalIP","IP":"10.1.0.1"}],"IPv4AllocCIDR":{"IP":"10.201.1.0","Mask":"////AA=="},"ClusterID":1,"WireguardPubKey":"k1"}"#;
    let lower = r#"{"name":"n2","cluster":"cluster1","ipaddresses":[{"type":"InternalIP","ip":"10.1.0.2"}],"clusterid":1}"#;
    backend.put(&format!("{prefix}/n1"), go).await.unwrap();
    backend.put(&format!("{prefix}/n2"), lower).await.unwrap();
    // Claims another cluster, another ID, or a name that is not its key.
    backend
        .put(
            &format!("{prefix}/n3"),
            r#"{"Name":"n3","Cluster":"cluster2","ClusterID":1}"#,
        )
        .await
        .unwrap();
    backend
        .put(
            &format!("{prefix}/n4"),
            r#"{"Name":"n4","Cluster":"cluster1","ClusterID":7}"#,
        )
        .await
        .unwrap();
    backend
        .put(
            &format!("{prefix}/n5"),
            r#"{"Name":"other","Cluster":"cluster1","ClusterID":1}"#,
        )
        .await
        .unwrap();
    backend
        .put(&format!("{prefix}/n6"), "{not json")
        .await
        .unwrap();

    let (seen, rejected) = list_once(&etcd, &prefix, NodeDecoder::new("cluster1", Some(1))).await;
    let names: Vec<&str> = seen.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["n1", "n2"]);
    assert_eq!(rejected, 4);
    let n1: &Node = &seen[0].1;
    assert_eq!(n1.wireguard_pub_key, "k1");
    assert_eq!(n1.node_ip(false), Some("10.1.0.1".parse().unwrap()));
    let n2: &Node = &seen[1].1;
    assert_eq!(n2.node_ip(false), Some("10.1.0.2".parse().unwrap()));
    // Re-encoding writes Go's names exactly.
    let written = String::from_utf8(n2.to_json()).unwrap();
    assert!(written.starts_with(r#"{"Name":"n2","Cluster":"cluster1","IPAddresses":[{"Type":"InternalIP","IP":"10.1.0.2"}]"#), "{written}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn identities_outside_the_cluster_range_or_label_are_rejected() {
    init_tracing();
    let etcd = EtcdServer::start().unwrap();
    let backend = connect(&etcd).await;
    let prefix = keys::IDENTITY_ID_PREFIX;
    let labels = "k8s:app=a;k8s:io.cilium.k8s.policy.cluster=cluster1;k8s:io.kubernetes.pod.namespace=default;";
    backend
        .put(&format!("{prefix}/65792"), labels)
        .await
        .unwrap(); // 1 << 16 | 256
    backend
        .put(&format!("{prefix}/131328"), labels)
        .await
        .unwrap(); // cluster 2's range
    backend
        .put(
            &format!("{prefix}/65793"),
            "k8s:app=a;k8s:io.cilium.k8s.policy.cluster=cluster2;",
        )
        .await
        .unwrap();
    backend
        .put(&format!("{prefix}/65794"), "k8s:app=a;")
        .await
        .unwrap();

    let (seen, rejected) =
        list_once(&etcd, prefix, IdentityDecoder::new("cluster1", Some(1))).await;
    let ids: Vec<u32> = seen.iter().map(|(_, identity)| identity.id).collect();
    assert_eq!(ids, [65792]);
    assert_eq!(seen[0].1.labels.to_kvstore_string(), labels);
    assert_eq!(rejected, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn ipcache_entries_with_bad_ips_masks_or_identities_are_rejected() {
    init_tracing();
    let etcd = EtcdServer::start().unwrap();
    let backend = connect(&etcd).await;
    let prefix = keys::IPCACHE_DEFAULT_PREFIX;
    let put = |key: &'static str, value: &'static str| {
        let backend = backend.clone();
        async move {
            backend
                .put(&format!("{prefix}/{key}"), value)
                .await
                .unwrap()
        }
    };
    put("10.201.0.1", r#"{"IP":"10.201.0.1","Mask":null,"HostIP":"10.101.0.1","ID":65792,"Key":0,"Metadata":"m"}"#).await;
    put(
        "10.202.0.0/24",
        r#"{"ip":"10.202.0.0","mask":"////AA==","hostip":"10.101.0.1","id":65793}"#,
    )
    .await;
    put(
        "10.201.0.2",
        r#"{"IP":"not-an-ip","HostIP":"10.101.0.1","ID":65792}"#,
    )
    .await;
    put(
        "10.201.0.3/40",
        r#"{"IP":"10.201.0.3","Mask":"/////wA=","HostIP":"10.101.0.1","ID":65792}"#,
    )
    .await;
    put(
        "10.201.0.4",
        r#"{"IP":"10.201.0.4","HostIP":"10.101.0.1","ID":0}"#,
    )
    .await;
    put(
        "10.201.0.5",
        r#"{"IP":"10.201.0.6","HostIP":"10.101.0.1","ID":65792}"#,
    )
    .await;

    let (seen, rejected) = list_once(&etcd, prefix, IpCacheDecoder::new(Some(1))).await;
    let keys: Vec<&str> = seen.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["10.201.0.1", "10.202.0.0/24"]);
    assert_eq!(seen[1].1.prefix().unwrap().to_string(), "10.202.0.0/24");
    assert_eq!(rejected, 4);
}
