//! [`NodeStore::update`]: the Kubernetes requests it makes (create, the object, the status
//! subresource; re-read on 409 and 404), nothing written on a refusal or no change; and the
//! etcd backend recomputing on a concurrent write.

use std::time::Duration;

use http::{Method, StatusCode};
use meshwork_kvstore::{EtcdBackend, EtcdConfig};
use meshwork_lab::etcd::{EtcdOptions, EtcdServer};

use super::apiserver::{Verifier, failure, mock_client, node_path, respond, with_version};
use crate::cilium_node::{AllocationIp, CiliumNode, CiliumNodeSpec};
use crate::node_store::{EtcdStore, KubeStore, NodeStore, Part, UpdateError, Updated};

const NODE: &str = "node-a";

fn stored(version: u64, pre: i64) -> CiliumNode {
    let mut spec = CiliumNodeSpec::default();
    spec.eni.instance_id = "i-a".to_owned();
    spec.ipam.pre_allocate = pre;
    with_version(CiliumNode::new(NODE, spec), version)
}

fn ok(node: &CiliumNode) -> http::Response<kube::client::Body> {
    respond(StatusCode::OK, &serde_json::to_value(node).expect("json"))
}

/// Marks `10.213.0.5` used on whatever it is given: a status change.
fn mark_used(current: Option<&CiliumNode>) -> Result<Option<CiliumNode>, &'static str> {
    let mut node = current.ok_or("no object")?.clone();
    node.status.get_or_insert_default().ipam.used.insert(
        "10.213.0.5".to_owned(),
        AllocationIp {
            owner: "default/pod".to_owned(),
            resource: "eni-1".to_owned(),
        },
    );
    Ok(Some(node))
}

#[tokio::test]
async fn a_status_update_re_reads_on_a_conflict_and_writes_the_status_subresource() {
    let (client, handle) = mock_client();
    let server = tokio::spawn(async move {
        let mut verifier = Verifier::new(handle);
        let status_path = format!("{}/status", node_path(NODE));
        verifier
            .expect(Method::GET, &node_path(NODE), |_| ok(&stored(3, 8)))
            .await;
        verifier
            .expect(Method::PUT, &status_path, |sent| {
                let sent = sent.expect("a body");
                assert_eq!(sent.metadata.resource_version.as_deref(), Some("3"));
                failure(StatusCode::CONFLICT, "Conflict")
            })
            .await;
        verifier
            .expect(Method::GET, &node_path(NODE), |_| ok(&stored(5, 4)))
            .await;
        verifier
            .expect(Method::PUT, &status_path, |sent| {
                let sent = sent.expect("a body");
                // Recomputed from the re-read object.
                assert_eq!(sent.metadata.resource_version.as_deref(), Some("5"));
                assert_eq!(sent.spec.ipam.pre_allocate, 4);
                ok(&with_version(sent, 6))
            })
            .await;
        verifier.expect_no_more().await;
    });
    let store = KubeStore::new(client);
    let mut calls = 0;
    let updated = store
        .update(NODE, Part::Status, |current| {
            calls += 1;
            mark_used(current)
        })
        .await
        .expect("updated");
    let Updated::Written { node, created } = updated else {
        panic!("written: {updated:?}");
    };
    assert!(!created);
    assert_eq!(node.metadata.resource_version.as_deref(), Some("6"));
    assert_eq!(calls, 2, "the change ran once per read");
    drop(store);
    server.await.expect("verifier");
}

