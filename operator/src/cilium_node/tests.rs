//! The JSON shape of CiliumNode: Cilium's field names, Go's `omitempty`.

use std::net::Ipv4Addr;

use kube::CustomResourceExt;
use serde_json::json;

use super::*;
use crate::instances::InstanceCache;
use crate::model::{Eni, EniSubnet};
use crate::node_allocator::NodeSpec;

#[test]
fn a_cilium_node_round_trips_with_ciliums_field_names() {
    let document = json!({
        "apiVersion": "cilium.io/v2",
        "kind": "CiliumNode",
        "metadata": {"name": "node-a"},
        "spec": {
            "eni": {
                "instance-id": "i-1", "instance-type": "m5.large", "first-interface-index": 1,
                "security-groups": ["sg-1"], "security-group-tags": {"k": "v"},
                "subnet-ids": ["subnet-1"], "subnet-tags": {"s": "t"}, "vpc-id": "vpc-1",
                "availability-zone": "us-east-1a", "exclude-interface-tags": {"x": "y"},
                "delete-on-termination": false
            },
            "ipam": {
                "pool": {"10.213.0.5": {"resource": "eni-1"}},
                "pre-allocate": 8, "min-allocate": 2, "max-allocate": 30, "max-above-watermark": 4
            }
        },
        "status": {
            "eni": {"enis": {"eni-1": {
                "id": "eni-1", "ip": "10.213.0.4", "mac": "02:00:00:00:00:01",
                "availability-zone": "us-east-1a", "description": "d", "number": 1,
                "subnet": {"id": "subnet-1", "cidr": "10.213.0.0/24"},
                "vpc": {"id": "vpc-1", "primary-cidr": "10.213.0.0/16", "cidrs": ["10.213.0.0/16"]},
                "addresses": ["10.213.0.5"], "prefixes": ["10.213.0.16/28"],
                "security-groups": ["sg-1"], "tags": {"a": "b"}
            }}},
            "ipam": {
                "used": {"10.213.0.5": {"owner": "default/pod", "resource": "eni-1"}},
                "release-ips": {"10.213.0.6": "marked-for-release"},
                "operator-status": {"error": "boom"}
            }
        }
    });
    let node: CiliumNode = serde_json::from_value(document.clone()).expect("decodes");
    assert_eq!(node.spec.eni.first_interface_index, Some(1));
    assert_eq!(node.spec.ipam.max_above_watermark, 4);
    let status = node.status.as_ref().expect("status");
    assert_eq!(status.eni.enis["eni-1"].vpc.primary_cidr, "10.213.0.0/16");
    assert_eq!(status.ipam.operator_status.error, "boom");
    assert_eq!(serde_json::to_value(&node).expect("encodes"), document);
}

#[test]
fn empty_fields_are_left_out_like_go_omitempty() {
    let node = CiliumNode::new("node-a", CiliumNodeSpec::default());
    let value = serde_json::to_value(&node).expect("encodes");
    assert_eq!(value["spec"], json!({"eni": {}, "ipam": {}}));
}

#[test]
fn the_crd_is_cluster_scoped_cilium_io_v2_with_a_status_subresource() {
    let crd = CiliumNode::crd();
    assert_eq!(crd.metadata.name.as_deref(), Some("ciliumnodes.cilium.io"));
    assert_eq!(crd.spec.scope, "Cluster");
    let version = &crd.spec.versions[0];
    assert_eq!(version.name, "v2");
    assert!(
        version
            .subresources
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some()
    );
}

fn eni(id: &str, number: u32, addresses: &[&str]) -> Eni {
    Eni {
        id: id.to_owned(),
        number,
        subnet: EniSubnet {
            id: "subnet-1".to_owned(),
            cidr: String::new(),
        },
        addresses: addresses
            .iter()
            .map(|a| a.parse::<Ipv4Addr>().expect("address"))
            .collect(),
        ..Eni::default()
    }
}

#[test]
fn the_pool_names_each_addresss_eni_and_skips_excluded_enis() {
    let mut cache = InstanceCache::new();
    cache.upsert_eni("i-1", eni("eni-0", 0, &["10.213.0.10"]));
    cache.upsert_eni("i-1", eni("eni-1", 1, &["10.213.0.11", "10.213.0.12"]));
    let mut spec = NodeSpec::default();
    spec.eni.instance_id = "i-1".to_owned();
    spec.eni.first_interface_index = 1;
    let pool = convert::pool(&cache, &spec);
    assert_eq!(pool.len(), 2);
    assert!(pool.values().all(|ip| ip.resource == "eni-1"));
    let status = convert::eni_status(&cache, "i-1");
    assert_eq!(status.enis.len(), 2, "excluded ENIs are still listed");
    assert_eq!(
        status.enis["eni-1"].addresses,
        ["10.213.0.11", "10.213.0.12"]
    );
    assert_eq!(status.enis["eni-1"].number, 1);
}

#[test]
fn pool_ips_without_eni_finds_ips_of_unknown_enis() {
    let mut node = CiliumNode::new("node-a", CiliumNodeSpec::default());
    let ip = AllocationIp {
        owner: String::new(),
        resource: "eni-9".to_owned(),
    };
    node.spec.ipam.pool.insert("10.213.0.9".to_owned(), ip);
    assert_eq!(
        node.pool_ips_without_eni(),
        [("10.213.0.9".to_owned(), "eni-9".to_owned())]
    );
    let mut status = CiliumNodeStatus::default();
    status
        .eni
        .enis
        .insert("eni-9".to_owned(), EniEntry::default());
    node.status = Some(status);
    assert!(node.pool_ips_without_eni().is_empty());
}

#[test]
fn a_node_spec_converts_to_the_allocators_and_back() {
    let mut node = CiliumNode::new("node-a", CiliumNodeSpec::default());
    node.spec.eni.instance_id = "i-1".to_owned();
    node.spec.eni.first_interface_index = Some(2);
    node.spec.ipam.min_allocate = 10;
    let spec = convert::node_spec(&node);
    assert_eq!(spec.name, "node-a");
    assert_eq!(spec.eni.first_interface_index, 2);
    assert_eq!(EniSpec::from(&spec), node.spec.eni);
    assert_eq!(IpamSpec::from(&spec).min_allocate, 10);
}
