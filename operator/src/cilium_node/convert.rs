//! From the operator's own types into the CiliumNode's: ENIs from the describe cache into
//! `status.eni`, the node's pool into `spec.ipam.pool`, and the node's request both ways
//! between `spec` and the allocator's [`NodeSpec`].

use crate::instances::InstanceCache;
use crate::model::Eni;
use crate::node_allocator::{EniSpec as AllocatorEniSpec, IpamSpec as AllocatorIpamSpec};
use crate::node_allocator::{NodeSpec, is_excluded};

use super::{
    AllocationIp, AllocationMap, AwsSubnet, AwsVpc, CiliumNode, EniEntry, EniSpec, EniStatus,
    IpamSpec,
};

impl From<&Eni> for EniEntry {
    fn from(eni: &Eni) -> Self {
        Self {
            id: eni.id.clone(),
            ip: eni.ip.map(|ip| ip.to_string()).unwrap_or_default(),
            mac: eni.mac.clone(),
            availability_zone: eni.availability_zone.clone(),
            description: eni.description.clone(),
            number: i64::from(eni.number),
            subnet: AwsSubnet {
                id: eni.subnet.id.clone(),
                cidr: eni.subnet.cidr.clone(),
            },
            vpc: AwsVpc {
                id: eni.vpc.id.clone(),
                primary_cidr: eni.vpc.primary_cidr.clone(),
                cidrs: eni.vpc.cidrs.clone(),
            },
            addresses: eni.addresses.iter().map(ToString::to_string).collect(),
            prefixes: eni.prefixes.clone(),
            security_groups: eni.security_groups.clone(),
            tags: eni.tags.clone(),
        }
    }
}

/// `status.eni` of `instance_id`: every ENI the cache holds for it. Excluded ENIs are listed
/// too, as Cilium lists them; they just contribute nothing to the pool.
pub fn eni_status(cache: &InstanceCache, instance_id: &str) -> EniStatus {
    EniStatus {
        enis: cache
            .enis(instance_id)
            .map(|eni| (eni.id.clone(), EniEntry::from(eni)))
            .collect(),
    }
}

/// `spec.ipam.pool` of a node: every secondary address of every ENI the node may allocate
/// from (not below `first-interface-index`, not tagged with `exclude-interface-tags`), each
/// naming its ENI as `resource`.
pub fn pool(cache: &InstanceCache, spec: &NodeSpec) -> AllocationMap {
    cache
        .enis(&spec.eni.instance_id)
        .filter(|eni| {
            !is_excluded(
                eni,
                spec.eni.first_interface_index,
                &spec.eni.exclude_interface_tags,
            )
        })
        .flat_map(|eni| {
            eni.addresses.iter().map(|address| {
                let ip = AllocationIp {
                    owner: String::new(),
                    resource: eni.id.clone(),
                };
                (address.to_string(), ip)
            })
        })
        .collect()
}

impl From<&NodeSpec> for EniSpec {
    fn from(spec: &NodeSpec) -> Self {
        let eni = &spec.eni;
        Self {
            instance_id: eni.instance_id.clone(),
            instance_type: eni.instance_type.clone(),
            first_interface_index: Some(i64::from(eni.first_interface_index)),
            security_groups: eni.security_groups.clone(),
            security_group_tags: eni.security_group_tags.clone(),
            subnet_ids: eni.subnet_ids.clone(),
            subnet_tags: eni.subnet_tags.clone(),
            vpc_id: eni.vpc_id.clone(),
            availability_zone: eni.availability_zone.clone(),
            exclude_interface_tags: eni.exclude_interface_tags.clone(),
            delete_on_termination: eni.delete_on_termination,
        }
    }
}

impl From<&NodeSpec> for IpamSpec {
    /// The watermarks; the pool is the operator's to fill (see [`pool`]).
    fn from(spec: &NodeSpec) -> Self {
        Self {
            pool: AllocationMap::new(),
            pre_allocate: spec.ipam.pre_allocate,
            min_allocate: spec.ipam.min_allocate,
            max_allocate: spec.ipam.max_allocate,
            max_above_watermark: spec.ipam.max_above_watermark,
        }
    }
}

/// What the allocator needs from a CiliumNode: its name, `spec.eni` and the watermarks.
/// A negative or absurd `first-interface-index` counts as unset (0); prefix delegation is
/// the operator's flag, not the object's, so it starts off.
pub fn node_spec(node: &CiliumNode) -> NodeSpec {
    let eni = &node.spec.eni;
    let ipam = &node.spec.ipam;
    NodeSpec {
        name: node.metadata.name.clone().unwrap_or_default(),
        eni: AllocatorEniSpec {
            instance_id: eni.instance_id.clone(),
            instance_type: eni.instance_type.clone(),
            first_interface_index: eni
                .first_interface_index
                .and_then(|index| u32::try_from(index).ok())
                .unwrap_or(0),
            security_groups: eni.security_groups.clone(),
            security_group_tags: eni.security_group_tags.clone(),
            subnet_ids: eni.subnet_ids.clone(),
            subnet_tags: eni.subnet_tags.clone(),
            vpc_id: eni.vpc_id.clone(),
            availability_zone: eni.availability_zone.clone(),
            exclude_interface_tags: eni.exclude_interface_tags.clone(),
            delete_on_termination: eni.delete_on_termination,
        },
        ipam: AllocatorIpamSpec {
            pre_allocate: ipam.pre_allocate,
            min_allocate: ipam.min_allocate,
            max_allocate: ipam.max_allocate,
            max_above_watermark: ipam.max_above_watermark,
        },
        prefix_delegation: false,
    }
}
