//! The ipcache writer against real pinned BPF maps on bpffs.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use meshwork_datapath::ipcache_map::{IpCacheKey, IpCacheValue};
use meshwork_datapath::ipcache_writer::{FlushError, IpCacheWriter, Owner};
use meshwork_datapath::maps::PinDir;
use meshwork_lab::bpffs::BpfRoot;
use meshwork_types::{IpCacheEntry, IpIdentityPair};

fn entry(ip: &str, host: Option<&str>, id: u32) -> IpCacheEntry {
    IpCacheEntry::from_pair(IpIdentityPair {
        ip: Some(ip.parse().unwrap()),
        host_ip: host.map(|h| h.parse().unwrap()),
        id,
        ..IpIdentityPair::default()
    })
    .unwrap()
}

fn cluster(name: &str) -> Owner {
    Owner::Cluster(Arc::from(name))
}

#[test]
#[ignore = "needs root and bpffs: `cargo xtask test` runs it"]
fn writer_fills_the_pinned_map_in_cilium_layout_and_deletes_only_its_own() {
    let root = BpfRoot::new().unwrap();
    let pins = PinDir::under(root.path());
    let mut map = pins.recreate_ipcache().unwrap();
    let local_node: IpAddr = "10.213.0.1".parse().unwrap();
    let mut writer = IpCacheWriter::new(Some(local_node));
    for i in 0..200u32 {
        let ip = format!("10.214.2.{}", i % 250);
        let host = if i % 2 == 0 {
            "10.213.0.2"
        } else {
            "10.213.0.1"
        };
        writer
            .upsert(&cluster("b"), &entry(&ip, Some(host), 70_000 + i))
            .unwrap();
    }
    writer.flush(&mut map).unwrap();
    // Reopening through the pin sees what the writer wrote.
    let entries = pins.open_ipcache().unwrap().entries().unwrap();
    assert_eq!(entries.len(), 200);
    let key = IpCacheKey::parse("10.214.2.4", 0).unwrap();
    let (_, value) = entries.iter().find(|(k, _)| *k == key).unwrap();
    assert_eq!(
        *value,
        IpCacheValue::new(70_004, Some(Ipv4Addr::new(10, 213, 0, 2)), 0)
    );
    let key = IpCacheKey::parse("10.214.2.5", 0).unwrap();
    let (_, value) = entries.iter().find(|(k, _)| *k == key).unwrap();
    assert_eq!(
        value.tunnel(),
        None,
        "the local node's entries have tunnel 0"
    );

    // Another cluster's delete of the same prefix is ignored; the owner's delete applies.
    writer.delete(&cluster("c"), &entry("10.214.2.4", None, 1));
    writer.flush(&mut map).unwrap();
    assert_eq!(map.entries().unwrap().len(), 200);
    writer.delete(&cluster("b"), &entry("10.214.2.4", None, 1));
    writer.flush(&mut map).unwrap();
    assert_eq!(map.entries().unwrap().len(), 199);
    assert_eq!(writer.stats().deleted, 1);

    // A restart recreates the map empty at the same pin; the old one is gone from bpffs.
    let fresh = pins.recreate_ipcache().unwrap();
    assert!(fresh.entries().unwrap().is_empty());
}

#[test]
#[ignore = "needs root and bpffs: `cargo xtask test` runs it"]
fn bad_entries_are_counted_and_never_written() {
    let root = BpfRoot::new().unwrap();
    let pins = PinDir::under(root.path());
    let mut map = pins.recreate_ipcache().unwrap();
    let mut writer = IpCacheWriter::new(None);
    let err = writer
        .upsert(&cluster("b"), &entry("10.214.2.9", None, 0))
        .unwrap_err();
    assert!(err.to_string().contains("identity 0"), "{err}");
    writer
        .upsert(&cluster("b"), &entry("10.214.2.10", None, 5))
        .unwrap();
    writer.flush(&mut map).unwrap();
    assert_eq!(writer.stats().rejected.get("zero_identity"), Some(&1));
    let entries = map.entries().unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].1.sec_identity, 5);
}

