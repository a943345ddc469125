//! Cilium's tunnel map from remote nodes: each pod CIDR's network address → the node's IP
//! (IPv4 first, as Cilium's underlay does). A plain state machine.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use super::ipcache_map::{FAMILY_IPV4, FAMILY_IPV6};
use meshwork_types::Node;

/// `struct tunnel_key` (20 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TunnelKey {
    /// The pod CIDR's network address (IPv4 in the first 4 bytes).
    pub ip: [u8; 16],
    /// [`FAMILY_IPV4`] or [`FAMILY_IPV6`].
    pub family: u8,
    /// Zero.
    pub pad: u8,
    /// Zero unless pod CIDRs overlap across clusters.
    pub cluster_id: u16,
}

/// `struct tunnel_value` (20 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TunnelValue {
    /// The node's IP (IPv4 in the first 4 bytes).
    pub ip: [u8; 16],
    /// Its family.
    pub family: u8,
    /// The encryption key index.
    pub key: u8,
    /// Node ID (unused: 0).
    pub node_id: u16,
}

// SAFETY: repr(C), integers and byte arrays only, no implicit padding (asserted below).
#[allow(unsafe_code)]
unsafe impl aya::Pod for TunnelKey {}
#[allow(unsafe_code)]
unsafe impl aya::Pod for TunnelValue {}
const _: () = assert!(size_of::<TunnelKey>() == 20);
const _: () = assert!(size_of::<TunnelValue>() == 20);

fn bytes(ip: IpAddr) -> ([u8; 16], u8) {
    let mut out = [0u8; 16];
    match ip {
        IpAddr::V4(v4) => {
            out[..4].copy_from_slice(&v4.octets());
            (out, FAMILY_IPV4)
        }
        IpAddr::V6(v6) => (v6.octets(), FAMILY_IPV6),
    }
}

/// Remote nodes by (cluster, name).
#[derive(Default)]
pub struct TunnelTable {
    nodes: BTreeMap<(Arc<str>, String), Arc<Node>>,
}

impl TunnelTable {
    /// Upserts a remote node.
    pub fn upsert(&mut self, cluster: &Arc<str>, node: Arc<Node>) {
        self.nodes
            .insert((cluster.clone(), node.name.clone()), node);
    }

    /// Deletes a remote node.
    pub fn delete(&mut self, cluster: &Arc<str>, node: &Node) {
        self.nodes.remove(&(cluster.clone(), node.name.clone()));
    }

    /// The desired map content.
    pub fn desired(&self) -> HashMap<TunnelKey, TunnelValue> {
        let mut out = HashMap::new();
        for node in self.nodes.values() {
            let Some(endpoint) = node.node_ip(false).or_else(|| node.node_ip(true)) else {
                continue;
            };
            let (ip, family) = bytes(endpoint);
            let value = TunnelValue {
                ip,
                family,
                key: node.encryption_key,
                node_id: 0,
            };
            let cidrs = node
                .ipv4_alloc_cidr
                .iter()
                .chain(&node.ipv4_secondary_alloc_cidrs)
                .chain(node.ipv6_alloc_cidr.iter())
                .chain(&node.ipv6_secondary_alloc_cidrs);
            for cidr in cidrs {
                let (ip, family) = bytes(cidr.masked().addr());
                out.insert(
                    TunnelKey {
                        ip,
                        family,
                        pad: 0,
                        cluster_id: 0,
                    },
                    value,
                );
            }
        }
        out
    }
}
