//! A patched moto with one VPC, subnet and security group, and the operator's EC2 client
//! pointed at it. One server per test: tests run in parallel and each needs its own counts.

#![allow(dead_code, reason = "each test binary uses part of the helpers")]

use aws_sdk_ec2::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_ec2::types::{InstanceType, ResourceType, Tag, TagSpecification};
use meshwork_lab::moto::MotoServer;
use meshwork_operator::ec2::{Ec2, Ec2Config, Ec2Metrics, SubnetFilter};
use meshwork_operator::instances::InstanceCache;
use meshwork_operator::limits::LimitsTable;
use meshwork_operator::node_allocator::{EniSpec, IpamSpec, NodeSpec};
use prometheus_client::registry::Registry;

/// The zone everything lives in.
pub const ZONE: &str = "us-east-1a";
/// Any AMI ID does for moto.
const AMI: &str = "ami-12345678";

pub struct Lab {
    pub moto: MotoServer,
    /// A plain SDK client for setting the scene behind the operator's back.
    pub sdk: aws_sdk_ec2::Client,
    pub ec2: Ec2,
    pub registry: Registry,
    pub vpc: String,
    pub subnet: String,
    pub security_group: String,
}

impl Lab {
    /// Moto, a VPC 10.213.0.0/16 with one subnet of `subnet_cidr`, and a security group.
    pub async fn start(subnet_cidr: &str) -> Self {
        // From the test's own thread: the server dies with it if the test is killed.
        let moto = MotoServer::start().expect("start meshwork_moto");
        let sdk_config = aws_sdk_ec2::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .endpoint_url(moto.endpoint())
            .credentials_provider(Credentials::new("testing", "testing", None, None, "test"))
            .build();
        let sdk = aws_sdk_ec2::Client::from_conf(sdk_config);
        let mut registry = Registry::with_prefix("meshwork");
        let metrics = Ec2Metrics::register(&mut registry);
        let config = Ec2Config::new("us-east-1").with_endpoint(moto.endpoint());
        let ec2 = Ec2::connect(&config, metrics).await.expect("EC2 client");
        let vpc = sdk
            .create_vpc()
            .cidr_block("10.213.0.0/16")
            .send()
            .await
            .expect("create VPC");
        let vpc = vpc
            .vpc()
            .and_then(|v| v.vpc_id())
            .expect("VPC ID")
            .to_owned();
        let subnet = sdk
            .create_subnet()
            .vpc_id(&vpc)
            .cidr_block(subnet_cidr)
            .availability_zone(ZONE)
            .send()
            .await
            .expect("create subnet");
        let subnet = subnet
            .subnet()
            .and_then(|s| s.subnet_id())
            .expect("subnet ID")
            .to_owned();
        let group = sdk
            .create_security_group()
            .vpc_id(&vpc)
            .group_name("nodes")
            .description("nodes")
            .send()
            .await
            .expect("create security group");
        let security_group = group.group_id().expect("group ID").to_owned();
        Self {
            moto,
            sdk,
            ec2,
            registry,
            vpc,
            subnet,
            security_group,
        }
    }

    /// A running instance in the subnet; its device-0 ENI has only its primary address.
    pub async fn instance(&self, instance_type: &str) -> String {
        let run = self
            .sdk
            .run_instances()
            .image_id(AMI)
            .min_count(1)
            .max_count(1)
            .instance_type(InstanceType::from(instance_type))
            .subnet_id(&self.subnet)
            .security_group_ids(&self.security_group)
            .send()
            .await
            .expect("run instance");
        run.instances()[0]
            .instance_id()
            .expect("instance ID")
            .to_owned()
    }

    /// The ENI at device 0 of `instance`.
    pub async fn primary_eni(&self, instance: &str) -> String {
        let cache = self.cache().await;
        cache
            .enis(instance)
            .find(|eni| eni.number == 0)
            .map(|eni| eni.id.clone())
            .expect("device-0 ENI")
    }

    /// Tags an ENI behind the operator's back.
    pub async fn tag(&self, resource: &str, key: &str, value: &str) {
        self.sdk
            .create_tags()
            .resources(resource)
            .tags(Tag::builder().key(key).value(value).build())
            .send()
            .await
            .expect("tag");
    }

    /// Creates an ENI with `secondaries` addresses behind the operator's back.
    pub async fn foreign_eni(&self, secondaries: i32) -> String {
        let eni = self
            .sdk
            .create_network_interface()
            .subnet_id(&self.subnet)
            .secondary_private_ip_address_count(secondaries)
            .tag_specifications(
                TagSpecification::builder()
                    .resource_type(ResourceType::NetworkInterface)
                    .tags(Tag::builder().key("owner").value("someone-else").build())
                    .build(),
            )
            .send()
            .await
            .expect("create foreign ENI");
        eni.network_interface()
            .and_then(|e| e.network_interface_id())
            .expect("ENI ID")
            .to_owned()
    }

    /// Creates an ENI whose primary is `address`, behind the operator's back.
    pub async fn foreign_eni_at(&self, address: &str) -> String {
        let eni = self
            .sdk
            .create_network_interface()
            .subnet_id(&self.subnet)
            .private_ip_address(address)
            .send()
            .await
            .expect("create foreign ENI");
        eni.network_interface()
            .and_then(|e| e.network_interface_id())
            .expect("ENI ID")
            .to_owned()
    }

    /// Attaches an ENI behind the operator's back.
    pub async fn attach(&self, eni: &str, instance: &str, device_index: i32) {
        self.sdk
            .attach_network_interface()
            .network_interface_id(eni)
            .instance_id(instance)
            .device_index(device_index)
            .send()
            .await
            .expect("attach foreign ENI");
    }

    /// A freshly described cache.
    pub async fn cache(&self) -> InstanceCache {
        let mut cache = InstanceCache::new();
        cache
            .resync(&self.ec2, &SubnetFilter::default())
            .await
            .expect("resync");
        cache
    }

    /// Limits of the given types, as DescribeInstanceTypes reports them.
    pub async fn limits(&self, types: &[&str]) -> LimitsTable {
        let types: Vec<String> = types.iter().map(|t| (*t).to_owned()).collect();
        LimitsTable::describe(&self.ec2, &types)
            .await
            .expect("describe instance types")
    }

    /// A node spec in this lab's VPC and zone.
    pub fn spec(
        &self,
        instance: &str,
        instance_type: &str,
        first_interface_index: u32,
        ipam: IpamSpec,
    ) -> NodeSpec {
        NodeSpec {
            name: format!("node-{instance}"),
            eni: EniSpec {
                instance_id: instance.to_owned(),
                instance_type: instance_type.to_owned(),
                first_interface_index,
                vpc_id: self.vpc.clone(),
                availability_zone: ZONE.to_owned(),
                ..EniSpec::default()
            },
            ipam,
            prefix_delegation: false,
        }
    }

    /// EC2 calls per action since the last [`Self::clear_calls`].
    pub fn calls(&self) -> serde_json::Map<String, serde_json::Value> {
        self.moto.call_counts().expect("call counts")
    }

    pub fn call_count(&self, action: &str) -> u64 {
        self.calls()
            .get(action)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0)
    }

    pub fn clear_calls(&self) {
        self.moto.clear_calls().expect("clear calls");
    }
}

/// Watermarks: pre-allocate, min-allocate, max-allocate, max-above-watermark.
pub fn ipam(pre: i64, min: i64, max: i64, above: i64) -> IpamSpec {
    IpamSpec {
        pre_allocate: pre,
        min_allocate: min,
        max_allocate: max,
        max_above_watermark: above,
    }
}
