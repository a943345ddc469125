use super::*;

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

fn eni(id: &str, number: u32) -> Eni {
    Eni {
        id: id.to_owned(),
        number,
        subnet: crate::model::EniSubnet {
            id: "subnet-1".to_owned(),
            cidr: String::new(),
        },
        ..Eni::default()
    }
}

fn snapshot(enis: &[(&str, &str)]) -> Snapshot {
    Snapshot {
        vpcs: Vec::new(),
        subnets: vec![subnet("subnet-1", 100)],
        security_groups: Vec::new(),
        enis: enis
            .iter()
            .map(|(instance, id)| (Some((*instance).to_owned()), eni(id, 0)))
            .collect(),
    }
}

fn ids(cache: &InstanceCache, instance: &str) -> Vec<String> {
    cache.enis(instance).map(|e| e.id.clone()).collect()
}

#[test]
fn an_empty_answer_never_replaces_a_populated_cache() {
    let mut cache = InstanceCache::new();
    let ticket = cache.begin_resync();
    cache
        .apply_resync(ticket, snapshot(&[("i-1", "eni-1")]))
        .expect("first resync");
    let ticket = cache.begin_resync();
    let err = cache
        .apply_resync(
            ticket,
            Snapshot {
                subnets: vec![subnet("subnet-1", 1)],
                ..Snapshot::default()
            },
        )
        .expect_err("empty ENI answer refused");
    assert!(
        matches!(
            err,
            ResyncError::EmptyAnswer {
                what: "ENIs",
                known: 1
            }
        ),
        "{err}"
    );
    let err = cache
        .apply_resync(ticket, Snapshot::default())
        .expect_err("empty subnet answer refused");
    assert!(
        matches!(
            err,
            ResyncError::EmptyAnswer {
                what: "subnets",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(ids(&cache, "i-1"), ["eni-1"]);
    assert_eq!(
        cache.subnet("subnet-1").map(|s| s.available_addresses),
        Some(100)
    );
}

#[test]
fn a_resync_keeps_an_eni_created_while_it_ran() {
    let mut cache = InstanceCache::new();
    let ticket = cache.begin_resync();
    cache
        .apply_resync(ticket, snapshot(&[("i-1", "eni-1")]))
        .expect("resync");
    // The describe starts, then the operator creates eni-2; the answer predates it.
    let ticket = cache.begin_resync();
    cache.upsert_eni("i-1", eni("eni-2", 1));
    cache
        .apply_resync(ticket, snapshot(&[("i-1", "eni-1")]))
        .expect("resync");
    assert_eq!(ids(&cache, "i-1"), ["eni-1", "eni-2"]);
    // A later resync that began after the creation trusts EC2 again.
    let ticket = cache.begin_resync();
    cache
        .apply_resync(ticket, snapshot(&[("i-1", "eni-1")]))
        .expect("resync");
    assert_eq!(ids(&cache, "i-1"), ["eni-1"]);
}

#[test]
fn a_resync_keeps_addresses_assigned_while_it_ran() {
    let mut cache = InstanceCache::new();
    let ticket = cache.begin_resync();
    cache
        .apply_resync(ticket, snapshot(&[("i-1", "eni-1")]))
        .expect("resync");
    let ticket = cache.begin_resync();
    let new = [Ipv4Addr::new(10, 213, 0, 9)];
    cache.add_addresses("i-1", "eni-1", &new);
    assert_eq!(
        cache.subnet("subnet-1").map(|s| s.available_addresses),
        Some(99)
    );
    cache
        .apply_resync(ticket, snapshot(&[("i-1", "eni-1")]))
        .expect("resync");
    assert_eq!(
        cache.eni("i-1", "eni-1").map(|e| e.addresses.clone()),
        Some(new.to_vec())
    );
}

#[test]
fn subnet_choice_takes_the_most_free_addresses_in_vpc_and_zone() {
    let mut cache = InstanceCache::new();
    let mut tagged = subnet("subnet-b", 50);
    tagged.tags.insert("role".to_owned(), "pods".to_owned());
    let mut other_zone = subnet("subnet-c", 500);
    other_zone.availability_zone = "us-east-1b".to_owned();
    let ticket = cache.begin_resync();
    cache
        .apply_resync(
            ticket,
            Snapshot {
                subnets: vec![subnet("subnet-a", 80), tagged, other_zone],
                ..Snapshot::default()
            },
        )
        .expect("resync");
    let any = cache.find_subnet_by_tags("vpc-1", "us-east-1a", &Tags::new());
    assert_eq!(any.map(|s| s.id.as_str()), Some("subnet-a"));
    let tags: Tags = [("role".to_owned(), "pods".to_owned())].into();
    let by_tag = cache.find_subnet_by_tags("vpc-1", "us-east-1a", &tags);
    assert_eq!(by_tag.map(|s| s.id.as_str()), Some("subnet-b"));
    let by_id = cache.find_subnet_by_ids(
        "vpc-1",
        "us-east-1a",
        &["subnet-b".to_owned(), "subnet-c".to_owned()],
    );
    assert_eq!(by_id.map(|s| s.id.as_str()), Some("subnet-b"));
}
