//! The allocation decision, as a pure function of the node's spec, its usage, its limits and
//! the describe cache: what the next EC2 mutation for this node is, if any.

use crate::allocation::{excess_ips, needed_ips};
use crate::instances::InstanceCache;
use crate::limits::Limits;
use crate::model::{Eni, PREFIX_SIZE, Subnet, Tags, tags_match};

use super::spec::NodeSpec;

/// The node's figures at planning time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// Secondary addresses held on usable ENIs (the pool).
    pub available: usize,
    /// Addresses in use by the node.
    pub used: usize,
    /// Addresses to allocate now.
    pub needed: usize,
    /// Addresses held in excess.
    pub excess: usize,
    /// The most the node may hold: `max-allocate`, else the instance's limit.
    pub max_allocatable: usize,
    /// The node allocates /28 prefixes.
    pub prefix_delegated: bool,
}

/// A new ENI to create and attach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateEni {
    /// The chosen subnet.
    pub subnet_id: String,
    /// The chosen security groups.
    pub security_groups: Vec<String>,
    /// The device index to try first.
    pub device_index: u32,
    /// Secondary addresses to create it with (rounded up to whole prefixes if `prefixes`).
    pub count: usize,
    /// Create it with /28 prefixes.
    pub prefixes: bool,
}

/// The next mutation for the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// The node needs nothing.
    Nothing,
    /// Assign more secondary addresses to an attached ENI with room.
    Assign {
        /// The ENI.
        eni_id: String,
        /// Its subnet.
        subnet_id: String,
        /// How many addresses (rounded up to whole prefixes if `prefixes`).
        count: usize,
        /// Assign /28 prefixes.
        prefixes: bool,
    },
    /// Create, attach and set up a new ENI.
    Create(CreateEni),
}

/// A decision and the figures it was made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The figures.
    pub stats: NodeStats,
    /// What to do.
    pub action: Action,
}

/// Why the node's deficit cannot be worked on; none of these goes away by retrying at once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The instance type's limits are unknown (not described, no override).
    #[error("limits of instance type {instance_type:?} are unknown")]
    UnknownLimits {
        /// The type.
        instance_type: String,
    },
    /// No ENI is attached to the instance: it is gone, or not described yet.
    #[error("instance {instance_id} has no ENIs (terminated, or not described yet)")]
    InstanceNotFound {
        /// The instance.
        instance_id: String,
    },
    /// Every device slot is taken and no usable ENI has room.
    #[error(
        "instance {instance_id} is out of interfaces ({adapters} attached) and still needs {needed} addresses"
    )]
    OutOfInterfaces {
        /// The instance.
        instance_id: String,
        /// Its ENI limit.
        adapters: u32,
        /// The unmet need.
        needed: usize,
    },
    /// No subnet matches the node's VPC, zone and subnet IDs or tags.
    #[error(
        "no subnet for a new ENI (VPC {vpc_id}, zone {zone}, subnet IDs {ids:?}, subnet tags {tags:?})"
    )]
    NoSubnet {
        /// The VPC.
        vpc_id: String,
        /// The zone.
        zone: String,
        /// The requested subnet IDs.
        ids: Vec<String>,
        /// The requested subnet tags.
        tags: Tags,
    },
    /// The subnet to allocate from has no free address left.
    #[error(
        "subnet {subnet_id} is exhausted ({available} free addresses) and the node still needs {needed}"
    )]
    SubnetExhausted {
        /// The subnet.
        subnet_id: String,
        /// Its free addresses.
        available: usize,
        /// The unmet need.
        needed: usize,
    },
    /// No security group for a new ENI: none given, none tagged, none on device 0.
    #[error("no security groups for a new ENI on {instance_id}")]
    NoSecurityGroups {
        /// The instance.
        instance_id: String,
    },
}

/// True if the node must not allocate from `eni`: below `first-interface-index`, or tagged
/// with all of `exclude-interface-tags`.
pub fn is_excluded(eni: &Eni, first_interface_index: u32, exclude_tags: &Tags) -> bool {
    eni.number < first_interface_index
        || (!exclude_tags.is_empty() && tags_match(&eni.tags, exclude_tags))
}

