//! What a node asks for: the `spec.ipam` and `spec.eni` fields of its CiliumNode.

use crate::model::Tags;

/// Cilium's default `pre-allocate`.
pub const DEFAULT_PRE_ALLOCATE: i64 = 8;

/// `spec.ipam`: the watermarks. Signed as in Cilium; 0 means unset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpamSpec {
    /// Free addresses to keep ready (`pre-allocate`; 0 → [`DEFAULT_PRE_ALLOCATE`]).
    pub pre_allocate: i64,
    /// Addresses to hold at least (`min-allocate`).
    pub min_allocate: i64,
    /// Addresses to hold at most (`max-allocate`; 0 → the instance's limit).
    pub max_allocate: i64,
    /// Extra addresses to take whenever allocating (`max-above-watermark`).
    pub max_above_watermark: i64,
}

impl IpamSpec {
    /// `pre-allocate` with Cilium's default applied.
    pub fn effective_pre_allocate(&self) -> i64 {
        if self.pre_allocate == 0 {
            DEFAULT_PRE_ALLOCATE
        } else {
            self.pre_allocate
        }
    }
}

/// `spec.eni`: where ENIs for this node go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EniSpec {
    /// The EC2 instance (`instance-id`).
    pub instance_id: String,
    /// Its type (`instance-type`), the key of its limits.
    pub instance_type: String,
    /// ENIs below this device index are never allocated from (`first-interface-index`).
    pub first_interface_index: u32,
    /// Security groups for new ENIs (`security-groups`).
    pub security_groups: Vec<String>,
    /// Else, groups carrying these tags (`security-group-tags`).
    pub security_group_tags: Tags,
    /// Subnets for new ENIs (`subnet-ids`).
    pub subnet_ids: Vec<String>,
    /// Else, subnets carrying these tags (`subnet-tags`).
    pub subnet_tags: Tags,
    /// The instance's VPC (`vpc-id`; empty → that of its device-0 ENI).
    pub vpc_id: String,
    /// The instance's zone (`availability-zone`; empty → that of its device-0 ENI).
    pub availability_zone: String,
    /// ENIs carrying all these tags are never used (`exclude-interface-tags`).
    pub exclude_interface_tags: Tags,
    /// Mark new ENIs delete-on-termination (`delete-on-termination`; unset → yes).
    pub delete_on_termination: Option<bool>,
}

/// One node's spec.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeSpec {
    /// The node (CiliumNode) name.
    pub name: String,
    /// `spec.eni`.
    pub eni: EniSpec,
    /// `spec.ipam`.
    pub ipam: IpamSpec,
    /// Allocate /28 prefixes rather than single addresses: the operator's
    /// `--aws-enable-prefix-delegation`, unless the node opts out. Honoured only on nitro
    /// instances whose ENIs hold no single secondary addresses yet, as in Cilium.
    pub prefix_delegation: bool,
}
