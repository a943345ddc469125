//! The agent's own node object as it is published (`cilium/state/nodes/v1/<cluster>/<name>`),
//! carrying the WireGuard public key other nodes make their peer from (§6).

use std::net::IpAddr;

use super::key::Key;
use meshwork_types::{Address, AddressType, Node};

/// What the agent knows about its own node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalNode {
    /// Node name (the host name by default).
    pub name: String,
    /// This cluster's name.
    pub cluster: String,
    /// This cluster's ID.
    pub cluster_id: u32,
    /// The node's IP (`--node-ip`), published as its InternalIP.
    pub node_ip: Option<IpAddr>,
}

impl LocalNode {
    /// The node object with `public_key` as its `WireguardPubKey` (base64, as Cilium writes it).
    pub fn node(&self, public_key: &Key) -> Node {
        Node {
            name: self.name.clone(),
            cluster: self.cluster.clone(),
            cluster_id: self.cluster_id,
            ip_addresses: self
                .node_ip
                .map(|ip| Address {
                    address_type: AddressType::InternalIp,
                    ip: Some(ip),
                })
                .into_iter()
                .collect(),
            source: "local".to_owned(),
            wireguard_pub_key: public_key.to_base64(),
            ..Node::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::PrivateKey;

    #[test]
    fn the_local_node_carries_the_public_key_and_decodes_as_a_remote_would() {
        let key = PrivateKey::generate().public_key();
        let local = LocalNode {
            name: "node-a".into(),
            cluster: "c1".into(),
            cluster_id: 1,
            node_ip: Some("10.213.0.1".parse().unwrap()),
        };
        let node = local.node(&key);
        assert_eq!(node.wireguard_pub_key, key.to_base64());
        assert_eq!(node.node_ip(false), "10.213.0.1".parse().ok());
        // What a remote agent reads back from the published JSON: the same key and endpoint.
        let read = Node::from_json(&node.to_json()).unwrap();
        assert_eq!(read, node);
        assert_eq!(Key::from_base64(&read.wireguard_pub_key).unwrap(), key);
        let json: serde_json::Value = serde_json::from_slice(&node.to_json()).unwrap();
        assert_eq!(json["WireguardPubKey"], key.to_base64());
        assert_eq!(json["Name"], "node-a");
    }
}
