//! Nodes: key `cilium/state/nodes/v1/<cluster>/<node>`.
//!
//! Go: `Node` in `pkg/node/types/node.go` — no JSON tags, so the Go field names are the JSON
//! names, every field is always written, nil slices/maps are `null`, nil IPs are `""`, and the
//! CIDRs use the legacy `{"IP":..,"Mask":..}` object (see [`IpPrefix`]). `NodeIdentity` was
//! dropped by the newest Cilium and `BootID` added by recent ones; both are read and written so
//! that every version finds what it expects (unknown fields are ignored by Go readers).

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::{DecodeError, Decoder};

use super::cluster_config::DEFAULT_MAX_CONNECTED_CLUSTERS;
use super::go_json::{GoIp, NullIfEmpty, go_string_enum, go_struct};
use super::net::IpPrefix;
use super::node_scan;

go_string_enum! {
    /// The type of a node address (Go's `addressing.AddressType`).
    pub enum AddressType {
        /// `InternalIP`.
        InternalIp = "InternalIP",
        /// `ExternalIP`.
        ExternalIp = "ExternalIP",
        /// `Hostname`.
        Hostname = "Hostname",
        /// `InternalDNS`.
        InternalDns = "InternalDNS",
        /// `ExternalDNS`.
        ExternalDns = "ExternalDNS",
        /// `CiliumInternalIP`: the IP of `cilium_host`, never a tunnel / WireGuard endpoint.
        CiliumInternalIp = "CiliumInternalIP",
    }
}

go_struct! {
    /// One address of a node.
    pub struct Address {
        /// Address type (`Type`).
        pub address_type: AddressType => "Type",
        /// The IP (`IP`, `net.IP`).
        pub ip: Option<IpAddr> => "IP" as GoIp,
    }
}

go_struct! {
    /// A Cilium node as published in the kvstore.
    pub struct Node {
        /// Node name, usually the hostname (`Name`); equals the last key segment.
        pub name: String => "Name",
        /// Cluster name (`Cluster`).
        pub cluster: String => "Cluster",
        /// Node addresses (`IPAddresses`).
        pub ip_addresses: Vec<Address> => "IPAddresses" as NullIfEmpty,
        /// Primary IPv4 pod CIDR (`IPv4AllocCIDR`).
        pub ipv4_alloc_cidr: Option<IpPrefix> => "IPv4AllocCIDR",
        /// Further IPv4 pod CIDRs (`IPv4SecondaryAllocCIDRs`).
        pub ipv4_secondary_alloc_cidrs: Vec<IpPrefix> => "IPv4SecondaryAllocCIDRs" as NullIfEmpty,
        /// Primary IPv6 pod CIDR (`IPv6AllocCIDR`).
        pub ipv6_alloc_cidr: Option<IpPrefix> => "IPv6AllocCIDR",
        /// Further IPv6 pod CIDRs (`IPv6SecondaryAllocCIDRs`).
        pub ipv6_secondary_alloc_cidrs: Vec<IpPrefix> => "IPv6SecondaryAllocCIDRs" as NullIfEmpty,
        /// IPv4 of the cilium-health endpoint (`IPv4HealthIP`).
        pub ipv4_health_ip: Option<IpAddr> => "IPv4HealthIP" as GoIp,
        /// IPv6 of the cilium-health endpoint (`IPv6HealthIP`).
        pub ipv6_health_ip: Option<IpAddr> => "IPv6HealthIP" as GoIp,
        /// IPv4 of the ingress listener (`IPv4IngressIP`).
        pub ipv4_ingress_ip: Option<IpAddr> => "IPv4IngressIP" as GoIp,
        /// IPv6 of the ingress listener (`IPv6IngressIP`).
        pub ipv6_ingress_ip: Option<IpAddr> => "IPv6IngressIP" as GoIp,
        /// Cluster ID (`ClusterID`).
        pub cluster_id: u32 => "ClusterID",
        /// Where the node object came from, e.g. `local`, `kvstore`, `custom-resource` (`Source`).
        pub source: String => "Source",
        /// IPsec key index, 0 without encryption (`EncryptionKey`).
        pub encryption_key: u8 => "EncryptionKey",
        /// Node labels (`Labels`).
        pub labels: BTreeMap<String, String> => "Labels" as NullIfEmpty,
        /// Node annotations (`Annotations`).
        pub annotations: BTreeMap<String, String> => "Annotations" as NullIfEmpty,
        /// Numeric identity of the node (`NodeIdentity`; gone in the newest Cilium).
        pub node_identity: u32 => "NodeIdentity",
        /// WireGuard public key, base64 (`WireguardPubKey`).
        pub wireguard_pub_key: String => "WireguardPubKey",
        /// Identifier generated on boot (`BootID`).
        pub boot_id: String => "BootID",
    }
}

