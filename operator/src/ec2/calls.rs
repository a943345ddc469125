//! The EC2 actions the operator uses. Describes page through `NextToken` by hand so every
//! page is one rate-limited, measured call.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use aws_sdk_ec2::types::{
    Filter, InstanceType, NetworkInterfaceAttachmentChanges, ResourceType, TagSpecification,
};

use super::{Ec2, Ec2Error, convert};
use crate::limits::Limits;
use crate::model::{Eni, SecurityGroup, Subnet, Tags, Vpc};

/// Items per DescribeInstanceTypes page (EC2's maximum).
const INSTANCE_TYPES_PAGE_SIZE: i32 = 100;

/// Which subnets the operator may use (`--subnet-ids-filter`, `--subnet-tags-filter`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubnetFilter {
    /// Only these subnet IDs (all if empty).
    pub ids: Vec<String>,
    /// Only subnets carrying all these tags.
    pub tags: Tags,
}

impl SubnetFilter {
    fn to_sdk(&self) -> Vec<Filter> {
        let mut filters = Vec::new();
        if !self.ids.is_empty() {
            filters.push(
                Filter::builder()
                    .name("subnet-id")
                    .set_values(Some(self.ids.clone()))
                    .build(),
            );
        }
        filters.extend(self.tags.iter().map(|(key, value)| {
            Filter::builder()
                .name(format!("tag:{key}"))
                .values(value)
                .build()
        }));
        filters
    }
}

/// A new ENI: where, with which groups, how many secondary addresses or /28 prefixes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateEniRequest {
    /// The subnet to create it in.
    pub subnet_id: String,
    /// Security group IDs.
    pub security_groups: Vec<String>,
    /// The ENI's description.
    pub description: String,
    /// Secondary addresses (or, with `prefixes`, /28 prefixes) to assign at creation.
    pub count: usize,
    /// Assign `count` /28 prefixes instead of addresses.
    pub prefixes: bool,
    /// Tags put on the ENI at creation (`--eni-tags`).
    pub tags: Tags,
}

fn to_i32(value: usize) -> i32 {
    i32::try_from(value).unwrap_or(i32::MAX)
}

impl Ec2 {
    /// Every ENI matching `filters` (all if empty), with the instance each is attached to.
    pub async fn describe_network_interfaces(
        &self,
        filters: Vec<Filter>,
    ) -> Result<Vec<(Option<String>, Eni)>, Ec2Error> {
        let mut all = Vec::new();
        let mut token = None;
        loop {
            let request = self
                .client
                .describe_network_interfaces()
                .set_filters((!filters.is_empty()).then(|| filters.clone()))
                .max_results(self.page_size)
                .set_next_token(token.take())
                .send();
            let page = self.call("DescribeNetworkInterfaces", request).await?;
            all.extend(page.network_interfaces().iter().filter_map(convert::eni));
            match page.next_token() {
                Some(next) if !next.is_empty() => token = Some(next.to_owned()),
                _ => return Ok(all),
            }
        }
    }

    /// Every subnet the filter admits.
    pub async fn describe_subnets(&self, filter: &SubnetFilter) -> Result<Vec<Subnet>, Ec2Error> {
        let filters = filter.to_sdk();
        let mut all = Vec::new();
        let mut token = None;
        loop {
            let request = self
                .client
                .describe_subnets()
                .set_filters((!filters.is_empty()).then(|| filters.clone()))
                .max_results(self.page_size)
                .set_next_token(token.take())
                .send();
            let page = self.call("DescribeSubnets", request).await?;
            all.extend(page.subnets().iter().filter_map(convert::subnet));
            match page.next_token() {
                Some(next) if !next.is_empty() => token = Some(next.to_owned()),
                _ => return Ok(all),
            }
        }
    }

    /// Every VPC.
    pub async fn describe_vpcs(&self) -> Result<Vec<Vpc>, Ec2Error> {
        let mut all = Vec::new();
        let mut token = None;
        loop {
            let request = self
                .client
                .describe_vpcs()
                .max_results(self.page_size)
                .set_next_token(token.take())
                .send();
            let page = self.call("DescribeVpcs", request).await?;
            all.extend(page.vpcs().iter().filter_map(convert::vpc));
            match page.next_token() {
                Some(next) if !next.is_empty() => token = Some(next.to_owned()),
                _ => return Ok(all),
            }
        }
    }