#[test]
#[ignore = "needs root and bpffs: `cargo xtask test` runs it"]
fn a_full_map_is_reported_once_and_not_retried() {
    let root = BpfRoot::new().unwrap();
    let pins = PinDir::under(root.path());
    let mut map = pins.recreate_ipcache_sized(10).unwrap();
    let mut writer = IpCacheWriter::new(None);
    for i in 0..15u32 {
        writer
            .upsert(
                &cluster("b"),
                &entry(&format!("10.214.3.{i}"), None, 100 + i),
            )
            .unwrap();
    }
    let err = writer.flush(&mut map).unwrap_err();
    assert!(matches!(err, FlushError::MapFull { failed: 5 }), "{err}");
    assert_eq!(writer.stats().map_full, 5);
    assert_eq!(map.entries().unwrap().len(), 10);
    // Nothing is pending: the next flush does not hammer the full map again.
    writer.flush(&mut map).unwrap();
    assert_eq!(writer.stats().map_full, 5);
}

#[test]
#[ignore = "needs root and bpffs: `cargo xtask test` runs it"]
fn local_endpoint_entries_are_replaced_as_a_whole_and_identity_0_is_refused() {
    let root = BpfRoot::new().unwrap();
    let pins = PinDir::under(root.path());
    let mut map = pins.recreate_ipcache().unwrap();
    let mut writer = IpCacheWriter::new(None);
    let ips: Vec<IpAddr> = vec![
        "10.214.1.10".parse().unwrap(),
        "fd6d:77::10".parse().unwrap(),
    ];
    assert!(writer.set_local(7, &ips, 1000).is_empty());
    writer.flush(&mut map).unwrap();
    let entries = map.entries().unwrap();
    assert_eq!(entries.len(), 2);
    assert!(
        entries
            .iter()
            .all(|(_, v)| v.sec_identity == 1000 && v.tunnel().is_none())
    );

    // A new spec replaces the old IPs; identity 0 is refused and writes nothing.
    assert!(writer.set_local(7, &ips[..1], 1001).is_empty());
    writer.flush(&mut map).unwrap();
    let entries = map.entries().unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].1.sec_identity, 1001);
    assert_eq!(writer.set_local(8, &ips[1..], 0), ips[1..].to_vec());
    writer.flush(&mut map).unwrap();
    assert_eq!(map.entries().unwrap().len(), 1);
}

#[test]
#[ignore = "needs root and bpffs: `cargo xtask test` runs it"]
fn writes_within_one_flush_end_as_they_were_last_made() {
    let root = BpfRoot::new().unwrap();
    let pins = PinDir::under(root.path());
    let mut map = pins.recreate_ipcache().unwrap();
    let mut writer = IpCacheWriter::new(None);
    let (b, c) = (cluster("b"), cluster("c"));
    // Written, deleted, written again: present with its last value.
    writer
        .upsert(&b, &entry("10.214.3.1", None, 70_001))
        .unwrap();
    writer.delete(&b, &entry("10.214.3.1", None, 70_001));
    writer
        .upsert(&c, &entry("10.214.3.1", None, 70_002))
        .unwrap();
    // Written twice, then deleted: absent, and the delete is no error.
    writer
        .upsert(&b, &entry("10.214.3.2", None, 70_003))
        .unwrap();
    writer
        .upsert(&b, &entry("10.214.3.2", None, 70_004))
        .unwrap();
    writer.delete(&b, &entry("10.214.3.2", None, 70_004));
    // Written twice: the second value.
    writer
        .upsert(&b, &entry("10.214.3.3", None, 70_005))
        .unwrap();
    writer
        .upsert(&b, &entry("10.214.3.3", None, 70_006))
        .unwrap();
    writer.flush(&mut map).unwrap();

    let entries = pins.open_ipcache().unwrap().entries().unwrap();
    let identity = |ip: &str| {
        let key = IpCacheKey::parse(ip, 0).unwrap();
        entries
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.sec_identity)
    };
    assert_eq!(identity("10.214.3.1"), Some(70_002));
    assert_eq!(identity("10.214.3.2"), None);
    assert_eq!(identity("10.214.3.3"), Some(70_006));
    assert_eq!(entries.len(), 2);
    assert_eq!(writer.stats().write_errors, 0);
    assert_eq!(
        writer.owner(&IpCacheKey::parse("10.214.3.1", 0).unwrap()),
        Some(c)
    );
}
