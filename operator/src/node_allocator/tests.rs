//! The planning decisions, without EC2.

use std::net::Ipv4Addr;

use super::*;
use crate::instances::Snapshot;
use crate::model::{Eni, EniSubnet, EniVpc, SecurityGroup, Subnet};

const INSTANCE: &str = "i-1";

fn m5_large() -> Limits {
    Limits {
        adapters: 3,
        ipv4: 10,
        ipv6: 10,
        hypervisor: "nitro".to_owned(),
    }
}

fn tags(pairs: &[(&str, &str)]) -> Tags {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn subnet(id: &str, available: usize) -> Subnet {
    Subnet {
        id: id.to_owned(),
        cidr: "10.213.0.0/24".to_owned(),
        availability_zone: "us-east-1a".to_owned(),
        vpc_id: "vpc-1".to_owned(),
        available_addresses: available,
        tags: Tags::new(),
    }
}

fn eni(id: &str, number: u32, addresses: u8) -> Eni {
    Eni {
        id: id.to_owned(),
        number,
        availability_zone: "us-east-1a".to_owned(),
        subnet: EniSubnet {
            id: "subnet-1".to_owned(),
            cidr: String::new(),
        },
        vpc: EniVpc {
            id: "vpc-1".to_owned(),
            ..EniVpc::default()
        },
        addresses: (0..addresses)
            .map(|i| Ipv4Addr::new(10, 213, number as u8, 10 + i))
            .collect(),
        security_groups: vec!["sg-primary".to_owned()],
        ..Eni::default()
    }
}

fn cache(enis: Vec<Eni>, subnets: Vec<Subnet>, groups: Vec<SecurityGroup>) -> InstanceCache {
    let mut cache = InstanceCache::new();
    let ticket = cache.begin_resync();
    cache
        .apply_resync(
            ticket,
            Snapshot {
                vpcs: Vec::new(),
                subnets,
                security_groups: groups,
                enis: enis
                    .into_iter()
                    .map(|e| (Some(INSTANCE.to_owned()), e))
                    .collect(),
            },
        )
        .expect("resync");
    cache
}

fn spec(first_interface_index: u32, pre: i64) -> NodeSpec {
    NodeSpec {
        name: "node1".to_owned(),
        eni: EniSpec {
            instance_id: INSTANCE.to_owned(),
            instance_type: "m5.large".to_owned(),
            first_interface_index,
            ..EniSpec::default()
        },
        ipam: IpamSpec {
            pre_allocate: pre,
            ..IpamSpec::default()
        },
        prefix_delegation: false,
    }
}

fn plan_of(spec: &NodeSpec, used: usize, cache: &InstanceCache) -> Result<Plan, PlanError> {
    plan::plan(spec, used, Some(&m5_large()), cache)
}

#[test]
fn a_fresh_node_fills_device_zero_when_it_may() {
    let cache = cache(
        vec![eni("eni-0", 0, 0)],
        vec![subnet("subnet-1", 200)],
        Vec::new(),
    );
    let plan = plan_of(&spec(0, 0), 0, &cache).expect("plan");
    assert_eq!(plan.stats.needed, 8, "default pre-allocate");
    assert_eq!(plan.stats.max_allocatable, 27);
    assert_eq!(
        plan.action,
        Action::Assign {
            eni_id: "eni-0".to_owned(),
            subnet_id: "subnet-1".to_owned(),
            count: 8,
            prefixes: false,
        }
    );
}

#[test]
fn a_fresh_node_above_first_interface_index_creates_an_eni() {
    let cache = cache(
        vec![eni("eni-0", 0, 0)],
        vec![subnet("subnet-1", 200)],
        Vec::new(),
    );
    let plan = plan_of(&spec(1, 8), 0, &cache).expect("plan");
    assert_eq!(
        plan.action,
        Action::Create(CreateEni {
            subnet_id: "subnet-1".to_owned(),
            security_groups: vec!["sg-primary".to_owned()],
            device_index: 1,
            count: 8,
            prefixes: false,
        })
    );
}

#[test]
fn a_full_eni_leads_to_a_new_one_at_the_first_free_index() {
    let enis = vec![eni("eni-0", 0, 0), eni("eni-1", 1, 9), eni("eni-3", 3, 9)];
    let limits = Limits {
        adapters: 5,
        ..m5_large()
    };
    let cache = cache(enis, vec![subnet("subnet-1", 200)], Vec::new());
    let plan = plan::plan(&spec(1, 8), 18, Some(&limits), &cache).expect("plan");
    let Action::Create(create) = plan.action else {
        panic!("expected a create: {plan:?}")
    };
    assert_eq!(create.device_index, 2);
    assert_eq!(create.count, 8);
}

#[test]
fn max_above_watermark_rides_on_top_but_stays_within_the_eni() {
    let cache = cache(
        vec![eni("eni-0", 0, 0)],
        vec![subnet("subnet-1", 200)],
        Vec::new(),
    );
    let mut node = spec(0, 8);
    node.ipam.max_above_watermark = 3;
    let plan = plan_of(&node, 0, &cache).expect("plan");
    assert!(
        matches!(plan.action, Action::Assign { count: 9, .. }),
        "{plan:?}"
    );
}

#[test]
fn excluded_enis_are_neither_counted_nor_used() {
    let mut tagged = eni("eni-0", 0, 4);
    tagged.tags = tags(&[("cilium.io/no_manage", "true"), ("foo", "bar")]);
    let cache = cache(vec![tagged], vec![subnet("subnet-1", 200)], Vec::new());
    let mut node = spec(0, 8);
    node.eni.exclude_interface_tags = tags(&[("cilium.io/no_manage", "true")]);
    let plan = plan_of(&node, 0, &cache).expect("plan");
    assert_eq!(plan.stats.available, 0);
    let Action::Create(create) = plan.action else {
        panic!("expected a create: {plan:?}")
    };
    assert_eq!(create.device_index, 1);
}

#[test]
fn security_groups_by_ids_then_tags_then_device_zero() {
    let groups = vec![
        SecurityGroup {
            id: "sg-a".to_owned(),
            vpc_id: "vpc-1".to_owned(),
            tags: tags(&[("pods", "yes")]),
        },
        SecurityGroup {
            id: "sg-b".to_owned(),
            vpc_id: "vpc-2".to_owned(),
            tags: tags(&[("pods", "yes")]),
        },
    ];
    let cache = cache(
        vec![eni("eni-0", 0, 0)],
        vec![subnet("subnet-1", 200)],
        groups,
    );
    let groups_of = |node: &NodeSpec| match plan_of(node, 0, &cache).expect("plan").action {
        Action::Create(create) => create.security_groups,
        other => panic!("expected a create: {other:?}"),
    };
    let mut node = spec(1, 8);
    node.eni.security_group_tags = tags(&[("pods", "yes")]);
    assert_eq!(groups_of(&node), ["sg-a"], "tags, within the VPC");
    node.eni.security_groups = vec!["sg-x".to_owned()];
    assert_eq!(groups_of(&node), ["sg-x"], "IDs win");
    node.eni.security_groups.clear();
    node.eni.security_group_tags = tags(&[("pods", "no")]);
    assert_eq!(groups_of(&node), ["sg-primary"], "no tag match → device 0");
}

#[test]
fn subnet_ids_pick_the_emptiest_listed_subnet_in_vpc_and_zone() {
    let subnets = vec![
        subnet("subnet-1", 200),
        subnet("subnet-2", 50),
        subnet("subnet-3", 90),
    ];
    let cache = cache(vec![eni("eni-0", 0, 0)], subnets, Vec::new());
    let mut node = spec(1, 8);
    node.eni.subnet_ids = vec!["subnet-2".to_owned(), "subnet-3".to_owned()];
    let Action::Create(create) = plan_of(&node, 0, &cache).expect("plan").action else {
        panic!("expected a create")
    };
    assert_eq!(create.subnet_id, "subnet-3");
    node.eni.subnet_ids = vec!["subnet-9".to_owned()];
    assert!(matches!(
        plan_of(&node, 0, &cache),
        Err(PlanError::NoSubnet { .. })
    ));
}

#[test]
fn a_short_subnet_caps_the_request_and_an_empty_one_is_an_error() {
    let node = spec(0, 8);
    let short = cache(
        vec![eni("eni-0", 0, 0)],
        vec![subnet("subnet-1", 3)],
        Vec::new(),
    );
    assert!(matches!(
        plan_of(&node, 0, &short).expect("plan").action,
        Action::Assign { count: 3, .. }
    ));
    let empty = cache(
        vec![eni("eni-0", 0, 3)],
        vec![subnet("subnet-1", 0)],
        Vec::new(),
    );
    let err = plan_of(&node, 0, &empty).expect_err("exhausted");
    assert!(
        matches!(&err, PlanError::SubnetExhausted { subnet_id, available: 0, needed: 5 } if subnet_id == "subnet-1"),
        "{err:?}"
    );
}

#[test]
fn a_full_instance_is_out_of_interfaces() {
    let enis = vec![eni("eni-0", 0, 9), eni("eni-1", 1, 9), eni("eni-2", 2, 9)];
    let cache = cache(enis, vec![subnet("subnet-1", 200)], Vec::new());
    let mut node = spec(0, 8);
    node.ipam.max_allocate = 40;
    let err = plan_of(&node, 27, &cache).expect_err("full");
    assert!(
        matches!(err, PlanError::OutOfInterfaces { adapters: 3, .. }),
        "{err:?}"
    );
    // Without max-allocate the instance's limit caps the need: nothing to do.
    let plan = plan_of(&spec(0, 8), 27, &cache).expect("plan");
    assert_eq!(plan.action, Action::Nothing);
}

#[test]
fn unknown_limits_and_unknown_instances_are_reported() {
    let cache = cache(
        vec![eni("eni-0", 0, 0)],
        vec![subnet("subnet-1", 200)],
        Vec::new(),
    );
    assert!(matches!(
        plan::plan(&spec(0, 8), 0, None, &cache),
        Err(PlanError::UnknownLimits { .. })
    ));
    let mut node = spec(0, 8);
    node.eni.instance_id = "i-gone".to_owned();
    assert!(matches!(
        plan_of(&node, 0, &cache),
        Err(PlanError::InstanceNotFound { .. })
    ));
}

#[test]
fn prefix_delegation_on_nitro_sizes_by_prefix() {
    let cache = cache(
        vec![eni("eni-0", 0, 0)],
        vec![subnet("subnet-1", 200)],
        Vec::new(),
    );
    let mut node = spec(0, 8);
    node.prefix_delegation = true;
    let plan = plan_of(&node, 0, &cache).expect("plan");
    assert!(plan.stats.prefix_delegated);
    // (3 − 0) ENIs × 9 slots × 16 addresses.
    assert_eq!(plan.stats.max_allocatable, 432);
    assert!(
        matches!(
            plan.action,
            Action::Assign {
                count: 8,
                prefixes: true,
                ..
            }
        ),
        "{plan:?}"
    );
}

#[test]
fn prefix_delegation_needs_nitro_and_no_single_addresses() {
    let mut node = spec(0, 8);
    node.prefix_delegation = true;
    let xen = Limits {
        hypervisor: "xen".to_owned(),
        ..m5_large()
    };
    let fresh = cache(
        vec![eni("eni-0", 0, 0)],
        vec![subnet("subnet-1", 200)],
        Vec::new(),
    );
    let plan = plan::plan(&node, 0, Some(&xen), &fresh).expect("plan");
    assert!(!plan.stats.prefix_delegated, "xen: no prefixes");
    let singles = cache(
        vec![eni("eni-0", 0, 2)],
        vec![subnet("subnet-1", 200)],
        Vec::new(),
    );
    let plan = plan_of(&node, 0, &singles).expect("plan");
    assert!(
        !plan.stats.prefix_delegated,
        "an ENI holds single addresses already"
    );
    assert!(
        matches!(
            plan.action,
            Action::Assign {
                count: 6,
                prefixes: false,
                ..
            }
        ),
        "{plan:?}"
    );
}
