//! Cilium's ENI node-manager cases (pkg/aws/eni/node_manager_test.go) against the patched
//! moto: the same instance types, watermarks and expected pool sizes, with limits from
//! moto's DescribeInstanceTypes and the result checked on a freshly described cache.

mod common;

use common::{Lab, ipam};
use meshwork_operator::limits::LimitsTable;
use meshwork_operator::model::Tags;
use meshwork_operator::node_allocator::{
    Action, AllocateError, NodeAllocator, NodeStats, PlanError,
};

/// Resyncs the operator's cache, runs one maintenance pass for `used` addresses in use, and
/// returns the node's figures as EC2 now describes them.
async fn converge(
    lab: &Lab,
    node: &mut NodeAllocator,
    limits: &LimitsTable,
    used: usize,
) -> NodeStats {
    let mut cache = lab.cache().await;
    let instance_limits = limits.get(&node.spec().eni.instance_type);
    node.maintain(&lab.ec2, &mut cache, instance_limits, used)
        .await
        .expect("maintenance pass");
    let fresh = lab.cache().await;
    let plan = node.plan(used, instance_limits, &fresh).expect("plan");
    assert_eq!(
        plan.action,
        Action::Nothing,
        "need left after the pass: {plan:?}"
    );
    plan.stats
}

#[tokio::test]
async fn default_allocation_on_m5_large() {
    let lab = Lab::start("10.213.0.0/24").await;
    let limits = lab.limits(&["m5.large"]).await;
    let instance = lab.instance("m5.large").await;
    let mut node = NodeAllocator::new(
        lab.spec(&instance, "m5.large", 0, ipam(8, 0, 0, 0)),
        Tags::new(),
    );

    let stats = converge(&lab, &mut node, &limits, 0).await;
    assert_eq!((stats.available, stats.used), (8, 0));
    // Use 7 of 8: pre-allocate 8 brings the pool to 15.
    let stats = converge(&lab, &mut node, &limits, 7).await;
    assert_eq!((stats.available, stats.used), (15, 7));
}

#[tokio::test]
async fn min_allocate_10_then_20_on_m5_4xlarge() {
    let lab = Lab::start("10.213.0.0/24").await;
    let limits = lab.limits(&["m5.4xlarge"]).await;
    let instance = lab.instance("m5.4xlarge").await;
    let mut node = NodeAllocator::new(
        lab.spec(&instance, "m5.4xlarge", 0, ipam(-1, 10, 0, 0)),
        Tags::new(),
    );

    let stats = converge(&lab, &mut node, &limits, 0).await;
    assert_eq!((stats.available, stats.used), (10, 0));
    let stats = converge(&lab, &mut node, &limits, 8).await;
    assert_eq!((stats.available, stats.used), (10, 8));
    node.set_spec(lab.spec(&instance, "m5.4xlarge", 0, ipam(0, 20, 0, 0)));
    let stats = converge(&lab, &mut node, &limits, 8).await;
    assert_eq!((stats.available, stats.used), (20, 8));
}

#[tokio::test]
async fn min_allocate_10_and_pre_allocate_1_on_m3_large() {
    let lab = Lab::start("10.213.0.0/24").await;
    let limits = lab.limits(&["m3.large"]).await;
    let instance = lab.instance("m3.large").await;
    let mut node = NodeAllocator::new(
        lab.spec(&instance, "m3.large", 0, ipam(1, 10, 0, 0)),
        Tags::new(),
    );

    let stats = converge(&lab, &mut node, &limits, 0).await;
    assert_eq!((stats.available, stats.used), (10, 0));
    let stats = converge(&lab, &mut node, &limits, 9).await;
    assert_eq!(
        (stats.available, stats.used),
        (10, 9),
        "9 of 10 used: nothing more"
    );
    let stats = converge(&lab, &mut node, &limits, 10).await;
    assert_eq!(
        (stats.available, stats.used),
        (11, 10),
        "10 of 10 used: pre-allocate 1 kicks in"
    );
    let stats = converge(&lab, &mut node, &limits, 8).await;
    assert_eq!(
        (stats.available, stats.used),
        (11, 8),
        "no release without excess release"
    );
}