    /// Every security group.
    pub async fn describe_security_groups(&self) -> Result<Vec<SecurityGroup>, Ec2Error> {
        let mut all = Vec::new();
        let mut token = None;
        loop {
            let request = self
                .client
                .describe_security_groups()
                .max_results(self.page_size)
                .set_next_token(token.take())
                .send();
            let page = self.call("DescribeSecurityGroups", request).await?;
            all.extend(
                page.security_groups()
                    .iter()
                    .filter_map(convert::security_group),
            );
            match page.next_token() {
                Some(next) if !next.is_empty() => token = Some(next.to_owned()),
                _ => return Ok(all),
            }
        }
    }

    /// IDs of the instances carrying all `tags` (`--instance-tags-filter`).
    pub async fn describe_instance_ids(&self, tags: &Tags) -> Result<BTreeSet<String>, Ec2Error> {
        let filters: Vec<Filter> = tags
            .iter()
            .map(|(key, value)| {
                Filter::builder()
                    .name(format!("tag:{key}"))
                    .values(value)
                    .build()
            })
            .collect();
        let mut all = BTreeSet::new();
        let mut token = None;
        loop {
            let request = self
                .client
                .describe_instances()
                .set_filters((!filters.is_empty()).then(|| filters.clone()))
                .max_results(self.page_size)
                .set_next_token(token.take())
                .send();
            let page = self.call("DescribeInstances", request).await?;
            all.extend(
                page.reservations()
                    .iter()
                    .flat_map(|reservation| reservation.instances())
                    .filter_map(|instance| instance.instance_id().map(str::to_owned)),
            );
            match page.next_token() {
                Some(next) if !next.is_empty() => token = Some(next.to_owned()),
                _ => return Ok(all),
            }
        }
    }

    /// The type of instance `instance_id` (one DescribeInstances), `None` when EC2 knows no
    /// such instance.
    pub async fn describe_instance_type(
        &self,
        instance_id: &str,
    ) -> Result<Option<String>, Ec2Error> {
        let request = self
            .client
            .describe_instances()
            .instance_ids(instance_id)
            .send();
        match self.call("DescribeInstances", request).await {
            Ok(page) => Ok(page
                .reservations()
                .iter()
                .flat_map(|reservation| reservation.instances())
                .find(|instance| instance.instance_id() == Some(instance_id))
                .and_then(|instance| instance.instance_type())
                .map(|instance_type| instance_type.as_str().to_owned())),
            Err(err)
                if matches!(
                    err.code(),
                    Some("InvalidInstanceID.NotFound" | "InvalidInstanceID.Malformed")
                ) =>
            {
                Ok(None)
            }
            Err(err) => Err(err),
        }
    }

    /// Limits of the named instance types (every type if `types` is empty; EC2 takes at
    /// most 100 names).
    pub async fn describe_instance_types(
        &self,
        types: &[String],
    ) -> Result<Vec<(String, Limits)>, Ec2Error> {
        let names = (!types.is_empty()).then(|| {
            types
                .iter()
                .map(|t| InstanceType::from(t.as_str()))
                .collect::<Vec<_>>()
        });
        let mut all = Vec::new();
        let mut token = None;
        loop {
            let request = self
                .client
                .describe_instance_types()
                .set_instance_types(names.clone())
                // Named types come in one answer; only the full list is paged.
                .set_max_results(names.is_none().then_some(INSTANCE_TYPES_PAGE_SIZE))
                .set_next_token(token.take())
                .send();
            let page = self.call("DescribeInstanceTypes", request).await?;
            all.extend(
                page.instance_types()
                    .iter()
                    .filter_map(convert::instance_type),
            );
            match page.next_token() {
                Some(next) if !next.is_empty() => token = Some(next.to_owned()),
                _ => return Ok(all),
            }
        }
    }

    /// Creates an unattached ENI carrying its addresses (or prefixes) from the start, so a
    /// new ENI costs one call rather than create + assign.
    pub async fn create_network_interface(
        &self,
        create: &CreateEniRequest,
    ) -> Result<Eni, Ec2Error> {
        const OPERATION: &str = "CreateNetworkInterface";
        let mut request = self
            .client
            .create_network_interface()
            .subnet_id(&create.subnet_id)
            .set_groups(Some(create.security_groups.clone()))
            .description(&create.description);
        request = if create.prefixes {
            request.ipv4_prefix_count(to_i32(create.count))
        } else {
            request.secondary_private_ip_address_count(to_i32(create.count))
        };
        if !create.tags.is_empty() {
            request = request.tag_specifications(
                TagSpecification::builder()
                    .resource_type(ResourceType::NetworkInterface)
                    .set_tags(Some(convert::sdk_tags(&create.tags)))
                    .build(),
            );
        }
        let output = self.call(OPERATION, request.send()).await?;
        output
            .network_interface()
            .and_then(convert::eni)
            .map(|(_, eni)| eni)
            .ok_or(Ec2Error::MissingField {
                operation: OPERATION,
                field: "NetworkInterface",
            })
    }

