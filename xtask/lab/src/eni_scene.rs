//! An AWS scene in the patched moto for ENI IPAM: one VPC (10.213.0.0/16, a lab range whose
//! root-namespace route is `unreachable`, unless [`EniScene::create_with`] is given another),
//! one subnet, one security group and `nodes` running instances, made with the real EC2 SDK.

use aws_sdk_ec2::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_ec2::types::InstanceType;

use crate::moto::MotoServer;
use crate::{LabError, Result};

/// The region of the scene.
pub const REGION: &str = "us-east-1";
/// The zone everything lives in.
pub const ZONE: &str = "us-east-1a";
/// The VPC's CIDR.
pub const VPC_CIDR: &str = "10.213.0.0/16";
/// The default instance type (3 ENIs × 10 IPv4 addresses).
pub const INSTANCE_TYPE: &str = "m5.large";

/// What [`EniScene::create`] made.
#[derive(Debug)]
pub struct EniScene {
    /// A plain SDK client for changing the scene behind the operator's back.
    pub sdk: aws_sdk_ec2::Client,
    /// The VPC ID.
    pub vpc: String,
    /// The subnet ID.
    pub subnet: String,
    /// The security group ID.
    pub security_group: String,
    /// The instance IDs, one per node.
    pub instances: Vec<String>,
}

fn failed(step: &str) -> impl FnOnce(String) -> LabError + '_ {
    move |detail| LabError::CommandFailed {
        command: format!("moto: {step}"),
        detail,
    }
}

impl EniScene {
    /// The SDK client of `moto`.
    pub fn client(moto: &MotoServer) -> aws_sdk_ec2::Client {
        Self::client_at(&moto.endpoint())
    }

    /// The SDK client of the EC2 endpoint `endpoint` (a moto server, by URL).
    pub fn client_at(endpoint: &str) -> aws_sdk_ec2::Client {
        let config = aws_sdk_ec2::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(REGION))
            .endpoint_url(endpoint)
            .credentials_provider(Credentials::new("testing", "testing", None, None, "lab"))
            .build();
        aws_sdk_ec2::Client::from_conf(config)
    }

    /// The VPC, a subnet of `subnet_cidr` (inside [`VPC_CIDR`]), a security group and
    /// `nodes` instances of `instance_type` (e.g. [`INSTANCE_TYPE`]) in it.
    pub async fn create(
        moto: &MotoServer,
        subnet_cidr: &str,
        instance_type: &str,
        nodes: usize,
    ) -> Result<Self> {
        Self::create_with(
            Self::client(moto),
            (VPC_CIDR, subnet_cidr),
            instance_type,
            nodes,
        )
        .await
    }

    /// [`EniScene::create`] through `sdk` (any EC2 endpoint), with a VPC of `vpc_cidr` and a
    /// subnet of `subnet_cidr` inside it.
    pub async fn create_with(
        sdk: aws_sdk_ec2::Client,
        (vpc_cidr, subnet_cidr): (&str, &str),
        instance_type: &str,
        nodes: usize,
    ) -> Result<Self> {
        let vpc = sdk
            .create_vpc()
            .cidr_block(vpc_cidr)
            .send()
            .await
            .map_err(|e| failed("CreateVpc")(e.to_string()))?;
        let vpc = vpc
            .vpc()
            .and_then(|v| v.vpc_id())
            .ok_or_else(|| failed("CreateVpc")("no VPC ID".to_owned()))?
            .to_owned();
        let subnet = sdk
            .create_subnet()
            .vpc_id(&vpc)
            .cidr_block(subnet_cidr)
            .availability_zone(ZONE)
            .send()
            .await
            .map_err(|e| failed("CreateSubnet")(e.to_string()))?;
        let subnet = subnet
            .subnet()
            .and_then(|s| s.subnet_id())
            .ok_or_else(|| failed("CreateSubnet")("no subnet ID".to_owned()))?
            .to_owned();
        let group = sdk
            .create_security_group()
            .vpc_id(&vpc)
            .group_name("nodes")
            .description("nodes")
            .send()
            .await
            .map_err(|e| failed("CreateSecurityGroup")(e.to_string()))?;
        let security_group = group
            .group_id()
            .ok_or_else(|| failed("CreateSecurityGroup")("no group ID".to_owned()))?
            .to_owned();
        let count = i32::try_from(nodes).map_err(|e| failed("RunInstances")(e.to_string()))?;
        let run = sdk
            .run_instances()
            .image_id("ami-12345678")
            .min_count(count)
            .max_count(count)
            .instance_type(InstanceType::from(instance_type))
            .subnet_id(&subnet)
            .security_group_ids(&security_group)
            .send()
            .await
            .map_err(|e| failed("RunInstances")(e.to_string()))?;
        let instances: Vec<String> = run
            .instances()
            .iter()
            .filter_map(|i| i.instance_id().map(str::to_owned))
            .collect();
        if instances.len() != nodes {
            return Err(failed("RunInstances")(format!(
                "{} instances for {nodes} nodes",
                instances.len()
            )));
        }
        Ok(Self {
            sdk,
            vpc,
            subnet,
            security_group,
            instances,
        })
    }
}
