//! The writer against a real etcd, every event under `cilium/` recorded by a watch: keys go
//! under leases of at most 1000 keys; an unchanged value is not written again; a restarted
//! writer adopts what the one before it wrote (its SIGKILL leaves the leases running), so
//! republishing the same state shows a reader no event at all; a key whose lease vanished is
//! written again.

use std::time::Duration;

mod common;

use common::{connect, events_since};
use meshwork_apiserver::state::{ClusterState, EndpointSpec, KeyChange, NodeSpec};
use meshwork_apiserver::writer::{self, MAX_KEYS_PER_LEASE, Writer};

use meshwork_lab::etcd::EtcdServer;
use meshwork_types::{Address, AddressType, IpPrefix, Label};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(900);

/// A cluster of one node with `endpoints` pods in 10.1.0.0/16.
fn cluster_state(endpoints: u32) -> ClusterState {
    let now = Instant::now();
    let mut state = ClusterState::new("c1", 1, 255);
    state
        .publish_node(NodeSpec {
            name: "n1".to_owned(),
            addresses: vec![Address {
                address_type: AddressType::InternalIp,
                ip: Some("192.0.2.1".parse().unwrap()),
            }],
            ipv4_cidrs: vec!["10.1.0.0/16".parse::<IpPrefix>().unwrap()],
            ipv6_cidrs: vec![],
            ipv4_health_ip: None,
            ipv6_health_ip: None,
            wireguard_public_key: String::new(),
            encryption_key: 0,
            labels: Default::default(),
            eni_ipam: false,
        })
        .unwrap();
    for i in 0..endpoints {
        let endpoint = EndpointSpec {
            id: u64::from(i) + 1,
            ips: vec![format!("10.1.{}.{}", i / 250, i % 250 + 1).parse().unwrap()],
            labels: vec![Label::parse(&format!("k8s:app=app{}", i % 10))],
            named_ports: vec![],
            pod_namespace: "default".to_owned(),
            pod_name: format!("pod-{i}"),
        };
        state.put_endpoint("n1", endpoint, now).unwrap();
    }
    state
}

#[tokio::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn keys_go_under_leases_of_at_most_1000_keys_and_unchanged_values_are_not_rewritten() {
    let server = EtcdServer::start().unwrap();
    let backend = connect(&server).await;
    let mut state = cluster_state(2500);
    let changes: Vec<KeyChange> = state.take_changes();
    // 2500 ipcache keys, 10 identities and the node.
    assert_eq!(changes.len(), 2511);
    let mut writer = Writer::new(backend.clone(), TTL);
    assert_eq!(writer.apply(&changes).await.unwrap(), 2511);
    let usage = writer.lease_usage();
    assert_eq!(usage.len(), 3, "{usage:?}");
    assert!(
        usage.iter().all(|(_, n)| *n <= MAX_KEYS_PER_LEASE),
        "{usage:?}"
    );
    for (lease, _) in &usage {
        assert!(backend.lease_ttl(*lease).await.unwrap() > 0);
    }

    let revision = backend.revision("cilium/").await.unwrap();
    assert_eq!(writer.apply(&changes).await.unwrap(), 0);
    assert!(events_since(&backend, revision + 1).await.is_empty());

    // The negative control: a changed value is written.
    let (key, value) = changes[0].clone();
    let mut changed = value.unwrap();
    changed.extend_from_slice(b" ");
    let revision = backend.revision("cilium/").await.unwrap();
    assert_eq!(
        writer.apply(&[(key.clone(), Some(changed))]).await.unwrap(),
        1
    );
    let events = events_since(&backend, revision + 1).await;
    assert_eq!(events.len(), 1, "{events:?}");
}

