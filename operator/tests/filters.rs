//! The describe filters against the patched moto: `--instance-tags-filter` keeps only the
//! ENIs of tagged instances, `--subnet-ids-filter` / `--subnet-tags-filter` only the admitted
//! subnets.

mod common;

use common::{Lab, ZONE};
use meshwork_operator::ec2::SubnetFilter;
use meshwork_operator::instances::{InstanceCache, fetch_filtered};
use meshwork_operator::model::Tags;

fn tags(key: &str, value: &str) -> Tags {
    [(key.to_owned(), value.to_owned())].into()
}

async fn resync(lab: &Lab, subnets: &SubnetFilter, instance_tags: &Tags) -> InstanceCache {
    let mut cache = InstanceCache::new();
    let ticket = cache.begin_resync();
    let snapshot = fetch_filtered(&lab.ec2, subnets, instance_tags)
        .await
        .expect("describe");
    cache.apply_resync(ticket, snapshot).expect("apply");
    cache
}

#[tokio::test]
#[ignore = "needs the patched moto server: `cargo xtask test` runs it"]
async fn the_instance_tags_filter_keeps_only_tagged_instances() {
    let lab = Lab::start("10.213.0.0/24").await;
    let managed = lab.instance("m5.large").await;
    let other = lab.instance("m5.large").await;
    lab.tag(&managed, "meshwork.io/managed", "yes").await;

    let cache = resync(
        &lab,
        &SubnetFilter::default(),
        &tags("meshwork.io/managed", "yes"),
    )
    .await;
    assert_eq!(cache.enis(&managed).count(), 1);
    assert_eq!(
        cache.enis(&other).count(),
        0,
        "untagged instance filtered out"
    );
    let all = resync(&lab, &SubnetFilter::default(), &Tags::new()).await;
    assert_eq!(all.enis(&other).count(), 1, "no filter: every instance");
}

#[tokio::test]
#[ignore = "needs the patched moto server: `cargo xtask test` runs it"]
async fn subnet_filters_admit_only_the_chosen_subnets() {
    let lab = Lab::start("10.213.0.0/24").await;
    let second = lab
        .sdk
        .create_subnet()
        .vpc_id(&lab.vpc)
        .cidr_block("10.213.1.0/24")
        .availability_zone(ZONE)
        .send()
        .await
        .expect("second subnet");
    let second = second
        .subnet()
        .and_then(|s| s.subnet_id())
        .expect("subnet ID")
        .to_owned();
    lab.tag(&second, "meshwork.io/pods", "yes").await;

    let ids =
        |cache: &InstanceCache| -> Vec<String> { cache.subnets().map(|s| s.id.clone()).collect() };
    let by_ids = SubnetFilter {
        ids: vec![lab.subnet.clone()],
        tags: Tags::new(),
    };
    assert_eq!(
        ids(&resync(&lab, &by_ids, &Tags::new()).await),
        [lab.subnet.as_str()]
    );
    let by_tags = SubnetFilter {
        ids: Vec::new(),
        tags: tags("meshwork.io/pods", "yes"),
    };
    assert_eq!(ids(&resync(&lab, &by_tags, &Tags::new()).await), [second]);
}
