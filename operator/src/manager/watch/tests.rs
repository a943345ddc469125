//! kube's watcher on the tower-test mock, and the etcd watch store on a real etcd: the
//! initial list becomes upserts and a `Listed`, watch events become upserts and deletes;
//! from etcd each object carries its key's mod revision, and undecodable ones are counted
//! and skipped.

use std::time::Duration;

use actix::{Actor, Context, Handler};
use http::{Request, Response, StatusCode};
use kube::client::Body;
use meshwork_kvstore::EtcdConfig;
use meshwork_kvstore::metrics::{KvstoreMetrics, PrefixLabels};
use meshwork_lab::etcd::{EtcdOptions, EtcdServer};
use serde_json::json;
use tokio::sync::mpsc;

use super::*;
use crate::cilium_node::CiliumNodeSpec;
use crate::node_store::etcd::key;

const DEADLINE: Duration = Duration::from_secs(10);

/// Forwards every event to a channel.
struct Collector(mpsc::UnboundedSender<NodeEvent>);

impl Actor for Collector {
    type Context = Context<Self>;
}

impl Handler<NodeEvent> for Collector {
    type Result = ();

    fn handle(&mut self, event: NodeEvent, _: &mut Context<Self>) {
        let _ = self.0.send(event);
    }
}

fn object(name: &str, version: &str) -> serde_json::Value {
    json!({
        "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
        "metadata": {"name": name, "resourceVersion": version},
        "spec": {"eni": {"instance-id": format!("i-{name}")}}
    })
}

fn respond(body: Vec<u8>) -> Response<Body> {
    Response::builder()
        .status(StatusCode::OK)
        .body(Body::from(body))
        .expect("response")
}

async fn next(events: &mut mpsc::UnboundedReceiver<NodeEvent>) -> NodeEvent {
    tokio::time::timeout(DEADLINE, events.recv())
        .await
        .expect("an event in time")
        .expect("collector alive")
}

#[actix_rt::test]
async fn kube_list_and_watch_become_node_events() {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let (sender, mut events) = mpsc::unbounded_channel();
    let collector = Collector(sender).start();
    let watching = tokio::spawn(watch_kube(Api::all(client), collector.recipient()));

    let (list, send) = tokio::time::timeout(DEADLINE, handle.next_request())
        .await
        .expect("list in time")
        .expect("list");
    assert_eq!(list.uri().path(), "/apis/cilium.io/v2/ciliumnodes");
    assert!(
        !list
            .uri()
            .query()
            .unwrap_or_default()
            .contains("watch=true")
    );
    let listed = json!({
        "apiVersion": "cilium.io/v2", "kind": "CiliumNodeList",
        "metadata": {"resourceVersion": "10"},
        "items": [object("node-a", "9")]
    });
    send.send_response(respond(serde_json::to_vec(&listed).expect("json")));

    let (watch, send) = tokio::time::timeout(DEADLINE, handle.next_request())
        .await
        .expect("watch in time")
        .expect("watch");
    let query = watch.uri().query().unwrap_or_default().to_owned();
    assert!(query.contains("watch=true"), "{query}");
    assert!(query.contains("resourceVersion=10"), "{query}");
    let mut stream = Vec::new();
    for event in [
        json!({"type": "ADDED", "object": object("node-b", "11")}),
        json!({"type": "DELETED", "object": object("node-a", "12")}),
    ] {
        stream.extend(serde_json::to_vec(&event).expect("json"));
        stream.push(b'\n');
    }
    send.send_response(respond(stream));

    let NodeEvent::Upsert(first) = next(&mut events).await else {
        panic!("expected the listed node first");
    };
    assert_eq!(first.metadata.name.as_deref(), Some("node-a"));
    assert_eq!(first.spec.eni.instance_id, "i-node-a");
    let NodeEvent::Listed(names) = next(&mut events).await else {
        panic!("expected the end of the listing");
    };
    assert_eq!(names.into_iter().collect::<Vec<_>>(), ["node-a"]);
    let NodeEvent::Upsert(added) = next(&mut events).await else {
        panic!("expected node-b added");
    };
    assert_eq!(added.metadata.name.as_deref(), Some("node-b"));
    let NodeEvent::Delete(deleted) = next(&mut events).await else {
        panic!("expected node-a deleted");
    };
    assert_eq!(deleted, "node-a");
    watching.abort();
}

/// A CiliumNode named `name` as stored, pre-allocating `pre`.
fn stored(name: &str, pre: i64) -> Vec<u8> {
    let mut spec = CiliumNodeSpec::default();
    spec.eni.instance_id = format!("i-{name}");
    spec.ipam.pre_allocate = pre;
    serde_json::to_vec(&CiliumNode::new(name, spec)).expect("json")
}

fn upserted(event: NodeEvent) -> CiliumNode {
    match event {
        NodeEvent::Upsert(node) => *node,
        other => panic!("expected an upsert, got {other:?}"),
    }
}

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn etcd_list_and_watch_become_node_events_at_their_mod_revisions() {
    let etcd = EtcdServer::start_with(EtcdOptions {
        data_in_memory: true,
        ..EtcdOptions::default()
    })
    .expect("etcd");
    let backend = EtcdBackend::connect(&EtcdConfig::new([etcd.endpoint()]), DEADLINE)
        .await
        .expect("connect");
    let created = backend
        .put(&key("node-a"), stored("node-a", 8))
        .await
        .expect("put");
    backend
        .put(&key("node-b"), b"{not json".to_vec())
        .await
        .expect("put");
    // Its delete would name a node the operator does not know.
    backend
        .put(&key("node-c"), stored("someone-else", 8))
        .await
        .expect("put");
    let metrics = KvstoreMetrics::default();
    let options = WatchStoreOptions {
        metrics: metrics.clone(),
        ..WatchStoreOptions::new("test")
    };
    let (sender, mut events) = mpsc::unbounded_channel();
    let collector = Collector(sender).start();
    let watching = tokio::spawn(watch_etcd(backend.clone(), collector.recipient(), options));

    let listed = upserted(next(&mut events).await);
    assert_eq!(listed.metadata.name.as_deref(), Some("node-a"));
    assert_eq!(listed.spec.eni.instance_id, "i-node-a");
    assert_eq!(
        listed.metadata.resource_version,
        Some(created.to_string()),
        "the key's mod revision"
    );
    let NodeEvent::Listed(names) = next(&mut events).await else {
        panic!("expected the end of the listing");
    };
    assert_eq!(names.into_iter().collect::<Vec<_>>(), ["node-a"]);
    let rejected = metrics
        .decode_errors
        .get_or_create(&PrefixLabels {
            prefix: KEY_PREFIX.to_owned(),
        })
        .get();
    assert_eq!(rejected, 2, "the malformed and the misnamed object");

    let added = backend
        .put(&key("node-d"), stored("node-d", 8))
        .await
        .expect("put");
    let node_d = upserted(next(&mut events).await);
    assert_eq!(node_d.metadata.name.as_deref(), Some("node-d"));
    assert_eq!(node_d.metadata.resource_version, Some(added.to_string()));
    let changed = backend
        .put(&key("node-a"), stored("node-a", 4))
        .await
        .expect("put");
    let node_a = upserted(next(&mut events).await);
    assert_eq!(node_a.spec.ipam.pre_allocate, 4);
    assert_eq!(node_a.metadata.resource_version, Some(changed.to_string()));
    assert!(backend.delete(&key("node-a")).await.expect("delete"));
    let NodeEvent::Delete(deleted) = next(&mut events).await else {
        panic!("expected node-a deleted");
    };
    assert_eq!(deleted, "node-a");
    watching.abort();
}
