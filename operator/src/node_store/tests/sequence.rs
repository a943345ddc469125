//! The Kubernetes backend's exact request sequence, asserted request by request.

use std::sync::{Arc, RwLock};

use http::{Method, StatusCode};

use super::apiserver::{Verifier, failure, mock_client, node_path, respond, with_version};
use crate::cilium_node::{CiliumNode, CiliumNodeSpec};
use crate::instances::InstanceCache;
use crate::model::Eni;
use crate::node_allocator::NodeSpec;
use crate::node_store::{KubeStore, LiveNode, NodeStore, StoreError};

const NODE: &str = "node-a";

/// A node with one ENI holding one address.
fn live_node() -> LiveNode {
    let mut cache = InstanceCache::new();
    let eni = Eni {
        id: "eni-1".to_owned(),
        number: 1,
        addresses: vec!["10.213.0.5".parse().expect("address")],
        ..Eni::default()
    };
    cache.upsert_eni("i-a", eni);
    let mut spec = NodeSpec {
        name: NODE.to_owned(),
        ..NodeSpec::default()
    };
    spec.eni.instance_id = "i-a".to_owned();
    LiveNode::new(Arc::new(RwLock::new(cache)), spec)
}

fn stored(version: u64) -> CiliumNode {
    let mut spec = CiliumNodeSpec::default();
    spec.eni.instance_id = "i-a".to_owned();
    with_version(CiliumNode::new(NODE, spec), version)
}

/// The answer to a write: what was sent, at `version`.
fn accept(version: u64) -> impl FnOnce(Option<CiliumNode>) -> http::Response<kube::client::Body> {
    move |sent| {
        let node = with_version(sent.expect("a body"), version);
        respond(StatusCode::OK, &serde_json::to_value(node).expect("json"))
    }
}

fn assert_status_write(sent: Option<&CiliumNode>, version: &str) {
    let sent = sent.expect("a body");
    assert_eq!(sent.metadata.resource_version.as_deref(), Some(version));
    let status = sent.status.as_ref().expect("status in a status write");
    assert!(
        status.eni.enis.contains_key("eni-1"),
        "status carries the ENI"
    );
}

fn assert_spec_write(sent: Option<&CiliumNode>, version: &str) {
    let sent = sent.expect("a body");
    assert_eq!(sent.metadata.resource_version.as_deref(), Some(version));
    assert_eq!(sent.spec.ipam.pool["10.213.0.5"].resource, "eni-1");
}

#[tokio::test]
async fn status_is_written_before_spec() {
    let (client, handle) = mock_client();
    let server = tokio::spawn(async move {
        let mut verifier = Verifier::new(handle);
        let status_path = format!("{}/status", node_path(NODE));
        verifier
            .expect(Method::PUT, &status_path, |sent| {
                assert_status_write(sent.as_ref(), "1");
                accept(2)(sent)
            })
            .await;
        verifier
            .expect(Method::PUT, &node_path(NODE), |sent| {
                assert_spec_write(sent.as_ref(), "2");
                accept(3)(sent)
            })
            .await;
        verifier.expect_no_more().await;
    });
    let store = KubeStore::new(client);
    let published = store
        .publish(stored(1), &live_node())
        .await
        .expect("published");
    assert_eq!(published.metadata.resource_version.as_deref(), Some("3"));
    drop(store);
    server.await.expect("verifier");
}

#[tokio::test]
async fn a_conflict_on_status_re_reads_then_writes_status_and_spec_again() {
    let (client, handle) = mock_client();
    let server = tokio::spawn(async move {
        let mut verifier = Verifier::new(handle);
        let status_path = format!("{}/status", node_path(NODE));
        verifier
            .expect(Method::PUT, &status_path, |_| {
                failure(StatusCode::CONFLICT, "Conflict")
            })
            .await;
        verifier
            .expect(Method::GET, &node_path(NODE), |sent| {
                assert!(sent.is_none(), "a GET has no body");
                respond(
                    StatusCode::OK,
                    &serde_json::to_value(stored(7)).expect("json"),
                )
            })
            .await;
        verifier
            .expect(Method::PUT, &status_path, |sent| {
                // Recomputed on the re-read object, not the stale one.
                assert_status_write(sent.as_ref(), "7");
                accept(8)(sent)
            })
            .await;
        verifier
            .expect(Method::PUT, &node_path(NODE), |sent| {
                assert_spec_write(sent.as_ref(), "8");
                accept(9)(sent)
            })
            .await;
        verifier.expect_no_more().await;
    });
    let store = KubeStore::new(client);
    let published = store
        .publish(stored(1), &live_node())
        .await
        .expect("published");
    assert_eq!(published.metadata.resource_version.as_deref(), Some("9"));
    drop(store);
    server.await.expect("verifier");
}

#[tokio::test]
async fn a_failed_status_write_makes_no_spec_request() {
    let (client, handle) = mock_client();
    let server = tokio::spawn(async move {
        let mut verifier = Verifier::new(handle);
        let status_path = format!("{}/status", node_path(NODE));
        verifier
            .expect(Method::PUT, &status_path, |_| {
                failure(StatusCode::INTERNAL_SERVER_ERROR, "InternalError")
            })
            .await;
        verifier.expect_no_more().await;
    });
    let store = KubeStore::new(client);
    let err = store
        .publish(stored(1), &live_node())
        .await
        .expect_err("fails");
    assert!(matches!(err, StoreError::Kube(kube::Error::Api(ref status)) if status.code == 500));
    drop(store);
    server.await.expect("verifier");
}