impl Node {
    /// The key relative to [`NODES_PREFIX`](crate::keys::NODES_PREFIX): `<cluster>/<name>`.
    pub fn key_name(&self) -> String {
        format!("{}/{}", self.cluster, self.name)
    }

    /// The first address of `address_type` in the given family.
    pub fn address(&self, address_type: &AddressType, ipv6: bool) -> Option<IpAddr> {
        self.ip_addresses
            .iter()
            .filter(|a| a.address_type == *address_type)
            .filter_map(|a| a.ip)
            .find(|ip| ip.is_ipv6() == ipv6)
    }

    /// The node IP of a family the way Cilium picks it (`GetNodeIP`): `InternalIP`, else the
    /// last `ExternalIP`, else the first address of any other type; `CiliumInternalIP` never.
    pub fn node_ip(&self, ipv6: bool) -> Option<IpAddr> {
        let mut fallback = None;
        for address in &self.ip_addresses {
            let Some(ip) = address.ip.filter(|ip| ip.is_ipv6() == ipv6) else {
                continue;
            };
            match address.address_type {
                AddressType::CiliumInternalIp => {}
                AddressType::InternalIp => return Some(ip),
                AddressType::ExternalIp => fallback = Some(ip),
                _ if fallback.is_none() => fallback = Some(ip),
                _ => {}
            }
        }
        fallback
    }
}

/// Reads the nodes of one remote cluster (keys relative to `cilium/state/nodes/v1/<cluster>/`,
/// i.e. the node name) and validates them like Cilium's `ClusterNameValidator`,
/// `NameValidator` and `ClusterIDValidator`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDecoder {
    /// The remote cluster's name; nodes must carry it.
    pub cluster_name: String,
    /// The remote cluster's ID once its config is known; nodes must carry it.
    pub cluster_id: Option<u32>,
    /// Our `--max-connected-clusters`, bounding `ClusterID` while the remote ID is unknown.
    pub max_connected_clusters: u32,
}

impl NodeDecoder {
    /// A decoder for cluster `cluster_name` (ID if known), with 255 connected clusters.
    pub fn new(cluster_name: impl Into<String>, cluster_id: Option<u32>) -> Self {
        Self {
            cluster_name: cluster_name.into(),
            cluster_id,
            max_connected_clusters: DEFAULT_MAX_CONNECTED_CLUSTERS,
        }
    }

    /// Sets `--max-connected-clusters`.
    pub fn with_max_connected_clusters(mut self, max_connected_clusters: u32) -> Self {
        self.max_connected_clusters = max_connected_clusters;
        self
    }
}

impl Decoder for NodeDecoder {
    type Value = Node;

    fn decode(&self, key: &str, value: &[u8]) -> Result<Node, DecodeError> {
        // The plain form Cilium writes in one pass; anything else through the full reader.
        let node = match node_scan::scan(value) {
            Some(node) => node,
            None => Node::from_json(value)?,
        };
        self.validate(key, node)
    }
}

impl NodeDecoder {
    /// Cilium's validators, whichever reader read `node`.
    fn validate(&self, key: &str, node: Node) -> Result<Node, DecodeError> {
        let invalid = |message: String| Err(DecodeError::Invalid(format!("node {key}: {message}")));
        if node.cluster.is_empty() {
            return invalid("cluster is unset".into());
        }
        if node.name.is_empty() {
            return invalid("name is unset".into());
        }
        if node.cluster != self.cluster_name {
            return invalid(format!(
                "unexpected cluster name: got {}, expected {}",
                node.cluster, self.cluster_name
            ));
        }
        if node.name != key {
            return invalid(format!(
                "name does not match key: got {}, expected {key}",
                node.name
            ));
        }
        match self.cluster_id {
            Some(expected) if node.cluster_id != expected => invalid(format!(
                "unexpected cluster ID: got {}, expected {expected}",
                node.cluster_id
            )),
            None if node.cluster_id > self.max_connected_clusters => invalid(format!(
                "ClusterID > {} is not supported",
                self.max_connected_clusters
            )),
            _ => Ok(node),
        }
    }
}

