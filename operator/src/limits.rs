//! ENI and address limits per instance type, learnt from DescribeInstanceTypes and
//! overridable per type (for types EC2 does not describe, or to run below the real limits).

use std::collections::BTreeMap;

use crate::ec2::{Ec2, Ec2Error};

/// The limits of one instance type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// ENIs the instance can hold (`MaximumNetworkInterfaces`).
    pub adapters: u32,
    /// IPv4 addresses per ENI, the primary included (`Ipv4AddressesPerInterface`).
    pub ipv4: u32,
    /// IPv6 addresses per ENI.
    pub ipv6: u32,
    /// `nitro`, `xen`, … — prefix delegation needs `nitro`.
    pub hypervisor: String,
}

impl Limits {
    /// Secondary addresses one ENI can hold: its limit less the primary.
    pub fn secondary_per_adapter(&self) -> usize {
        usize::try_from(self.ipv4.saturating_sub(1)).unwrap_or(usize::MAX)
    }

    /// Addresses the instance can hand out on the ENIs at or above `first_interface_index`
    /// (Cilium: `(adapters − first-interface-index) × (IPv4 per adapter − 1)`).
    pub fn max_allocatable(&self, first_interface_index: u32) -> usize {
        let usable = usize::try_from(self.adapters.saturating_sub(first_interface_index))
            .unwrap_or(usize::MAX);
        usable.saturating_mul(self.secondary_per_adapter())
    }
}

/// Limits of every known instance type.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LimitsTable {
    types: BTreeMap<String, Limits>,
}

impl LimitsTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Describes the given instance types (all of them if `types` is empty) and returns
    /// their limits.
    pub async fn describe(ec2: &Ec2, types: &[String]) -> Result<Self, Ec2Error> {
        let described = ec2.describe_instance_types(types).await?;
        Ok(Self {
            types: described.into_iter().collect(),
        })
    }

    /// Sets (or replaces) one type's limits; overrides win over what EC2 said.
    pub fn set(&mut self, instance_type: impl Into<String>, limits: Limits) {
        self.types.insert(instance_type.into(), limits);
    }

    /// Adds every type of `other`, replacing those already present.
    pub fn merge(&mut self, other: Self) {
        self.types.extend(other.types);
    }

    /// The limits of `instance_type`, if known.
    pub fn get(&self, instance_type: &str) -> Option<&Limits> {
        self.types.get(instance_type)
    }

    /// How many types are known.
    pub fn len(&self) -> usize {
        self.types.len()
    }

    /// True if no type is known.
    pub fn is_empty(&self) -> bool {
        self.types.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(adapters: u32, ipv4: u32) -> Limits {
        Limits {
            adapters,
            ipv4,
            ipv6: ipv4,
            hypervisor: "nitro".to_owned(),
        }
    }

    #[test]
    fn max_allocatable_excludes_primaries_and_low_indexes() {
        // t2.xlarge: 3 × (15 − 1) = 42, Cilium's "exceeding ENI capacity" figure.
        assert_eq!(limits(3, 15).max_allocatable(0), 42);
        assert_eq!(limits(3, 15).max_allocatable(1), 28);
        assert_eq!(limits(3, 15).max_allocatable(4), 0);
        assert_eq!(limits(3, 10).secondary_per_adapter(), 9);
    }

    #[test]
    fn overrides_replace_described_limits() {
        let mut table = LimitsTable::new();
        table.set("m5.large", limits(3, 10));
        let mut overrides = LimitsTable::new();
        overrides.set("m5.large", limits(2, 4));
        table.merge(overrides);
        assert_eq!(table.get("m5.large"), Some(&limits(2, 4)));
        assert_eq!(table.len(), 1);
        assert!(table.get("t2.xlarge").is_none());
    }
}
