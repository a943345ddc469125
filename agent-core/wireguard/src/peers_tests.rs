//! The peer table's rules, one row per rule.

use std::net::IpAddr;
use std::sync::Arc;

use super::*;
use crate::backend::PeerState;
use meshwork_types::{Address, IpIdentityPair};

fn key(n: u8) -> Key {
    Key([n; 32])
}

fn prefix(text: &str) -> IpPrefix {
    text.parse().unwrap()
}

fn addr(address_type: AddressType, ip: &str) -> Address {
    Address {
        address_type,
        ip: Some(ip.parse().unwrap()),
    }
}

fn node(name: &str, n: u8, addresses: Vec<Address>, pod_cidr: &str) -> Node {
    Node {
        name: name.to_owned(),
        cluster: "c2".to_owned(),
        ip_addresses: addresses,
        ipv4_alloc_cidr: Some(prefix(pod_cidr)),
        wireguard_pub_key: key(n).to_base64(),
        ..Node::default()
    }
}

fn simple(name: &str, n: u8, ip: &str, pod_cidr: &str) -> Node {
    node(name, n, vec![addr(AddressType::InternalIp, ip)], pod_cidr)
}

fn ipcache_entry(prefix_ip: &str, host: &str) -> IpCacheEntry {
    let pair = IpIdentityPair {
        ip: Some(prefix_ip.parse().unwrap()),
        host_ip: Some(host.parse().unwrap()),
        id: 1000,
        ..IpIdentityPair::default()
    };
    IpCacheEntry::from_pair(pair).unwrap()
}

fn cluster() -> Arc<str> {
    Arc::from("c2")
}

/// Plans and commits, returning the request.
fn apply(table: &mut PeerTable) -> DeviceUpdate {
    let plan = table.plan();
    let update = plan.update.clone();
    table.commit(plan);
    update
}

fn set(prefixes: &[&str]) -> Vec<IpPrefix> {
    prefixes.iter().map(|p| prefix(p)).collect()
}

#[test]
fn endpoint_choice_follows_cilium() {
    use AddressType::{CiliumInternalIp, ExternalIp, Hostname, InternalIp};
    let rows: Vec<(Vec<Address>, Option<&str>)> = vec![
        (
            vec![
                addr(CiliumInternalIp, "10.9.0.1"),
                addr(ExternalIp, "10.8.0.1"),
                addr(InternalIp, "10.7.0.1"),
            ],
            Some("10.7.0.1:51871"),
        ),
        (
            vec![
                addr(CiliumInternalIp, "10.9.0.1"),
                addr(ExternalIp, "10.8.0.1"),
            ],
            Some("10.8.0.1:51871"),
        ),
        (
            vec![
                addr(Hostname, "10.6.0.1"),
                addr(CiliumInternalIp, "10.9.0.1"),
            ],
            Some("10.6.0.1:51871"),
        ),
        // IPv4 before IPv6, whatever the types.
        (
            vec![addr(InternalIp, "fd6d:77::1"), addr(ExternalIp, "10.8.0.1")],
            Some("10.8.0.1:51871"),
        ),
        (
            vec![addr(InternalIp, "fd6d:77::1")],
            Some("[fd6d:77::1]:51871"),
        ),
        // CiliumInternalIP never.
        (vec![addr(CiliumInternalIp, "10.9.0.1")], None),
    ];
    for (i, (addresses, want)) in rows.into_iter().enumerate() {
        let mut table = PeerTable::new(false);
        table
            .upsert_node(&cluster(), &node("n", 1, addresses, "10.214.1.0/24"))
            .unwrap();
        let got = table.desired(&key(1)).unwrap().endpoint;
        assert_eq!(got, want.map(|w| w.parse().unwrap()), "row {i}");
    }
}

#[test]
fn allowed_ips_are_pod_cidrs_plus_hosted_ipcache_prefixes_plus_node_ips_with_encrypt_node() {
    for encrypt_node in [false, true] {
        let mut table = PeerTable::new(encrypt_node);
        let c = cluster();
        table
            .upsert_node(&c, &simple("a", 1, "10.213.0.2", "10.214.2.0/24"))
            .unwrap();
        table.ipcache(&c, &ipcache_entry("10.214.9.9", "10.213.0.2"), false);
        table.ipcache(&c, &ipcache_entry("10.214.8.8", "10.213.0.99"), false); // other host
        let update = apply(&mut table);
        assert_eq!(update.peers.len(), 1);
        let mut want = set(&["10.214.2.0/24", "10.214.9.9/32"]);
        if encrypt_node {
            want.push(prefix("10.213.0.2/32"));
            want.sort();
        }
        assert_eq!(
            update.peers[0].allowed_ips, want,
            "encrypt_node={encrypt_node}"
        );
        assert_eq!(
            update.peers[0].endpoint,
            Some("10.213.0.2:51871".parse().unwrap())
        );
    }
}

