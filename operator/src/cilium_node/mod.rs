//! The CiliumNode custom resource (`cilium.io/v2`, cluster-scoped, status subresource), with
//! exactly the JSON field names of Cilium's `pkg/k8s/apis/cilium.io/v2`, `pkg/ipam/types`
//! and `pkg/aws/eni/types`, restricted to what the ENI IPAM operator reads and writes.
//!
//! Agents, other operators and `kubectl` read these objects, so the names are Cilium's, not
//! Rust's: every field carries its serde rename, and empty values are left out the way Go's
//! `omitempty` leaves them out.
//!
//! - [`convert`]: from the describe cache and the allocator's spec into these types.

pub mod convert;

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `map[string]string` in Cilium (tags).
pub type StringMap = BTreeMap<String, String>;

/// Cilium's `AllocationMap`: IP → who holds it.
pub type AllocationMap = BTreeMap<String, AllocationIp>;

/// The CiliumNode CustomResourceDefinition generated from these types, as YAML: what
/// `meshwork-operator crd` prints and `deploy/kubernetes` checks in (a test fails when the
/// checked-in copy differs).
pub fn crd_yaml() -> Result<String, yaml_serde::Error> {
    use kube::CustomResourceExt as _;
    yaml_serde::to_string(&CiliumNode::crd())
}

fn is_zero(value: &i64) -> bool {
    *value == 0
}

/// `spec` of a CiliumNode: what the node asks for (agent-owned) and the pool the operator
/// hands it (`spec.ipam.pool`).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cilium.io",
    version = "v2",
    kind = "CiliumNode",
    plural = "ciliumnodes",
    singular = "ciliumnode",
    shortname = "cn",
    status = "CiliumNodeStatus",
    // The etcd watch store compares decoded objects to drop unchanged ones.
    derive = "PartialEq"
)]
pub struct CiliumNodeSpec {
    /// `spec.eni`: where this node's ENIs go.
    #[serde(default)]
    pub eni: EniSpec,
    /// `spec.ipam`: watermarks and the pool.
    #[serde(default)]
    pub ipam: IpamSpec,
}

/// One entry of an [`AllocationMap`] (Cilium's `AllocationIP`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct AllocationIp {
    /// The pod (or other user) holding the IP, when it is used.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub owner: String,
    /// The resource the IP belongs to: in ENI mode, the ENI ID.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource: String,
}

/// `spec.ipam` (Cilium's `IPAMSpec`); 0 means unset, as in Cilium.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct IpamSpec {
    /// The addresses available to the node, written by the operator.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pool: AllocationMap,
    /// Free addresses to keep ready.
    #[serde(rename = "pre-allocate", default, skip_serializing_if = "is_zero")]
    pub pre_allocate: i64,
    /// Addresses to hold at least.
    #[serde(rename = "min-allocate", default, skip_serializing_if = "is_zero")]
    pub min_allocate: i64,
    /// Addresses to hold at most.
    #[serde(rename = "max-allocate", default, skip_serializing_if = "is_zero")]
    pub max_allocate: i64,
    /// Extra addresses to take whenever allocating.
    #[serde(
        rename = "max-above-watermark",
        default,
        skip_serializing_if = "is_zero"
    )]
    pub max_above_watermark: i64,
}