fn count_i64(value: usize) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Decides the node's next mutation.
pub fn plan(
    spec: &NodeSpec,
    used: usize,
    limits: Option<&Limits>,
    cache: &InstanceCache,
) -> Result<Plan, PlanError> {
    let eni_spec = &spec.eni;
    let limits = limits.ok_or_else(|| PlanError::UnknownLimits {
        instance_type: eni_spec.instance_type.clone(),
    })?;
    let mut enis: Vec<&Eni> = cache.enis(&eni_spec.instance_id).collect();
    if enis.is_empty() {
        return Err(PlanError::InstanceNotFound {
            instance_id: eni_spec.instance_id.clone(),
        });
    }
    enis.sort_by_key(|eni| (eni.number, eni.id.clone()));
    let usable = |eni: &&Eni| {
        !is_excluded(
            eni,
            eni_spec.first_interface_index,
            &eni_spec.exclude_interface_tags,
        )
    };

    // Prefixes only on nitro, and never mixed into ENIs that already hold single addresses.
    let prefix_delegated = spec.prefix_delegation
        && limits.hypervisor == "nitro"
        && enis
            .iter()
            .all(|eni| eni.addresses.is_empty() || !eni.prefixes.is_empty());
    let slots_per_eni = limits.secondary_per_adapter();
    // Room of an ENI in addresses: each slot holds a prefix when delegating; otherwise
    // prefixes left from earlier delegation still count for their 16 addresses.
    let capacity = |eni: &Eni| {
        if prefix_delegated {
            slots_per_eni * PREFIX_SIZE
        } else {
            slots_per_eni + eni.prefixes.len() * (PREFIX_SIZE - 1)
        }
    };

    let ipam = &spec.ipam;
    let available: usize = enis
        .iter()
        .copied()
        .filter(usable)
        .map(|eni| eni.addresses.len())
        .sum();
    let max_allocatable = if ipam.max_allocate > 0 {
        usize::try_from(ipam.max_allocate).unwrap_or(usize::MAX)
    } else if prefix_delegated {
        limits.max_allocatable(eni_spec.first_interface_index) * PREFIX_SIZE
    } else {
        limits.max_allocatable(eni_spec.first_interface_index)
    };
    let pre = ipam.effective_pre_allocate();
    let needed = needed_ips(
        count_i64(available),
        count_i64(used),
        pre,
        ipam.min_allocate,
        count_i64(max_allocatable),
    );
    let excess = excess_ips(
        count_i64(available),
        count_i64(used),
        pre,
        ipam.min_allocate,
        ipam.max_above_watermark,
    );
    let stats = NodeStats {
        available,
        used,
        needed,
        excess,
        max_allocatable,
        prefix_delegated,
    };
    if needed == 0 {
        return Ok(Plan {
            stats,
            action: Action::Nothing,
        });
    }
    // Cilium takes max-above-watermark on top of the deficit whenever it allocates.
    let wanted = needed + usize::try_from(ipam.max_above_watermark.max(0)).unwrap_or(0);

    // First an attached, usable ENI with room, in a subnet with free addresses.
    let mut exhausted: Option<&Subnet> = None;
    for eni in enis.iter().copied().filter(usable) {
        let room = capacity(eni).saturating_sub(eni.addresses.len());
        if room == 0 {
            continue;
        }
        let Some(subnet) = cache.subnet(&eni.subnet.id) else {
            continue;
        };
        if subnet.available_addresses == 0 {
            exhausted.get_or_insert(subnet);
            continue;
        }
        let count = wanted.min(room).min(subnet.available_addresses);
        return Ok(Plan {
            stats,
            action: Action::Assign {
                eni_id: eni.id.clone(),
                subnet_id: subnet.id.clone(),
                count,
                prefixes: prefix_delegated,
            },
        });
    }

    // Else a new ENI, if a device slot is free.
    let slots_used = u32::try_from(enis.len()).unwrap_or(u32::MAX);
    if slots_used >= limits.adapters {
        return Err(match exhausted {
            Some(subnet) => PlanError::SubnetExhausted {
                subnet_id: subnet.id.clone(),
                available: subnet.available_addresses,
                needed,
            },
            None => PlanError::OutOfInterfaces {
                instance_id: eni_spec.instance_id.clone(),
                adapters: limits.adapters,
                needed,
            },
        });
    }
    let primary = enis.iter().find(|eni| eni.number == 0).copied();
    let subnet = choose_subnet(spec, primary, limits, cache)?;
    // A new ENI takes one address for its primary, and is only worth it with a secondary.
    if subnet.available_addresses < 2 {
        return Err(PlanError::SubnetExhausted {
            subnet_id: subnet.id.clone(),
            available: subnet.available_addresses,
            needed,
        });
    }
    let security_groups = choose_security_groups(spec, primary, cache)?;
    let device_index = next_free_index(&enis, eni_spec.first_interface_index);
    let per_new_eni = if prefix_delegated {
        slots_per_eni * PREFIX_SIZE
    } else {
        slots_per_eni
    };
    let count = wanted.min(per_new_eni).min(subnet.available_addresses - 1);
    Ok(Plan {
        stats,
        action: Action::Create(CreateEni {
            subnet_id: subnet.id.clone(),
            security_groups,
            device_index,
            count,
            prefixes: prefix_delegated,
        }),
    })
}