    /// Attaches an ENI at `device_index`; returns the attachment ID.
    pub async fn attach_network_interface(
        &self,
        eni_id: &str,
        instance_id: &str,
        device_index: u32,
    ) -> Result<String, Ec2Error> {
        const OPERATION: &str = "AttachNetworkInterface";
        let request = self
            .client
            .attach_network_interface()
            .network_interface_id(eni_id)
            .instance_id(instance_id)
            .device_index(i32::try_from(device_index).unwrap_or(i32::MAX))
            .send();
        let output = self.call(OPERATION, request).await?;
        output
            .attachment_id()
            .map(str::to_owned)
            .ok_or(Ec2Error::MissingField {
                operation: OPERATION,
                field: "AttachmentId",
            })
    }

    /// Marks an attachment delete-on-termination, so terminating the instance frees the ENI.
    pub async fn set_delete_on_termination(
        &self,
        eni_id: &str,
        attachment_id: &str,
    ) -> Result<(), Ec2Error> {
        let request = self
            .client
            .modify_network_interface_attribute()
            .network_interface_id(eni_id)
            .attachment(
                NetworkInterfaceAttachmentChanges::builder()
                    .attachment_id(attachment_id)
                    .delete_on_termination(true)
                    .build(),
            )
            .send();
        self.call("ModifyNetworkInterfaceAttribute", request)
            .await
            .map(drop)
    }

    /// Detaches an ENI (forced: it is one the operator failed to finish setting up).
    pub async fn detach_network_interface(&self, attachment_id: &str) -> Result<(), Ec2Error> {
        let request = self
            .client
            .detach_network_interface()
            .attachment_id(attachment_id)
            .force(true)
            .send();
        self.call("DetachNetworkInterface", request).await.map(drop)
    }

    /// Deletes an unattached ENI.
    pub async fn delete_network_interface(&self, eni_id: &str) -> Result<(), Ec2Error> {
        let request = self
            .client
            .delete_network_interface()
            .network_interface_id(eni_id)
            .send();
        self.call("DeleteNetworkInterface", request).await.map(drop)
    }

    /// Assigns `count` more secondary addresses to an ENI; returns the new addresses.
    pub async fn assign_private_ip_addresses(
        &self,
        eni_id: &str,
        count: usize,
    ) -> Result<Vec<Ipv4Addr>, Ec2Error> {
        let request = self
            .client
            .assign_private_ip_addresses()
            .network_interface_id(eni_id)
            .secondary_private_ip_address_count(to_i32(count))
            .send();
        let output = self.call("AssignPrivateIpAddresses", request).await?;
        Ok(output
            .assigned_private_ip_addresses()
            .iter()
            .filter_map(|assigned| assigned.private_ip_address()?.parse().ok())
            .collect())
    }

    /// Assigns `count` more /28 prefixes to an ENI; returns the new prefixes.
    pub async fn assign_ipv4_prefixes(
        &self,
        eni_id: &str,
        count: usize,
    ) -> Result<Vec<String>, Ec2Error> {
        let request = self
            .client
            .assign_private_ip_addresses()
            .network_interface_id(eni_id)
            .ipv4_prefix_count(to_i32(count))
            .send();
        let output = self.call("AssignPrivateIpAddresses", request).await?;
        Ok(output
            .assigned_ipv4_prefixes()
            .iter()
            .filter_map(|prefix| prefix.ipv4_prefix().map(str::to_owned))
            .collect())
    }

    /// Unassigns secondary addresses from an ENI.
    pub async fn unassign_private_ip_addresses(
        &self,
        eni_id: &str,
        addresses: &[Ipv4Addr],
    ) -> Result<(), Ec2Error> {
        let request = self
            .client
            .unassign_private_ip_addresses()
            .network_interface_id(eni_id)
            .set_private_ip_addresses(Some(addresses.iter().map(ToString::to_string).collect()))
            .send();
        self.call("UnassignPrivateIpAddresses", request)
            .await
            .map(drop)
    }
}

/// The DescribeNetworkInterfaces filter for the ENIs attached to one instance.
pub fn attached_to(instance_id: &str) -> Filter {
    Filter::builder()
        .name("attachment.instance-id")
        .values(instance_id)
        .build()
}
