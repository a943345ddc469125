//! ENI set-up against the patched moto: the three mutating calls of a fresh node, the
//! device-index retry, deletion of half-set-up ENIs, and EC2 faults.

mod common;

use common::{Lab, ipam};
use meshwork_operator::ec2::SubnetFilter;
use meshwork_operator::model::Tags;
use meshwork_operator::node_allocator::{AllocateError, NodeAllocator};
use prometheus_client::encoding::text::encode;

/// Every ENI in moto: (ID, attached instance, device index, delete-on-termination).
async fn all_enis(lab: &Lab) -> Vec<(String, Option<String>, Option<i32>, Option<bool>)> {
    let out = lab
        .sdk
        .describe_network_interfaces()
        .send()
        .await
        .expect("describe");
    out.network_interfaces()
        .iter()
        .map(|eni| {
            let attachment = eni.attachment();
            (
                eni.network_interface_id().unwrap_or_default().to_owned(),
                attachment.and_then(|a| a.instance_id()).map(str::to_owned),
                attachment.and_then(|a| a.device_index()),
                attachment.and_then(|a| a.delete_on_termination()),
            )
        })
        .collect()
}

fn eni_tags() -> Tags {
    [("meshwork.io/cluster".to_owned(), "test".to_owned())].into()
}

#[tokio::test]
#[ignore = "needs the patched moto server: `cargo xtask test` runs it"]
async fn a_fresh_node_costs_create_attach_modify() {
    let lab = Lab::start("10.213.0.0/24").await;
    let limits = lab.limits(&["m5.large"]).await;
    let instance = lab.instance("m5.large").await;
    let mut cache = lab.cache().await;
    let mut node = NodeAllocator::new(
        lab.spec(&instance, "m5.large", 1, ipam(8, 0, 0, 0)),
        eni_tags(),
    );
    lab.clear_calls();

    let report = node
        .maintain(&lab.ec2, &mut cache, limits.get("m5.large"), 0)
        .await
        .expect("maintain");
    assert_eq!((report.steps, report.created_enis, report.added), (1, 1, 8));
    let calls = lab.calls();
    println!("EC2 calls for a fresh node: {calls:?}");
    assert_eq!(lab.call_count("CreateNetworkInterface"), 1);
    assert_eq!(lab.call_count("AttachNetworkInterface"), 1);
    assert_eq!(lab.call_count("ModifyNetworkInterfaceAttribute"), 1);
    assert_eq!(
        calls
            .values()
            .filter_map(serde_json::Value::as_u64)
            .sum::<u64>(),
        3,
        "{calls:?}"
    );

    let new: Vec<_> = all_enis(&lab)
        .await
        .into_iter()
        .filter(|e| e.2 == Some(1))
        .collect();
    assert_eq!(new.len(), 1, "one ENI at device 1");
    assert_eq!(new[0].1.as_deref(), Some(instance.as_str()));
    assert_eq!(new[0].3, Some(true), "delete-on-termination set");
    let fresh = lab.cache().await;
    let eni = fresh.eni(&instance, &new[0].0).expect("described");
    assert_eq!(eni.addresses.len(), 8);
    assert_eq!(
        eni.tags.get("meshwork.io/cluster").map(String::as_str),
        Some("test")
    );
    assert_eq!(
        eni.security_groups,
        std::slice::from_ref(&lab.security_group),
        "device 0's groups"
    );
    // The local record matches what EC2 describes, so the next plan needs no describe.
    assert_eq!(
        cache.eni(&instance, &eni.id).map(|e| &e.addresses),
        Some(&eni.addresses)
    );

    let mut text = String::new();
    encode(&mut text, &lab.registry).expect("encode metrics");
    for operation in [
        "CreateNetworkInterface",
        "AttachNetworkInterface",
        "ModifyNetworkInterfaceAttribute",
    ] {
        let series = format!(
            "meshwork_ipam_api_duration_seconds_count{{operation=\"{operation}\",response_code=\"OK\"}} 1"
        );
        assert!(text.contains(&series), "missing {series} in\n{text}");
        let waited = format!(
            "meshwork_ipam_api_rate_limit_duration_seconds_count{{operation=\"{operation}\"}} 1"
        );
        assert!(text.contains(&waited), "missing {waited} in\n{text}");
    }
}