#[tokio::test]
async fn a_missing_object_is_created_and_a_spec_update_puts_the_object() {
    let (client, handle) = mock_client();
    let server = tokio::spawn(async move {
        let mut verifier = Verifier::new(handle);
        verifier
            .expect(Method::GET, &node_path(NODE), |_| {
                failure(StatusCode::NOT_FOUND, "NotFound")
            })
            .await;
        verifier
            .expect(Method::POST, "/apis/cilium.io/v2/ciliumnodes", |sent| {
                let sent = sent.expect("a body");
                assert_eq!(sent.metadata.name.as_deref(), Some(NODE));
                assert_eq!(sent.metadata.resource_version, None, "a create");
                respond(
                    StatusCode::CREATED,
                    &serde_json::to_value(with_version(sent, 1)).expect("json"),
                )
            })
            .await;
        verifier
            .expect(Method::GET, &node_path(NODE), |_| ok(&stored(1, 8)))
            .await;
        verifier
            .expect(Method::PUT, &node_path(NODE), |sent| {
                let sent = sent.expect("a body");
                assert_eq!(sent.metadata.resource_version.as_deref(), Some("1"));
                assert_eq!(sent.spec.ipam.pre_allocate, 2);
                ok(&with_version(sent, 2))
            })
            .await;
        verifier.expect_no_more().await;
    });
    let store = KubeStore::new(client);
    let create = |current: Option<&CiliumNode>| -> Result<_, ()> {
        assert!(current.is_none());
        Ok(Some(stored(0, 8)))
    };
    let created = store
        .update(NODE, Part::Spec, create)
        .await
        .expect("created");
    assert!(
        matches!(created, Updated::Written { created: true, .. }),
        "{created:?}"
    );
    let change = |current: Option<&CiliumNode>| -> Result<_, ()> {
        let mut node = current.expect("stored").clone();
        node.spec.ipam.pre_allocate = 2;
        Ok(Some(node))
    };
    let changed = store
        .update(NODE, Part::Spec, change)
        .await
        .expect("changed");
    assert!(
        matches!(changed, Updated::Written { created: false, .. }),
        "{changed:?}"
    );
    drop(store);
    server.await.expect("verifier");
}

#[tokio::test]
async fn a_refused_or_unchanged_update_writes_nothing() {
    let (client, handle) = mock_client();
    let server = tokio::spawn(async move {
        let mut verifier = Verifier::new(handle);
        verifier
            .expect(Method::GET, &node_path(NODE), |_| ok(&stored(3, 8)))
            .await;
        verifier
            .expect(Method::GET, &node_path(NODE), |_| ok(&stored(3, 8)))
            .await;
        verifier.expect_no_more().await;
    });
    let store = KubeStore::new(client);
    let refused = store
        .update(NODE, Part::Status, |_| Err::<Option<CiliumNode>, _>("no"))
        .await;
    assert!(
        matches!(refused, Err(UpdateError::Refused("no"))),
        "{refused:?}"
    );
    let unchanged = store
        .update(NODE, Part::Spec, |_| Ok::<_, ()>(None))
        .await
        .expect("unchanged");
    assert_eq!(unchanged, Updated::Unchanged(Some(stored(3, 8))));
    drop(store);
    server.await.expect("verifier");
}

// Multi-threaded: the racing write runs to completion inside the change (block_in_place).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn an_etcd_update_recomputes_over_a_concurrent_write_and_creates_only_what_is_absent() {
    let etcd = EtcdServer::start_with(EtcdOptions {
        data_in_memory: true,
        ..EtcdOptions::default()
    })
    .expect("etcd");
    let backend =
        EtcdBackend::connect(&EtcdConfig::new([etcd.endpoint()]), Duration::from_secs(10))
            .await
            .expect("connect");
    let store = EtcdStore::new(backend.clone());
    let absent = store.update(NODE, Part::Status, mark_used).await;
    assert!(
        matches!(absent, Err(UpdateError::Refused("no object"))),
        "{absent:?}"
    );
    let created = store
        .update(NODE, Part::Spec, |_| Ok::<_, ()>(Some(stored(0, 8))))
        .await
        .expect("created");
    assert!(
        matches!(created, Updated::Written { created: true, .. }),
        "{created:?}"
    );

    // Another writer changes the spec between the update's read and its write.
    let other = EtcdStore::new(backend);
    let mut raced = false;
    let updated = store
        .update(NODE, Part::Status, |current| {
            if !raced {
                raced = true;
                let mut theirs = current.expect("stored").clone();
                theirs.spec.ipam.pre_allocate = 3;
                let write =
                    other.update(NODE, Part::Spec, move |_| Ok::<_, ()>(Some(theirs.clone())));
                let runtime = tokio::runtime::Handle::current();
                tokio::task::block_in_place(|| runtime.block_on(write)).expect("their write");
            }
            mark_used(current)
        })
        .await
        .expect("updated");
    let Updated::Written { node, .. } = updated else {
        panic!("written: {updated:?}");
    };
    assert_eq!(node.spec.ipam.pre_allocate, 3, "their write survived");
    let stored = store.get(NODE).await.expect("get").expect("present");
    assert!(
        stored
            .status
            .expect("status")
            .ipam
            .used
            .contains_key("10.213.0.5")
    );
}