#[tokio::test]
async fn exceeding_eni_capacity_on_t2_xlarge_caps_at_42() {
    let lab = Lab::start("10.213.0.0/24").await;
    let limits = lab.limits(&["t2.xlarge"]).await;
    let t2 = limits.get("t2.xlarge").expect("t2.xlarge limits");
    // moto's data: 3 ENIs × 15 IPv4 → 3 × (15 − 1) = 42 allocatable.
    assert_eq!((t2.adapters, t2.ipv4), (3, 15));
    assert_eq!(t2.max_allocatable(0), 42);
    let instance = lab.instance("t2.xlarge").await;
    let mut node = NodeAllocator::new(
        lab.spec(&instance, "t2.xlarge", 0, ipam(8, 20, 0, 0)),
        Tags::new(),
    );

    let stats = converge(&lab, &mut node, &limits, 0).await;
    assert_eq!((stats.available, stats.used), (20, 0));
    let stats = converge(&lab, &mut node, &limits, 40).await;
    assert_eq!((stats.available, stats.used), (42, 40));
    assert_eq!(lab.cache().await.enis(&instance).count(), 3);
}

#[tokio::test]
async fn exclude_interface_tags_leave_the_tagged_eni_alone() {
    let lab = Lab::start("10.213.0.0/24").await;
    let limits = lab.limits(&["m5.large"]).await;
    let instance = lab.instance("m5.large").await;
    let eth0 = lab.primary_eni(&instance).await;
    lab.tag(&eth0, "foo", "bar").await;
    lab.tag(&eth0, "cilium.io/no_manage", "true").await;
    let mut spec = lab.spec(&instance, "m5.large", 0, ipam(8, 0, 0, 0));
    spec.eni.exclude_interface_tags =
        [("cilium.io/no_manage".to_owned(), "true".to_owned())].into();
    let mut node = NodeAllocator::new(spec, Tags::new());

    let stats = converge(&lab, &mut node, &limits, 0).await;
    assert_eq!((stats.available, stats.used), (8, 0));
    let cache = lab.cache().await;
    assert_eq!(
        cache.enis(&instance).count(),
        2,
        "a new ENI, not the excluded one"
    );
    assert!(
        cache
            .eni(&instance, &eth0)
            .expect("eth0")
            .addresses
            .is_empty()
    );

    let stats = converge(&lab, &mut node, &limits, 7).await;
    assert_eq!((stats.available, stats.used), (15, 7));
    let cache = lab.cache().await;
    assert_eq!(cache.enis(&instance).count(), 3);
    let eth0 = cache.eni(&instance, &eth0).expect("eth0");
    assert!(eth0.addresses.is_empty(), "excluded ENI stays unmanaged");
    assert_eq!(
        eth0.tags.get("cilium.io/no_manage").map(String::as_str),
        Some("true")
    );
}

#[tokio::test]
async fn an_exhausted_subnet_is_a_clear_error_without_a_loop() {
    // A /28 holds 11 usable addresses; the instance's primary takes one.
    let lab = Lab::start("10.213.0.0/28").await;
    let limits = lab.limits(&["m5.large"]).await;
    let instance = lab.instance("m5.large").await;
    let mut node = NodeAllocator::new(
        lab.spec(&instance, "m5.large", 0, ipam(8, 20, 0, 0)),
        Tags::new(),
    );
    let mut cache = lab.cache().await;
    lab.clear_calls();

    let err = node
        .maintain(&lab.ec2, &mut cache, limits.get("m5.large"), 0)
        .await
        .expect_err("the subnet cannot hold 20");
    // 9 fit on eth0 (10 − primary); one address is left, too few for another ENI.
    assert!(
        matches!(
            &err,
            AllocateError::Plan {
                source: PlanError::SubnetExhausted {
                    available: 1,
                    needed: 11,
                    ..
                },
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("is exhausted"), "{err}");
    assert_eq!(node.last_error(), Some(err.to_string().as_str()));
    assert_eq!(lab.call_count("AssignPrivateIpAddresses"), 1);
    assert_eq!(
        lab.call_count("CreateNetworkInterface"),
        0,
        "no ENI tried in a full subnet"
    );
}

#[tokio::test]
async fn ec2_refusing_for_a_full_subnet_stops_the_pass() {
    let lab = Lab::start("10.213.0.0/28").await;
    let limits = lab.limits(&["m5.large"]).await;
    let instance = lab.instance("m5.large").await;
    // Our cache still sees 10 free addresses when someone else takes them all.
    let mut stale = lab.cache().await;
    lab.foreign_eni(9).await;
    lab.clear_calls();
    let mut node = NodeAllocator::new(
        lab.spec(&instance, "m5.large", 1, ipam(8, 0, 0, 0)),
        Tags::new(),
    );

    let err = node
        .maintain(&lab.ec2, &mut stale, limits.get("m5.large"), 0)
        .await
        .expect_err("EC2 refuses");
    assert!(
        matches!(err, AllocateError::SubnetExhausted { .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("InsufficientFreeAddressesInSubnet"),
        "{err}"
    );
    assert_eq!(
        lab.call_count("CreateNetworkInterface"),
        1,
        "one refusal, no retry loop"
    );
    assert_eq!(lab.call_count("AttachNetworkInterface"), 0);
}
