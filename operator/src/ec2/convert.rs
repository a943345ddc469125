//! SDK types → the operator's model. Missing optional fields become empty values; only an
//! object without its ID is dropped (it could not be referred to anyway).

use std::net::Ipv4Addr;

use aws_sdk_ec2::types;

use crate::limits::Limits;
use crate::model::{Eni, EniSubnet, EniVpc, SecurityGroup, Subnet, Tags, Vpc, prefix_addresses};

fn tags(set: &[types::Tag]) -> Tags {
    set.iter()
        .filter_map(|tag| {
            Some((
                tag.key()?.to_owned(),
                tag.value().unwrap_or_default().to_owned(),
            ))
        })
        .collect()
}

fn text(value: Option<&str>) -> String {
    value.unwrap_or_default().to_owned()
}

fn count(value: Option<i32>) -> u32 {
    value.and_then(|v| u32::try_from(v).ok()).unwrap_or(0)
}

/// An ENI and the instance it is attached to (if any).
pub(crate) fn eni(sdk: &types::NetworkInterface) -> Option<(Option<String>, Eni)> {
    let id = sdk.network_interface_id()?.to_owned();
    let attachment = sdk.attachment();
    let prefixes: Vec<String> = sdk
        .ipv4_prefixes()
        .iter()
        .filter_map(|prefix| prefix.ipv4_prefix().map(str::to_owned))
        .collect();
    let addresses = sdk
        .private_ip_addresses()
        .iter()
        .filter(|address| address.primary() != Some(true))
        .filter_map(|address| address.private_ip_address()?.parse::<Ipv4Addr>().ok())
        .chain(prefixes.iter().flat_map(|prefix| prefix_addresses(prefix)))
        .collect();
    let eni = Eni {
        id,
        ip: sdk.private_ip_address().and_then(|ip| ip.parse().ok()),
        mac: text(sdk.mac_address()),
        availability_zone: text(sdk.availability_zone()),
        description: text(sdk.description()),
        number: count(attachment.and_then(types::NetworkInterfaceAttachment::device_index)),
        subnet: EniSubnet {
            id: text(sdk.subnet_id()),
            cidr: String::new(),
        },
        vpc: EniVpc {
            id: text(sdk.vpc_id()),
            ..EniVpc::default()
        },
        addresses,
        prefixes,
        security_groups: sdk
            .groups()
            .iter()
            .filter_map(|group| group.group_id().map(str::to_owned))
            .collect(),
        tags: tags(sdk.tag_set()),
        attachment_id: attachment
            .and_then(types::NetworkInterfaceAttachment::attachment_id)
            .map(str::to_owned),
    };
    let instance = attachment
        .and_then(types::NetworkInterfaceAttachment::instance_id)
        .map(str::to_owned);
    Some((instance, eni))
}

pub(crate) fn subnet(sdk: &types::Subnet) -> Option<Subnet> {
    Some(Subnet {
        id: sdk.subnet_id()?.to_owned(),
        cidr: text(sdk.cidr_block()),
        availability_zone: text(sdk.availability_zone()),
        vpc_id: text(sdk.vpc_id()),
        available_addresses: count(sdk.available_ip_address_count()) as usize,
        tags: tags(sdk.tags()),
    })
}

pub(crate) fn vpc(sdk: &types::Vpc) -> Option<Vpc> {
    let primary_cidr = text(sdk.cidr_block());
    let mut cidrs: Vec<String> = sdk
        .cidr_block_association_set()
        .iter()
        .filter_map(|association| association.cidr_block().map(str::to_owned))
        .collect();
    if cidrs.is_empty() && !primary_cidr.is_empty() {
        cidrs.push(primary_cidr.clone());
    }
    Some(Vpc {
        id: sdk.vpc_id()?.to_owned(),
        primary_cidr,
        cidrs,
    })
}

pub(crate) fn security_group(sdk: &types::SecurityGroup) -> Option<SecurityGroup> {
    Some(SecurityGroup {
        id: sdk.group_id()?.to_owned(),
        vpc_id: text(sdk.vpc_id()),
        tags: tags(sdk.tags()),
    })
}

pub(crate) fn instance_type(sdk: &types::InstanceTypeInfo) -> Option<(String, Limits)> {
    let name = sdk.instance_type()?.as_str().to_owned();
    let network = sdk.network_info()?;
    Some((
        name,
        Limits {
            adapters: count(network.maximum_network_interfaces()),
            ipv4: count(network.ipv4_addresses_per_interface()),
            ipv6: count(network.ipv6_addresses_per_interface()),
            hypervisor: sdk
                .hypervisor()
                .map(|h| h.as_str().to_owned())
                .unwrap_or_default(),
        },
    ))
}

pub(crate) fn sdk_tags(tags: &Tags) -> Vec<types::Tag> {
    tags.iter()
        .map(|(key, value)| types::Tag::builder().key(key).value(value).build())
        .collect()
}
