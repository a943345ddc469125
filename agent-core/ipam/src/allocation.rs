//! One handed-out IP: what the pod's interface needs, as returned to the CNI plugin and as
//! kept in the checkpoint (so a restarted agent answers a repeated request with the same
//! IP, even before its first snapshot).

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::cidr::Ipv4Cidr;

/// The owner of the agent's own IP (Cilium's router IP, `cilium_host`).
pub const ROUTER_OWNER: &str = "router";

/// Where the allocations come from; the checkpoint records it, and a checkpoint of the
/// other mode is refused (its pods may still hold those IPs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Mode {
    /// `--ipam eni`: the operator's snapshots.
    #[serde(rename = "eni")]
    Eni,
    /// `--ipam cluster-pool`: the node's pod CIDR.
    #[serde(rename = "cluster-pool")]
    ClusterPool,
}

impl Mode {
    /// The flag value (`eni`, `cluster-pool`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Eni => "eni",
            Self::ClusterPool => "cluster-pool",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One handed-out IP.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// Who holds it (`<container id>/<ifname>`, [`ROUTER_OWNER`], any stable name).
    pub owner: String,
    /// The pod (`namespace/name`), when the caller said.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod: String,
    /// The address.
    pub ip: Ipv4Addr,
    /// The prefix length of the pod's address: 32 in ENI mode, the CIDR's in cluster-pool.
    pub prefix_len: u8,
    /// The pod's gateway: the ENI subnet's first address, or the node's router IP.
    pub gateway: Ipv4Addr,
    /// ENI mode: the ENI the IP belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eni: Option<EniAttachment>,
    /// ENI mode: the snapshot generation it was handed out from (empty in cluster-pool).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub generation: String,
}

/// The ENI of an allocation, taken from the same snapshot as its IP.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EniAttachment {
    /// The ENI ID, `eni-…`.
    pub id: String,
    /// Its MAC address.
    pub mac: String,
    /// Its device index on the instance.
    pub number: i64,
    /// The VPC's CIDRs (the pod's routes to the VPC).
    pub vpc_cidrs: Vec<Ipv4Cidr>,
}

/// An allocation as an `Allocate` call returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocated {
    /// The allocation.
    pub allocation: Allocation,
    /// The owner held it already (a repeated request); nothing was written.
    pub existing: bool,
}
