//! What the operator knows about EC2 objects, in the shape Cilium publishes them
//! (`status.eni.enis` of a CiliumNode), independent of the SDK's types.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

/// EC2 tags, key → value.
pub type Tags = BTreeMap<String, String>;

/// True if every `required` tag is present in `tags` with the same value (Cilium's
/// `Tags.Match`: an empty requirement matches everything).
pub fn tags_match(tags: &Tags, required: &Tags) -> bool {
    required
        .iter()
        .all(|(key, value)| tags.get(key) == Some(value))
}

/// Addresses in one delegated IPv4 prefix (/28).
pub const PREFIX_SIZE: usize = 16;

/// The addresses of a delegated `a.b.c.d/28` prefix; empty if it is not one.
pub fn prefix_addresses(prefix: &str) -> Vec<Ipv4Addr> {
    let Some((base, len)) = prefix.split_once('/') else {
        return Vec::new();
    };
    let (Ok(base), Ok(28)) = (base.parse::<Ipv4Addr>(), len.parse::<u8>()) else {
        return Vec::new();
    };
    let base = u32::from(base) & !0xf;
    (0..16)
        .map(|offset| Ipv4Addr::from(base + offset))
        .collect()
}

/// A VPC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vpc {
    /// `vpc-…`.
    pub id: String,
    /// The VPC's primary IPv4 CIDR.
    pub primary_cidr: String,
    /// Every associated IPv4 CIDR, the primary included.
    pub cidrs: Vec<String>,
}

/// A subnet, with the free-address count EC2 reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subnet {
    /// `subnet-…`.
    pub id: String,
    /// The subnet's IPv4 CIDR.
    pub cidr: String,
    /// The availability zone, e.g. `us-east-1a`.
    pub availability_zone: String,
    /// The VPC the subnet belongs to.
    pub vpc_id: String,
    /// `AvailableIpAddressCount`: addresses not held by anything.
    pub available_addresses: usize,
    /// The subnet's tags.
    pub tags: Tags,
}

/// A security group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecurityGroup {
    /// `sg-…`.
    pub id: String,
    /// The VPC the group belongs to.
    pub vpc_id: String,
    /// The group's tags.
    pub tags: Tags,
}

/// The subnet of an ENI, as published in `status.eni.enis[].subnet`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EniSubnet {
    /// `subnet-…`.
    pub id: String,
    /// The subnet's CIDR (filled from the subnet cache; EC2's ENI answer lacks it).
    pub cidr: String,
}

/// The VPC of an ENI, as published in `status.eni.enis[].vpc`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EniVpc {
    /// `vpc-…`.
    pub id: String,
    /// The VPC's primary CIDR.
    pub primary_cidr: String,
    /// All of the VPC's CIDRs.
    pub cidrs: Vec<String>,
}

/// An elastic network interface attached to (or being attached to) an instance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Eni {
    /// `eni-…`.
    pub id: String,
    /// The primary private IPv4 address (never handed to pods).
    pub ip: Option<Ipv4Addr>,
    /// The MAC address.
    pub mac: String,
    /// The availability zone.
    pub availability_zone: String,
    /// The ENI's description.
    pub description: String,
    /// The attachment's device index (`number` in Cilium's JSON).
    pub number: u32,
    /// The subnet.
    pub subnet: EniSubnet,
    /// The VPC.
    pub vpc: EniVpc,
    /// Secondary private IPv4 addresses: the pool this ENI contributes (primary excluded;
    /// the addresses of delegated prefixes included, as Cilium lists them).
    pub addresses: Vec<Ipv4Addr>,
    /// Delegated IPv4 prefixes (`a.b.c.d/28`).
    pub prefixes: Vec<String>,
    /// Security group IDs.
    pub security_groups: Vec<String>,
    /// The ENI's tags.
    pub tags: Tags,
    /// The attachment ID, when attached (needed to change delete-on-termination).
    pub attachment_id: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(pairs: &[(&str, &str)]) -> Tags {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_prefix_expands_to_its_sixteen_addresses() {
        let addresses = prefix_addresses("10.213.0.32/28");
        assert_eq!(addresses.len(), PREFIX_SIZE);
        assert_eq!(addresses.first(), Some(&Ipv4Addr::new(10, 213, 0, 32)));
        assert_eq!(addresses.last(), Some(&Ipv4Addr::new(10, 213, 0, 47)));
        assert!(prefix_addresses("10.213.0.32/27").is_empty());
        assert!(prefix_addresses("nonsense").is_empty());
    }

    #[test]
    fn tags_match_is_a_subset_check() {
        let have = tags(&[("a", "1"), ("b", "2")]);
        assert!(tags_match(&have, &Tags::new()));
        assert!(tags_match(&have, &tags(&[("a", "1")])));
        assert!(!tags_match(&have, &tags(&[("a", "2")])));
        assert!(!tags_match(&have, &tags(&[("c", "1")])));
    }
}