/// `spec.eni` (Cilium's `ENISpec`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct EniSpec {
    /// The EC2 instance.
    #[serde(
        rename = "instance-id",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub instance_id: String,
    /// The instance type.
    #[serde(
        rename = "instance-type",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub instance_type: String,
    /// ENIs below this device index are not used (a pointer in Go: unset ≠ 0).
    #[serde(
        rename = "first-interface-index",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub first_interface_index: Option<i64>,
    /// Security groups for new ENIs.
    #[serde(
        rename = "security-groups",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub security_groups: Vec<String>,
    /// Else, security groups carrying these tags.
    #[serde(
        rename = "security-group-tags",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub security_group_tags: StringMap,
    /// Subnets for new ENIs.
    #[serde(rename = "subnet-ids", default, skip_serializing_if = "Vec::is_empty")]
    pub subnet_ids: Vec<String>,
    /// Else, subnets carrying these tags.
    #[serde(
        rename = "subnet-tags",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub subnet_tags: StringMap,
    /// The instance's VPC.
    #[serde(rename = "vpc-id", default, skip_serializing_if = "String::is_empty")]
    pub vpc_id: String,
    /// The instance's availability zone.
    #[serde(
        rename = "availability-zone",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub availability_zone: String,
    /// ENIs carrying all these tags are never used.
    #[serde(
        rename = "exclude-interface-tags",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub exclude_interface_tags: StringMap,
    /// Mark new ENIs delete-on-termination (a pointer in Go: unset → yes).
    #[serde(
        rename = "delete-on-termination",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub delete_on_termination: Option<bool>,
}

/// `status` of a CiliumNode.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct CiliumNodeStatus {
    /// `status.eni`: the node's ENIs, written by the operator.
    #[serde(default)]
    pub eni: EniStatus,
    /// `status.ipam`: usage (agent) and the operator's state.
    #[serde(default)]
    pub ipam: IpamStatus,
}

/// `status.eni` (Cilium's `ENIStatus`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct EniStatus {
    /// ENI ID → ENI.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub enis: BTreeMap<String, EniEntry>,
}

/// One ENI in `status.eni.enis` (Cilium's `ENI`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct EniEntry {
    /// `eni-…`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    /// The primary IPv4 address.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ip: String,
    /// The MAC address.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    /// The availability zone.
    #[serde(
        rename = "availability-zone",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub availability_zone: String,
    /// The ENI's description.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// The attachment's device index.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub number: i64,
    /// The subnet.
    #[serde(default)]
    pub subnet: AwsSubnet,
    /// The VPC.
    #[serde(default)]
    pub vpc: AwsVpc,
    /// Secondary IPv4 addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// Delegated IPv4 prefixes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefixes: Vec<String>,
    /// Security group IDs.
    #[serde(
        rename = "security-groups",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub security_groups: Vec<String>,
    /// The ENI's tags.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: StringMap,
}

/// An ENI's subnet (Cilium's `AwsSubnet`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct AwsSubnet {
    /// `subnet-…`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    /// The subnet's CIDR.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cidr: String,
}

/// An ENI's VPC (Cilium's `AwsVPC`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct AwsVpc {
    /// `vpc-…`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    /// The primary CIDR.
    #[serde(
        rename = "primary-cidr",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub primary_cidr: String,
    /// All CIDRs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cidrs: Vec<String>,
}

/// `status.ipam` (Cilium's `IPAMStatus`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct IpamStatus {
    /// Addresses in use, written by the agent.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub used: AllocationMap,
    /// The release handshake: IP → `marked-for-release`, `ready-for-release`,
    /// `do-not-release` or `released`.
    #[serde(
        rename = "release-ips",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub release_ips: StringMap,
    /// The operator's state for this node.
    #[serde(rename = "operator-status", default)]
    pub operator_status: OperatorStatus,
}

/// `status.ipam.operator-status`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct OperatorStatus {
    /// The last allocation error; empty when allocation is healthy.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

impl CiliumNode {
    /// Pool IPs whose `resource` is not an ENI in `status.eni.enis`: an agent given this
    /// object would fail to find the ENI of such an IP (Cilium's fatal "unable to find ENI").
    /// Empty for every object Meshwork publishes.
    pub fn pool_ips_without_eni(&self) -> Vec<(String, String)> {
        let enis = self.status.as_ref().map(|status| &status.eni.enis);
        self.spec
            .ipam
            .pool
            .iter()
            .filter(|(_, ip)| !enis.is_some_and(|enis| enis.contains_key(&ip.resource)))
            .map(|(address, ip)| (address.clone(), ip.resource.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests;