#[tokio::test]
#[ignore = "needs the patched moto server: `cargo xtask test` runs it"]
async fn a_taken_device_index_moves_the_attachment_to_the_next() {
    let lab = Lab::start("10.213.0.0/24").await;
    let limits = lab.limits(&["m5.large"]).await;
    let instance = lab.instance("m5.large").await;
    let mut stale = lab.cache().await;
    // Someone attaches at index 1 after our describe.
    let foreign = lab.foreign_eni(0).await;
    lab.attach(&foreign, &instance, 1).await;
    lab.clear_calls();
    let mut node = NodeAllocator::new(
        lab.spec(&instance, "m5.large", 1, ipam(8, 0, 0, 0)),
        Tags::new(),
    );

    node.maintain(&lab.ec2, &mut stale, limits.get("m5.large"), 0)
        .await
        .expect("maintain");
    assert_eq!(
        lab.call_count("AttachNetworkInterface"),
        2,
        "index 1 refused, index 2 taken"
    );
    assert_eq!(
        lab.call_count("DeleteNetworkInterface"),
        0,
        "the ENI is kept, not recreated"
    );
    let ours: Vec<_> = all_enis(&lab)
        .await
        .into_iter()
        .filter(|e| e.2 == Some(2))
        .collect();
    assert_eq!(ours.len(), 1);
}

#[tokio::test]
#[ignore = "needs the patched moto server: `cargo xtask test` runs it"]
async fn an_eni_that_cannot_be_attached_is_deleted() {
    let lab = Lab::start("10.213.0.0/24").await;
    let limits = lab.limits(&["m5.large"]).await;
    let instance = lab.instance("m5.large").await;
    let mut cache = lab.cache().await;
    lab.moto
        .set_faults(r#"{"rules":[{"action":"AttachNetworkInterface","error":"UnauthorizedOperation","status":403}]}"#)
        .expect("faults");
    let mut node = NodeAllocator::new(
        lab.spec(&instance, "m5.large", 1, ipam(8, 0, 0, 0)),
        Tags::new(),
    );

    let err = node
        .maintain(&lab.ec2, &mut cache, limits.get("m5.large"), 0)
        .await
        .expect_err("attach refused");
    assert!(matches!(err, AllocateError::Ec2 { .. }), "{err}");
    assert!(err.to_string().contains("UnauthorizedOperation"), "{err}");
    assert_eq!(lab.call_count("DeleteNetworkInterface"), 1);
    let enis = all_enis(&lab).await;
    assert_eq!(enis.len(), 1, "only eth0 is left: {enis:?}");
}

#[tokio::test]
#[ignore = "needs the patched moto server: `cargo xtask test` runs it"]
async fn an_eni_whose_modify_fails_is_detached_and_deleted() {
    let lab = Lab::start("10.213.0.0/24").await;
    let limits = lab.limits(&["m5.large"]).await;
    let instance = lab.instance("m5.large").await;
    let mut cache = lab.cache().await;
    lab.moto
        .set_faults(r#"{"rules":[{"action":"ModifyNetworkInterfaceAttribute","error":"UnauthorizedOperation","status":403}]}"#)
        .expect("faults");
    let mut node = NodeAllocator::new(
        lab.spec(&instance, "m5.large", 1, ipam(8, 0, 0, 0)),
        Tags::new(),
    );

    let err = node
        .maintain(&lab.ec2, &mut cache, limits.get("m5.large"), 0)
        .await
        .expect_err("modify refused");
    assert!(err.to_string().contains("delete-on-termination"), "{err}");
    assert!(!err.to_string().contains("could not be removed"), "{err}");
    assert_eq!(lab.call_count("DetachNetworkInterface"), 1);
    assert_eq!(lab.call_count("DeleteNetworkInterface"), 1);
    let enis = all_enis(&lab).await;
    assert_eq!(enis.len(), 1, "only eth0 is left: {enis:?}");
    assert_eq!(
        cache.enis(&instance).count(),
        1,
        "the cache never saw the deleted ENI"
    );
}

#[tokio::test]
#[ignore = "needs the patched moto server: `cargo xtask test` runs it"]
async fn throttled_mutations_converge_without_leaks() {
    let lab = Lab::start("10.213.0.0/24").await;
    let limits = lab.limits(&["m5.large"]).await;
    let instance = lab.instance("m5.large").await;
    let mut cache = lab.cache().await;
    lab.moto
        .set_faults(
            r#"{"rules":[
                {"action":"CreateNetworkInterface","error":"RequestLimitExceeded","status":503,"count":1},
                {"action":"AttachNetworkInterface","error":"InternalError","status":500,"count":1}
            ]}"#,
        )
        .expect("faults");
    let mut node = NodeAllocator::new(
        lab.spec(&instance, "m5.large", 1, ipam(8, 0, 0, 0)),
        Tags::new(),
    );

    let report = node
        .maintain(&lab.ec2, &mut cache, limits.get("m5.large"), 0)
        .await
        .expect("the SDK's retries absorb the faults");
    assert_eq!(report.added, 8);
    assert_eq!(lab.call_count("CreateNetworkInterface"), 2);
    assert_eq!(lab.call_count("AttachNetworkInterface"), 2);
    let enis = all_enis(&lab).await;
    assert_eq!(enis.len(), 2, "eth0 and one new ENI: {enis:?}");
    assert!(
        enis.iter()
            .all(|e| e.1.as_deref() == Some(instance.as_str())),
        "nothing left unattached: {enis:?}"
    );
}