#[test]
fn ipcache_changes_add_then_replace_allowed_ips() {
    let mut table = PeerTable::new(false);
    let c = cluster();
    table
        .upsert_node(&c, &simple("a", 1, "10.213.0.2", "10.214.2.0/24"))
        .unwrap();
    apply(&mut table);
    table.ipcache(&c, &ipcache_entry("10.214.9.9", "10.213.0.2"), false);
    let added = apply(&mut table);
    assert!(!added.peers[0].replace_allowed_ips, "an addition only adds");
    assert_eq!(added.peers[0].allowed_ips, set(&["10.214.9.9/32"]));
    assert_eq!(
        added.peers[0].endpoint, None,
        "unchanged endpoint not resent"
    );
    table.ipcache(&c, &ipcache_entry("10.214.9.9", "10.213.0.2"), true);
    let removed = apply(&mut table);
    assert!(removed.peers[0].replace_allowed_ips);
    assert_eq!(removed.peers[0].allowed_ips, set(&["10.214.2.0/24"]));
    assert!(apply(&mut table).is_empty(), "nothing left to do");
}

#[test]
fn key_change_replaces_the_peer_and_ip_change_resets_allowed_ips() {
    let mut table = PeerTable::new(false);
    let c = cluster();
    table
        .upsert_node(&c, &simple("a", 1, "10.213.0.2", "10.214.2.0/24"))
        .unwrap();
    table.ipcache(&c, &ipcache_entry("10.214.9.9", "10.213.0.2"), false);
    apply(&mut table);

    table
        .upsert_node(&c, &simple("a", 2, "10.213.0.2", "10.214.2.0/24"))
        .unwrap();
    let update = apply(&mut table);
    assert_eq!(update.peers.len(), 2);
    assert_eq!(update.peers[0], PeerUpdate::remove(key(1)));
    assert_eq!(update.peers[1].key, key(2));
    assert_eq!(
        update.peers[1].allowed_ips,
        set(&["10.214.2.0/24", "10.214.9.9/32"])
    );

    // New IP: the ipcache prefix hosted on the old IP is no longer allowed.
    table
        .upsert_node(&c, &simple("a", 2, "10.213.0.3", "10.214.2.0/24"))
        .unwrap();
    let update = apply(&mut table);
    assert_eq!(update.peers.len(), 1);
    assert!(update.peers[0].replace_allowed_ips);
    assert_eq!(update.peers[0].allowed_ips, set(&["10.214.2.0/24"]));
    assert_eq!(
        update.peers[0].endpoint,
        Some("10.213.0.3:51871".parse().unwrap())
    );
}

#[test]
fn duplicate_and_malformed_keys_are_rejected_counted_and_leave_others_alone() {
    let mut table = PeerTable::new(false);
    let c = cluster();
    table
        .upsert_node(&c, &simple("a", 1, "10.213.0.2", "10.214.2.0/24"))
        .unwrap();
    apply(&mut table);

    let err = table
        .upsert_node(&c, &simple("b", 1, "10.213.0.3", "10.214.3.0/24"))
        .unwrap_err();
    assert!(
        err.to_string().contains("detected duplicate public key"),
        "{err}"
    );
    let mut bad = simple("c", 3, "10.213.0.4", "10.214.4.0/24");
    bad.wireguard_pub_key = "not-base64!".to_owned();
    assert!(matches!(
        table.upsert_node(&c, &bad),
        Err(PeerError::Malformed { .. })
    ));
    bad.wireguard_pub_key = Key([3; 32]).to_base64()[..20].to_owned();
    assert!(table.upsert_node(&c, &bad).is_err());
    assert_eq!(
        table.rejections(),
        Rejections {
            duplicate_keys: 1,
            malformed_keys: 2
        }
    );
    assert!(
        apply(&mut table).is_empty(),
        "the first node's peer is untouched"
    );
    assert_eq!(table.owner(&key(1)).as_deref(), Some("c2/a"));
    // The owner itself may re-announce its key.
    table
        .upsert_node(&c, &simple("a", 1, "10.213.0.2", "10.214.2.0/24"))
        .unwrap();
}

