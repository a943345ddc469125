//! The etcd backend's optimistic concurrency: a stale object is re-read and recomputed, so
//! another writer's fields survive and the pool still lands.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use meshwork_kvstore::{EtcdBackend, EtcdConfig};
use meshwork_lab::etcd::{EtcdOptions, EtcdServer};

use crate::cilium_node::{AllocationIp, CiliumNode, CiliumNodeSpec};
use crate::instances::InstanceCache;
use crate::model::Eni;
use crate::node_allocator::NodeSpec;
use crate::node_store::{EtcdStore, LiveNode, NodeStore};

#[tokio::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn a_stale_object_is_re_read_and_recomputed() {
    let etcd = EtcdServer::start_with(EtcdOptions {
        data_in_memory: true,
        ..EtcdOptions::default()
    })
    .expect("etcd");
    let backend =
        EtcdBackend::connect(&EtcdConfig::new([etcd.endpoint()]), Duration::from_secs(10))
            .await
            .expect("connect");
    let store = EtcdStore::new(backend);

    let mut cache = InstanceCache::new();
    let eni = Eni {
        id: "eni-1".to_owned(),
        addresses: vec!["10.213.0.5".parse().expect("address")],
        ..Eni::default()
    };
    cache.upsert_eni("i-a", eni);
    let mut spec = NodeSpec::default();
    spec.eni.instance_id = "i-a".to_owned();
    let live = LiveNode::new(Arc::new(RwLock::new(cache)), spec);

    let mut agents = CiliumNodeSpec::default();
    agents.eni.instance_id = "i-a".to_owned();
    let created = store
        .publish(CiliumNode::new("node-a", agents), &live)
        .await
        .expect("created");
    // Another writer (the agent) records a used IP after the operator read the object.
    let mut theirs = store.get("node-a").await.expect("get").expect("present");
    let used = AllocationIp {
        owner: "default/pod".to_owned(),
        resource: "eni-1".to_owned(),
    };
    theirs
        .status
        .as_mut()
        .expect("status")
        .ipam
        .used
        .insert("10.213.0.5".to_owned(), used);
    let theirs = store.publish(theirs, &live).await.expect("their write");

    let ours = store.publish(created, &live).await.expect("recomputed");
    assert_ne!(
        ours.metadata.resource_version,
        theirs.metadata.resource_version
    );
    let stored = store.get("node-a").await.expect("get").expect("present");
    let status = stored.status.as_ref().expect("status");
    assert!(
        status.ipam.used.contains_key("10.213.0.5"),
        "their field survived"
    );
    assert_eq!(stored.spec.ipam.pool["10.213.0.5"].resource, "eni-1");
    assert!(stored.pool_ips_without_eni().is_empty());
}
