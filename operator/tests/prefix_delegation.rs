//! Prefix delegation against the patched moto: Cilium's m5a.large case (pre-allocate 8 → one
//! /28; 12 used → two), and the fall-back to single addresses on a fragmented subnet.

mod common;

use common::{Lab, ipam};
use meshwork_operator::model::Tags;
use meshwork_operator::node_allocator::{Action, NodeAllocator};

#[tokio::test]
#[ignore = "needs the patched moto server: `cargo xtask test` runs it"]
async fn m5a_large_allocates_whole_prefixes() {
    let lab = Lab::start("10.213.0.0/24").await;
    let limits = lab.limits(&["m5a.large"]).await;
    let instance = lab.instance("m5a.large").await;
    let mut spec = lab.spec(&instance, "m5a.large", 0, ipam(8, 0, 0, 0));
    spec.prefix_delegation = true;
    let mut node = NodeAllocator::new(spec, Tags::new());
    let instance_limits = limits.get("m5a.large");

    for (used, available, prefixes) in [(0, 16, 1), (12, 32, 2)] {
        let mut cache = lab.cache().await;
        node.maintain(&lab.ec2, &mut cache, instance_limits, used)
            .await
            .expect("maintain");
        let fresh = lab.cache().await;
        let plan = node.plan(used, instance_limits, &fresh).expect("plan");
        assert_eq!(plan.action, Action::Nothing, "{plan:?}");
        assert!(plan.stats.prefix_delegated);
        assert_eq!((plan.stats.available, plan.stats.used), (available, used));
        let held: usize = fresh.enis(&instance).map(|e| e.prefixes.len()).sum();
        assert_eq!(held, prefixes, "with {used} used");
    }
    assert_eq!(
        lab.call_count("CreateNetworkInterface"),
        0,
        "all on device 0"
    );
}

#[tokio::test]
#[ignore = "needs the patched moto server: `cargo xtask test` runs it"]
async fn a_fragmented_subnet_falls_back_to_single_addresses() {
    // 10.213.0.0/26 has four /28 blocks; the instance's primary (.4) sits in the first, and
    // one address in each other block leaves no aligned /28 free.
    let lab = Lab::start("10.213.0.0/26").await;
    let limits = lab.limits(&["m5a.large"]).await;
    let instance = lab.instance("m5a.large").await;
    for address in ["10.213.0.16", "10.213.0.32", "10.213.0.48"] {
        lab.foreign_eni_at(address).await;
    }
    let mut spec = lab.spec(&instance, "m5a.large", 0, ipam(8, 0, 0, 0));
    spec.prefix_delegation = true;
    let mut node = NodeAllocator::new(spec, Tags::new());
    let instance_limits = limits.get("m5a.large");
    let mut cache = lab.cache().await;
    lab.clear_calls();

    let report = node
        .maintain(&lab.ec2, &mut cache, instance_limits, 0)
        .await
        .expect("maintain");
    assert_eq!(report.added, 8);
    assert_eq!(
        lab.call_count("AssignPrivateIpAddresses"),
        2,
        "a /28 refused, then 8 × /32"
    );
    let fresh = lab.cache().await;
    let plan = node.plan(0, instance_limits, &fresh).expect("plan");
    assert_eq!(plan.action, Action::Nothing);
    assert_eq!(plan.stats.available, 8);
    assert!(
        !plan.stats.prefix_delegated,
        "single addresses now: no more prefixes here"
    );
    assert!(fresh.enis(&instance).all(|e| e.prefixes.is_empty()));
}