#[test]
fn node_delete_removes_its_peer_and_empty_key_means_no_peer() {
    let mut table = PeerTable::new(false);
    let c = cluster();
    table
        .upsert_node(&c, &simple("a", 1, "10.213.0.2", "10.214.2.0/24"))
        .unwrap();
    apply(&mut table);
    let mut keyless = simple("a", 1, "10.213.0.2", "10.214.2.0/24");
    keyless.wireguard_pub_key.clear();
    table.upsert_node(&c, &keyless).unwrap();
    assert_eq!(apply(&mut table).peers, vec![PeerUpdate::remove(key(1))]);
    table
        .upsert_node(&c, &simple("a", 1, "10.213.0.2", "10.214.2.0/24"))
        .unwrap();
    apply(&mut table);
    table.delete_node(&(c, "a".to_owned()));
    assert_eq!(apply(&mut table).peers, vec![PeerUpdate::remove(key(1))]);
}

fn restored_device() -> DeviceState {
    let peer = |n: u8, ips: &[&str]| PeerState {
        key: key(n),
        endpoint: Some(format!("10.213.0.{n}:51871").parse().unwrap()),
        allowed_ips: set(ips),
        last_handshake: None,
        rx_bytes: 0,
        tx_bytes: 0,
    };
    DeviceState {
        listen_port: 51871,
        has_private_key: true,
        peers: vec![
            peer(1, &["10.214.1.0/24", "10.214.9.1/32"]),
            peer(2, &["10.214.2.0/24"]),
        ],
    }
}

#[test]
fn restored_peers_are_untouched_until_nodes_synced_then_only_obsolete_ones_go() {
    let mut table = PeerTable::new(false);
    table.restore(&restored_device());
    let c = cluster();
    // Node 1 still exists and comes back; node 2 was deleted while the agent was down.
    table
        .upsert_node(&c, &simple("a", 1, "10.213.0.1", "10.214.1.0/24"))
        .unwrap();
    let update = apply(&mut table);
    assert!(
        update.is_empty(),
        "restored allowed IPs kept, nothing else changes: {update:?}"
    );
    assert_eq!(table.next_gc(), None, "no GC before NodesSynced");
    assert_eq!(
        table.pending_gc(),
        vec![(key(1), SyncKind::IpIdentities), (key(2), SyncKind::Nodes)]
    );

    table.nodes_synced();
    assert_eq!(table.next_gc(), Some(key(2)));
    table.gc_done(&key(2));
    assert_eq!(
        table.next_gc(),
        None,
        "the live peer is never a GC candidate"
    );

    // The ipcache wait drops the restored /32 no entry claims.
    table.ipcache_synced();
    let update = apply(&mut table);
    assert_eq!(update.peers.len(), 1);
    assert!(update.peers[0].replace_allowed_ips);
    assert_eq!(update.peers[0].allowed_ips, set(&["10.214.1.0/24"]));
    assert!(table.pending_gc().is_empty());
}

#[test]
fn a_restored_peer_claimed_late_is_not_collected_and_failed_plans_retry() {
    let mut table = PeerTable::new(false);
    table.restore(&restored_device());
    table.nodes_synced();
    let c = cluster();
    assert_eq!(table.next_gc(), Some(key(1)));
    // The node arrives before the GC ran: its peer is live now.
    table
        .upsert_node(&c, &simple("a", 1, "10.213.0.1", "10.214.1.0/24"))
        .unwrap();
    assert_eq!(table.next_gc(), Some(key(2)));

    table
        .upsert_node(&c, &simple("b", 3, "10.213.0.3", "10.214.3.0/24"))
        .unwrap();
    let plan = table.plan();
    assert_eq!(plan.update.peers.len(), 1);
    table.fail(plan);
    let retried = apply(&mut table);
    assert_eq!(retried.peers.len(), 1, "a failed plan is planned again");
    assert_eq!(retried.peers[0].key, key(3));
}

#[test]
fn a_recreated_device_gets_every_peer_again() {
    let mut table = PeerTable::new(false);
    table.restore(&restored_device());
    let c = cluster();
    table
        .upsert_node(&c, &simple("a", 1, "10.213.0.1", "10.214.1.0/24"))
        .unwrap();
    table
        .upsert_node(&c, &simple("b", 3, "10.213.0.3", "10.214.3.0/24"))
        .unwrap();
    apply(&mut table);
    table.device_reset();
    let update = apply(&mut table);
    let keys: Vec<Key> = update.peers.iter().map(|p| p.key).collect();
    assert_eq!(keys, vec![key(1), key(2), key(3)]);
    assert!(update.peers.iter().all(|p| p.replace_allowed_ips));
    let ips: Vec<IpAddr> = update.peers[0]
        .allowed_ips
        .iter()
        .map(IpPrefix::addr)
        .collect();
    assert_eq!(ips.len(), 2, "restored allowed IPs are configured again");
}