#[cfg(test)]
#[path = "node_shortcut_tests.rs"]
mod shortcut_tests;

#[cfg(test)]
mod tests {
    use super::*;

    /// A node as Go's `json.Marshal` writes it (field order, `null`s, `""` IPs, legacy CIDRs).
    const GO_NODE: &str = concat!(
        r#"{"Name":"node1","Cluster":"c1","IPAddresses":[{"Type":"InternalIP","IP":"10.0.0.1"},"#,
        r#"{"Type":"CiliumInternalIP","IP":"10.244.1.1"},{"Type":"InternalIP","IP":"fd00::1"}],"#,
        r#""IPv4AllocCIDR":{"IP":"10.244.1.0","Mask":"////AA=="},"IPv4SecondaryAllocCIDRs":null,"#,
        r#""IPv6AllocCIDR":{"IP":"fd00:10:244:1::","Mask":"//////////8AAAAAAAAAAA=="},"IPv6SecondaryAllocCIDRs":null,"#,
        r#""IPv4HealthIP":"10.244.1.7","IPv6HealthIP":"","IPv4IngressIP":"","IPv6IngressIP":"","#,
        r#""ClusterID":1,"Source":"local","EncryptionKey":0,"#,
        r#""Labels":{"kubernetes.io/hostname":"node1","topology.kubernetes.io/zone":"a\u0026b"},"Annotations":null,"#,
        r#""NodeIdentity":0,"WireguardPubKey":"","BootID":"4d0b0f36-2a8b-4a77-a0d3-1bd3e0b1b3c2"}"#
    );

    fn go_node() -> Node {
        Node::from_json(GO_NODE.as_bytes()).unwrap()
    }

    fn invalid(result: Result<Node, DecodeError>) -> String {
        match result {
            Err(DecodeError::Invalid(message)) => message,
            other => panic!("expected an invalid entry, got {other:?}"),
        }
    }

    #[test]
    fn decodes_go_json_and_reencodes_byte_exact() {
        let node = go_node();
        assert_eq!(node.name, "node1");
        assert_eq!(node.ip_addresses.len(), 3);
        assert_eq!(node.ipv4_alloc_cidr.unwrap().to_string(), "10.244.1.0/24");
        assert_eq!(
            node.ipv6_alloc_cidr.unwrap().to_string(),
            "fd00:10:244:1::/64"
        );
        assert_eq!(node.ipv4_health_ip, Some("10.244.1.7".parse().unwrap()));
        assert_eq!(node.ipv6_health_ip, None);
        assert_eq!(node.labels["topology.kubernetes.io/zone"], "a&b");
        assert_eq!(node.key_name(), "c1/node1");
        assert_eq!(String::from_utf8(node.to_json()).unwrap(), GO_NODE);
        assert_eq!(Node::from_json(&node.to_json()).unwrap(), node);
    }