#[tokio::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn a_restarted_writer_adopts_everything_and_republishing_shows_no_event() {
    let server = EtcdServer::start().unwrap();
    let backend = connect(&server).await;
    let mut state = cluster_state(1200);
    let changes = state.take_changes();
    let mut first = Writer::new(backend.clone(), TTL);
    first.apply(&changes).await.unwrap();
    let revision = backend.revision("cilium/").await.unwrap();
    // As a SIGKILL: nothing revoked, nothing deleted.
    drop(first);

    let (mut second, found) = writer::adopt(backend.clone(), "c1", TTL).await.unwrap();
    assert_eq!(found.len(), changes.len());
    assert_eq!(second.len(), changes.len());
    let mut republished = cluster_state(1200);
    assert_eq!(second.apply(&republished.take_changes()).await.unwrap(), 0);
    assert_eq!(
        second.keep_alive().await.unwrap(),
        0,
        "the old leases live on"
    );
    let events = events_since(&backend, revision + 1).await;
    assert!(events.is_empty(), "a reader saw {} events", events.len());

    // The negative control: a writer that does not adopt writes every key again.
    let mut fresh = Writer::new(backend.clone(), TTL);
    assert_eq!(fresh.apply(&changes).await.unwrap(), changes.len());
}

#[tokio::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn the_keys_of_a_vanished_lease_are_written_again() {
    let server = EtcdServer::start().unwrap();
    let backend = connect(&server).await;
    let mut state = cluster_state(1500);
    let changes = state.take_changes();
    let mut writer = Writer::new(backend.clone(), TTL);
    writer.apply(&changes).await.unwrap();
    let (lost, on_it) = writer.lease_usage()[0];
    // As an expiry: etcd deletes every key on the lease.
    backend.lease_revoke(lost).await.unwrap();
    let (key, value) = changes.last().unwrap().clone();
    assert_eq!(writer.keep_alive().await.unwrap(), on_it);
    for (key, value) in changes.iter().filter_map(|(k, v)| Some((k, v.as_ref()?))) {
        let stored = backend.get(key).await.unwrap().map(|(v, _)| v);
        assert_eq!(stored.as_ref(), Some(value), "{key}");
    }
    assert!(writer.lease_usage().iter().all(|(l, _)| *l != lost));
    assert_eq!(writer.written(&key), value.as_deref());
}

#[tokio::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn after_a_partly_failed_write_what_landed_is_recorded_and_the_rest_is_sent_again() {
    let server = EtcdServer::start().unwrap();
    let backend = connect(&server).await;
    let mut writer = Writer::new(backend.clone(), TTL);
    let put = |k: &str, v: &str| (format!("cilium/state/ip/v1/default/{k}"), Some(v.into()));
    let delete = |k: &str| (format!("cilium/state/ip/v1/default/{k}"), None);
    let exists = async |k: &str| {
        backend
            .get(&format!("cilium/state/ip/v1/default/{k}"))
            .await
            .unwrap()
            .is_some()
    };
    writer
        .apply(&[put("10.0.0.1", "a"), put("10.0.0.2", "b")])
        .await
        .unwrap();
    let (lease, _) = writer.lease_usage()[0];
    // The lease goes behind the writer's back: the next put on it fails, a delete does not.
    backend.lease_revoke(lease).await.unwrap();
    let partly: Vec<KeyChange> = vec![delete("10.0.0.1"), put("10.0.0.3", "c")];
    assert!(writer.apply(&partly).await.is_err());
    // The delete landed and is recorded: the lease's rewrite brings back 10.0.0.2 and the
    // failed 10.0.0.3, not the deleted 10.0.0.1.
    writer.keep_alive().await.unwrap();
    assert!(!exists("10.0.0.1").await, "a landed delete was undone");
    assert!(exists("10.0.0.2").await);
    assert!(
        exists("10.0.0.3").await,
        "the failed put was not written again"
    );
    // And putting the deleted key back is sent, not skipped as unchanged.
    writer.apply(&[put("10.0.0.1", "a")]).await.unwrap();
    assert!(exists("10.0.0.1").await);
}
