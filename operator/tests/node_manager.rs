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
#[ignore = "needs the patched moto server: `cargo xtask test` runs it"]
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
#[ignore = "needs the patched moto server: `cargo xtask test` runs it"]
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
#[ignore = "needs the patched moto server: `cargo xtask test` runs it"]
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
#[ignore = "needs the patched moto server: `cargo xtask test` runs it"]
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
#[ignore = "needs the patched moto server: `cargo xtask test` runs it"]
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
#[ignore = "needs the patched moto server: `cargo xtask test` runs it"]
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
                error: PlanError::SubnetExhausted {
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
#[ignore = "needs the patched moto server: `cargo xtask test` runs it"]
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

/// The node's pool addresses as EC2 describes them, sorted.
async fn pool_addresses(lab: &Lab, instance: &str) -> Vec<std::net::Ipv4Addr> {
    let mut all: Vec<_> = lab
        .cache()
        .await
        .enis(instance)
        .flat_map(|eni| eni.addresses.clone())
        .collect();
    all.sort_unstable();
    all
}

#[tokio::test]
#[ignore = "needs the patched moto server: `cargo xtask test` runs it"]
async fn release_with_handshake_on_m4_xlarge() {
    use meshwork_operator::node_allocator::ReleaseMap;
    use meshwork_operator::node_allocator::release::{
        DO_NOT_RELEASE, MARKED_FOR_RELEASE, READY_FOR_RELEASE, RELEASED,
    };
    use std::collections::BTreeSet;
    use std::time::{Duration, Instant};

    let lab = Lab::start("10.213.0.0/24").await;
    let limits = lab.limits(&["m4.xlarge"]).await;
    let instance = lab.instance("m4.xlarge").await;
    let mut node = NodeAllocator::new(
        lab.spec(&instance, "m4.xlarge", 0, ipam(2, 10, 0, 3)),
        Tags::new(),
    );
    let stats = converge(&lab, &mut node, &limits, 0).await;
    assert_eq!(stats.available, 13, "min 10 + max-above-watermark 3");
    let stats = converge(&lab, &mut node, &limits, 13).await;
    assert_eq!(
        stats.available, 18,
        "13 used: pre 2 + 3 above the watermark"
    );

    // 10 used: 18 − 10 − 2 − 3 = 3 in excess.
    let pool = pool_addresses(&lab, &instance).await;
    let used: BTreeSet<_> = pool.iter().take(10).copied().collect();
    let instance_limits = limits.get("m4.xlarge");
    let delay = Duration::from_secs(180);
    let start = Instant::now();
    let mut cache = lab.cache().await;
    let mut agent = ReleaseMap::new();
    lab.clear_calls();
    let mut step = async |node: &mut NodeAllocator, now, agent: &ReleaseMap| {
        node.release_excess(
            &lab.ec2,
            &mut cache,
            instance_limits,
            &used,
            agent,
            now,
            delay,
        )
        .await
        .expect("release step")
    };

    assert_eq!(step(&mut node, start, &agent).await, 0);
    assert!(
        node.release_status(&agent).is_empty(),
        "nothing before the delay"
    );
    let later = start + delay;
    assert_eq!(step(&mut node, later, &agent).await, 0);
    let marked = node.release_status(&agent);
    assert_eq!(marked.len(), 3, "{marked:?}");
    assert!(marked.values().all(|state| state == MARKED_FOR_RELEASE));
    assert_eq!(
        lab.call_count("UnassignPrivateIpAddresses"),
        0,
        "not before the agent agrees"
    );

    // The agent refuses one (it handed it out meanwhile) and agrees to the others.
    let mut answers = marked.keys().cloned();
    let refused = answers.next().expect("one");
    agent.insert(refused.clone(), DO_NOT_RELEASE.to_owned());
    for ip in answers {
        agent.insert(ip, READY_FOR_RELEASE.to_owned());
    }
    assert_eq!(step(&mut node, later, &agent).await, 2);
    assert_eq!(lab.call_count("UnassignPrivateIpAddresses"), 1);
    let published = node.release_status(&agent);
    assert_eq!(
        published.len(),
        2,
        "the refused address left the handshake: {published:?}"
    );
    assert!(published.values().all(|state| state == RELEASED));
    assert!(!published.contains_key(&refused));
    assert_eq!(pool_addresses(&lab, &instance).await.len(), 16);

    // The refused address is marked again after another delay; this time the agent agrees.
    agent = published;
    assert_eq!(step(&mut node, later, &agent).await, 0);
    agent.clear();
    let again = later + delay;
    assert_eq!(step(&mut node, again, &agent).await, 0);
    let marked = node.release_status(&agent);
    assert_eq!(marked.len(), 1, "{marked:?}");
    agent = marked
        .keys()
        .map(|ip| (ip.clone(), READY_FOR_RELEASE.to_owned()))
        .collect();
    assert_eq!(step(&mut node, again, &agent).await, 1);
    let remaining = pool_addresses(&lab, &instance).await;
    assert_eq!(remaining.len(), 15, "18 − 3 in excess");
    assert!(
        used.iter().all(|ip| remaining.contains(ip)),
        "used addresses stay"
    );
    let fresh = lab.cache().await;
    let plan = node.plan(10, instance_limits, &fresh).expect("plan");
    assert_eq!((plan.stats.available, plan.stats.excess), (15, 0));
}

#[tokio::test]
#[ignore = "needs the patched moto server: `cargo xtask test` runs it"]
async fn an_instance_that_is_not_running_gets_a_clear_error_and_no_leak() {
    let lab = Lab::start("10.213.0.0/24").await;
    let limits = lab.limits(&["m5.large"]).await;
    let instance = lab.instance("m5.large").await;
    let mut cache = lab.cache().await;
    let rule = format!(
        r#"{{"rules":[{{"action":"AttachNetworkInterface","error":"IncorrectInstanceState","message":"The instance '{instance}' is not 'running'.","status":400}}]}}"#
    );
    lab.moto.set_faults(&rule).expect("faults");
    let mut node = NodeAllocator::new(
        lab.spec(&instance, "m5.large", 1, ipam(8, 0, 0, 0)),
        Tags::new(),
    );

    let err = node
        .maintain(&lab.ec2, &mut cache, limits.get("m5.large"), 0)
        .await
        .expect_err("not running");
    assert!(
        matches!(err, AllocateError::InstanceNotRunning { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("not running"), "{err}");
    assert_eq!(
        lab.call_count("DeleteNetworkInterface"),
        1,
        "the new ENI is removed"
    );
    let described = lab.cache().await;
    assert_eq!(described.enis(&instance).count(), 1, "only eth0");
    assert!(described.unattached().is_empty(), "no ENI leaked");
}