    #[test]
    fn decodes_cilium_docs_example() {
        // `cilium kvstore get` output from Cilium's docs (an older agent: no BootID etc.).
        let doc = r#"{"Name":"k8s-node1","Cluster":"default","IPAddresses":[{"Type":"InternalIP", "IP":"10.5.1.132"},
            {"Type":"CiliumInternalIP", "IP":"10.6.6.71"}],"IPv4AllocCIDR":{"IP":"10.6.6.0", "Mask":"////AA=="},
            "IPv6AllocCIDR":null,"IPv4HealthIP":"10.6.6.79","IPv6HealthIP":"","ClusterID":0,"Source":"local","EncryptionKey":0}"#;
        let node = Node::from_json(doc.as_bytes()).unwrap();
        assert_eq!(node.node_ip(false), Some("10.5.1.132".parse().unwrap()));
        assert_eq!(
            node.address(&AddressType::CiliumInternalIp, false),
            Some("10.6.6.71".parse().unwrap())
        );
        assert_eq!(node.ipv6_alloc_cidr, None);
        // Very old agents wrote `AddressType` instead of `Type`: ignored like Go does.
        let old =
            r#"{"Name":"runtime1","IPAddresses":[{"AddressType":"InternalIP","IP":"10.0.2.15"}]}"#;
        assert_eq!(
            Node::from_json(old.as_bytes()).unwrap().ip_addresses[0].address_type,
            AddressType::default()
        );
    }

    #[test]
    fn case_insensitive_unknown_fields_nulls() {
        let node = Node::from_json(
            br#"{"name":"n1","CLUSTER":"c1","ipaddresses":[{"type":"ExternalIP","ip":"1.2.3.4"}],"clusterid":2,
                 "ipv4alloccidr":{"ip":"10.0.0.0","mask":"//8AAA=="},"labels":null,"Annotations":{"a":"b"},
                 "futureField":{"x":[1,2]},"wireguardpubkey":"key=","Name":"n2"}"#,
        )
        .unwrap();
        assert_eq!(
            node.name, "n2",
            "last duplicate wins (exact and folded keys are the same field)"
        );
        assert_eq!(node.cluster, "c1");
        assert_eq!(node.cluster_id, 2);
        assert_eq!(node.ip_addresses[0].address_type, AddressType::ExternalIp);
        assert_eq!(node.ipv4_alloc_cidr.unwrap().to_string(), "10.0.0.0/16");
        assert!(node.labels.is_empty());
        assert_eq!(node.wireguard_pub_key, "key=");
        assert_eq!(Node::from_json(br#"{"name":"n1"}"#).unwrap().name, "n1");
        assert_eq!(Node::from_json(b"null").unwrap(), Node::default());
    }

    #[test]
    fn node_ip_preference() {
        let address = |t: &str, ip: &str| Address {
            address_type: AddressType::from(t),
            ip: Some(ip.parse().unwrap()),
        };
        let mut node = Node {
            ip_addresses: vec![
                address("CiliumInternalIP", "10.9.0.1"),
                address("Hostname", "10.8.0.1"),
                address("ExternalIP", "1.1.1.1"),
                address("ExternalIP", "1.1.1.2"),
            ],
            ..Node::default()
        };
        assert_eq!(node.node_ip(false), Some("1.1.1.2".parse().unwrap()));
        node.ip_addresses.push(address("InternalIP", "10.0.0.1"));
        assert_eq!(node.node_ip(false), Some("10.0.0.1".parse().unwrap()));
        assert_eq!(node.node_ip(true), None);
        node.ip_addresses.retain(|a| {
            a.address_type != AddressType::ExternalIp && a.address_type != AddressType::InternalIp
        });
        assert_eq!(node.node_ip(false), Some("10.8.0.1".parse().unwrap()));
        assert_eq!(AddressType::from("Custom").as_str(), "Custom");
    }

    #[test]
    fn decoder_validation() {
        let decoder = NodeDecoder::new("c1", Some(1));
        assert!(decoder.decode("node1", GO_NODE.as_bytes()).is_ok());
        assert!(
            invalid(decoder.decode("node2", GO_NODE.as_bytes()))
                .contains("name does not match key: got node1, expected node2")
        );
        let message = invalid(NodeDecoder::new("c2", Some(1)).decode("node1", GO_NODE.as_bytes()));
        assert!(
            message.contains("unexpected cluster name: got c1, expected c2"),
            "{message}"
        );
        let message = invalid(NodeDecoder::new("c1", Some(7)).decode("node1", GO_NODE.as_bytes()));
        assert!(
            message.contains("unexpected cluster ID: got 1, expected 7"),
            "{message}"
        );
        assert!(
            NodeDecoder::new("c1", None)
                .decode("node1", GO_NODE.as_bytes())
                .is_ok()
        );
        assert!(
            invalid(
                NodeDecoder::new("c1", None)
                    .decode("n", br#"{"Name":"n","Cluster":"c1","ClusterID":256}"#)
            )
            .contains("ClusterID > 255")
        );
        assert!(
            invalid(decoder.decode("", br#"{"Cluster":"c1","ClusterID":1}"#))
                .contains("name is unset")
        );
        assert!(
            invalid(decoder.decode("n", br#"{"Name":"n","ClusterID":1}"#))
                .contains("cluster is unset")
        );
        assert!(matches!(
            decoder.decode("n", br#"{"Name":"n","IPv4HealthIP":"nope"}"#),
            Err(DecodeError::Malformed(_))
        ));
        assert!(matches!(
            decoder.decode("n", b"{"),
            Err(DecodeError::Malformed(_))
        ));
    }
}