/// The first device index at or above `from` that no ENI of the instance occupies.
pub fn next_free_index(enis: &[&Eni], from: u32) -> u32 {
    let mut index = from;
    while enis.iter().any(|eni| eni.number == index) {
        index += 1;
    }
    index
}

/// Subnet IDs, else subnet tags, else the device-0 ENI's subnet if it can take a full ENI,
/// else any subnet of the VPC and zone; always the one with the most free addresses.
fn choose_subnet<'a>(
    spec: &NodeSpec,
    primary: Option<&Eni>,
    limits: &Limits,
    cache: &'a InstanceCache,
) -> Result<&'a Subnet, PlanError> {
    let eni_spec = &spec.eni;
    let vpc_id = if eni_spec.vpc_id.is_empty() {
        primary.map(|eni| eni.vpc.id.as_str()).unwrap_or_default()
    } else {
        eni_spec.vpc_id.as_str()
    };
    let zone = if eni_spec.availability_zone.is_empty() {
        primary
            .map(|eni| eni.availability_zone.as_str())
            .unwrap_or_default()
    } else {
        eni_spec.availability_zone.as_str()
    };
    let found = if !eni_spec.subnet_ids.is_empty() {
        cache.find_subnet_by_ids(vpc_id, zone, &eni_spec.subnet_ids)
    } else if !eni_spec.subnet_tags.is_empty() {
        cache.find_subnet_by_tags(vpc_id, zone, &eni_spec.subnet_tags)
    } else {
        primary
            .and_then(|eni| cache.subnet(&eni.subnet.id))
            .filter(|s| s.available_addresses >= usize::try_from(limits.ipv4).unwrap_or(usize::MAX))
            .or_else(|| cache.find_subnet_by_tags(vpc_id, zone, &Tags::new()))
    };
    found.ok_or_else(|| PlanError::NoSubnet {
        vpc_id: vpc_id.to_owned(),
        zone: zone.to_owned(),
        ids: eni_spec.subnet_ids.clone(),
        tags: eni_spec.subnet_tags.clone(),
    })
}

/// Security group IDs, else groups carrying the tags (if any match), else those of device 0.
fn choose_security_groups(
    spec: &NodeSpec,
    primary: Option<&Eni>,
    cache: &InstanceCache,
) -> Result<Vec<String>, PlanError> {
    let eni_spec = &spec.eni;
    if !eni_spec.security_groups.is_empty() {
        return Ok(eni_spec.security_groups.clone());
    }
    if !eni_spec.security_group_tags.is_empty() {
        let vpc_id = if eni_spec.vpc_id.is_empty() {
            primary.map(|eni| eni.vpc.id.as_str()).unwrap_or_default()
        } else {
            eni_spec.vpc_id.as_str()
        };
        let tagged: Vec<String> = cache
            .find_security_groups_by_tags(vpc_id, &eni_spec.security_group_tags)
            .into_iter()
            .map(|group| group.id.clone())
            .collect();
        if !tagged.is_empty() {
            return Ok(tagged);
        }
        tracing::warn!(
            node = %spec.name,
            tags = ?eni_spec.security_group_tags,
            "no security group matches the tags; using those of device 0"
        );
    }
    match primary {
        Some(eni) if !eni.security_groups.is_empty() => Ok(eni.security_groups.clone()),
        _ => Err(PlanError::NoSecurityGroups {
            instance_id: eni_spec.instance_id.clone(),
        }),
    }
}