#[tokio::test]
#[ignore = "needs the patched moto server: `cargo xtask test` runs it"]
async fn a_failed_describe_keeps_the_previous_cache() {
    let lab = Lab::start("10.213.0.0/24").await;
    let instance = lab.instance("m5.large").await;
    let mut cache = lab.cache().await;
    assert_eq!(cache.enis(&instance).count(), 1);
    lab.moto
        .set_faults(r#"{"rules":[{"action":"DescribeNetworkInterfaces","error":"Unavailable","status":503,"count":10}]}"#)
        .expect("faults");
    // A new ENI that the failed resync would have shown.
    let foreign = lab.foreign_eni(0).await;
    lab.attach(&foreign, &instance, 1).await;

    let err = cache
        .resync(&lab.ec2, &SubnetFilter::default())
        .await
        .expect_err("describe fails");
    assert!(
        err.to_string().contains("keeping the previous cache"),
        "{err}"
    );
    assert_eq!(
        cache.enis(&instance).count(),
        1,
        "previous state, not empty, not partial"
    );
    assert!(cache.subnet(&lab.subnet).is_some());

    lab.moto.clear_faults().expect("clear faults");
    cache
        .resync(&lab.ec2, &SubnetFilter::default())
        .await
        .expect("resync");
    assert_eq!(cache.enis(&instance).count(), 2);
}

#[tokio::test]
#[ignore = "needs the patched moto server: `cargo xtask test` runs it"]
async fn describes_follow_next_token_page_by_page() {
    let lab = Lab::start("10.213.0.0/24").await;
    let mut instances = Vec::new();
    for _ in 0..3 {
        instances.push(lab.instance("m5.large").await);
    }
    for _ in 0..4 {
        lab.foreign_eni(0).await;
    }
    let small_pages = lab.ec2.clone().with_page_size(5);
    lab.clear_calls();
    let enis = small_pages
        .describe_network_interfaces(Vec::new())
        .await
        .expect("describe");
    assert_eq!(enis.len(), 7, "3 primaries and 4 unattached");
    assert_eq!(lab.call_count("DescribeNetworkInterfaces"), 2, "5 + 2");
    let mut cache = meshwork_operator::instances::InstanceCache::new();
    cache
        .resync(&small_pages, &SubnetFilter::default())
        .await
        .expect("resync");
    for instance in &instances {
        assert_eq!(cache.enis(instance).count(), 1, "{instance}");
    }
}
