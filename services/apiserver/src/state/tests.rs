use std::str::FromStr;

use meshwork_types::{AddressType, Decoder as _, IpCacheDecoder, NodeDecoder};

use super::*;

fn node(name: &str, ip: &str, cidr: &str) -> NodeSpec {
    NodeSpec {
        name: name.to_owned(),
        addresses: vec![Address {
            address_type: AddressType::InternalIp,
            ip: Some(ip.parse().unwrap()),
        }],
        ipv4_cidrs: vec![IpPrefix::from_str(cidr).unwrap()],
        ipv6_cidrs: vec![],
        ipv4_health_ip: None,
        ipv6_health_ip: None,
        wireguard_public_key: String::new(),
        encryption_key: 0,
        labels: BTreeMap::new(),
        eni_ipam: false,
    }
}

fn endpoint(id: u64, ip: &str, app: &str) -> EndpointSpec {
    EndpointSpec {
        id,
        ips: vec![ip.parse().unwrap()],
        labels: vec![Label::parse(&format!("k8s:app={app}"))],
        named_ports: vec![],
        pod_namespace: "default".to_owned(),
        pod_name: format!("{app}-{id}"),
    }
}

/// Cluster c1 with node n1 (10.1.1.0/24) holding endpoint 7 (`web`, 10.1.1.7), its
/// changes taken.
fn one_web_endpoint(now: Instant) -> ClusterState {
    let mut state = ClusterState::new("c1", 1, 255);
    state
        .publish_node(node("n1", "192.0.2.1", "10.1.1.0/24"))
        .unwrap();
    state
        .put_endpoint("n1", endpoint(7, "10.1.1.7", "web"), now)
        .unwrap();
    state.take_changes();
    state
}

fn keys(changes: &[KeyChange]) -> Vec<(&str, bool)> {
    changes
        .iter()
        .map(|(k, v)| (k.as_str(), v.is_some()))
        .collect()
}

#[test]
fn a_node_and_its_endpoints_become_cilium_keys_that_remote_readers_accept() {
    let now = Instant::now();
    let mut state = ClusterState::new("c1", 1, 255);
    state
        .publish_node(node("n1", "192.0.2.1", "10.1.1.0/24"))
        .unwrap();
    let id = state
        .put_endpoint("n1", endpoint(7, "10.1.1.7", "web"), now)
        .unwrap();
    assert_eq!(id, 65536);
    let changes = state.take_changes();
    assert_eq!(
        keys(&changes),
        [
            ("cilium/state/identities/v1/id/65536", true),
            ("cilium/state/ip/v1/default/10.1.1.7", true),
            ("cilium/state/nodes/v1/c1/n1", true),
        ]
    );
    // What a remote agent's decoders make of them.
    let node = NodeDecoder::new("c1", Some(1))
        .decode("n1", changes[2].1.as_ref().unwrap())
        .unwrap();
    assert_eq!(node.ipv4_alloc_cidr.unwrap().to_string(), "10.1.1.0/24");
    let pair = IpCacheDecoder::new(Some(1))
        .decode("10.1.1.7", changes[1].1.as_ref().unwrap())
        .unwrap();
    assert_eq!(
        (pair.id, pair.host_ip),
        (65536, Some("192.0.2.1".parse().unwrap()))
    );
    assert_eq!(pair.k8s_pod_name, "web-7");
    assert_eq!(
        changes[0].1.as_deref(),
        Some(&b"k8s:app=web;k8s:io.cilium.k8s.policy.cluster=c1;"[..])
    );
    assert!(state.take_changes().is_empty(), "nothing changed since");
}

#[test]
fn republishing_the_same_state_changes_no_key() {
    let now = Instant::now();
    let mut state = one_web_endpoint(now);
    state.disconnect("n1", now);
    state
        .publish_node(node("n1", "192.0.2.1", "10.1.1.0/24"))
        .unwrap();
    state
        .put_endpoint("n1", endpoint(7, "10.1.1.7", "web"), now)
        .unwrap();
    assert!(state.take_changes().is_empty());
    assert!(state.connected("n1"));
}

#[test]
fn a_moved_endpoint_ip_deletes_the_old_key_and_a_deleted_endpoint_its_keys() {
    let now = Instant::now();
    let mut state = one_web_endpoint(now);
    state
        .put_endpoint("n1", endpoint(7, "10.1.1.8", "web"), now)
        .unwrap();
    assert_eq!(
        keys(&state.take_changes()),
        [
            ("cilium/state/ip/v1/default/10.1.1.7", false),
            ("cilium/state/ip/v1/default/10.1.1.8", true),
        ]
    );
    assert!(state.delete_endpoint("n1", 7, now));
    assert!(!state.delete_endpoint("n1", 7, now));
    assert_eq!(
        keys(&state.take_changes()),
        [("cilium/state/ip/v1/default/10.1.1.8", false)]
    );
}

#[test]
fn bad_publishes_are_refused_and_change_nothing() {
    let now = Instant::now();
    let mut state = ClusterState::new("c1", 1, 255);
    state
        .publish_node(node("n1", "192.0.2.1", "10.1.1.0/24"))
        .unwrap();
    state.take_changes();
    let overlap = state
        .publish_node(node("n2", "192.0.2.2", "10.1.0.0/16"))
        .unwrap_err();
    assert_eq!(overlap.reason(), "pod_cidr_overlap");
    let outside = state
        .put_endpoint("n1", endpoint(1, "10.9.9.9", "web"), now)
        .unwrap_err();
    assert_eq!(outside.reason(), "ip_outside_pod_cidr");
    assert_eq!(
        outside.to_string(),
        "endpoint 1: 10.9.9.9 is outside node n1's pod CIDRs"
    );
    let unknown = state
        .put_endpoint("n9", endpoint(1, "10.1.1.9", "web"), now)
        .unwrap_err();
    assert_eq!(unknown.reason(), "unknown_node");
    assert!(state.take_changes().is_empty());
    assert_eq!(state.identity_count(), 0);
    let mut eni = node("n3", "192.0.2.3", "10.3.0.0/24");
    eni.eni_ipam = true;
    state.publish_node(eni).unwrap();
    state
        .put_endpoint("n3", endpoint(1, "10.200.0.5", "web"), now)
        .unwrap();
}

#[test]
fn a_gone_node_stays_for_the_grace_then_goes_with_its_entries_and_unused_identities() {
    let start = Instant::now();
    let grace = Duration::from_secs(900);
    let mut state = one_web_endpoint(start);
    state.disconnect("n1", start);
    assert!(
        state
            .collect_garbage(start + grace / 2, grace, grace)
            .is_empty()
    );
    assert!(state.take_changes().is_empty());
    assert_eq!(state.collect_garbage(start + grace, grace, grace), ["n1"]);
    assert_eq!(
        keys(&state.take_changes()),
        [
            ("cilium/state/ip/v1/default/10.1.1.7", false),
            ("cilium/state/nodes/v1/c1/n1", false),
        ]
    );
    // The identity is released one GC interval after its last user went.
    state.collect_garbage(start + grace * 2, grace, grace);
    assert_eq!(
        keys(&state.take_changes()),
        [("cilium/state/identities/v1/id/65536", false)]
    );
}

#[test]
fn a_shared_service_has_the_matching_endpoints_as_backends() {
    let now = Instant::now();
    let mut state = ClusterState::new("c1", 1, 255);
    state
        .publish_node(node("n1", "192.0.2.1", "10.1.1.0/24"))
        .unwrap();
    state
        .put_endpoint("n1", endpoint(1, "10.1.1.1", "web"), now)
        .unwrap();
    state
        .put_endpoint("n1", endpoint(2, "10.1.1.2", "db"), now)
        .unwrap();
    state.take_changes();
    let service = ServiceSpec {
        namespace: "default".to_owned(),
        name: "web".to_owned(),
        frontends: vec!["10.96.0.10".parse().unwrap()],
        ports: BTreeMap::from([("http".to_owned(), l4(L4Type::Tcp, 80))]),
        selector: vec![Label::parse("k8s:app=web")],
        shared: true,
    };
    assert_eq!(state.put_service(service.clone()), 1);
    let changes = state.take_changes();
    assert_eq!(
        keys(&changes),
        [("cilium/state/services/v1/c1/default/web", true)]
    );
    let value: serde_json::Value = serde_json::from_slice(changes[0].1.as_ref().unwrap()).unwrap();
    assert_eq!(value["backends"]["10.1.1.1"]["http"]["Port"], 80);
    assert_eq!(value["frontends"]["10.96.0.10"]["http"]["Protocol"], "TCP");
    assert!(value["backends"].get("10.1.1.2").is_none());
    // A new matching endpoint joins; unsharing deletes the key.
    state
        .put_endpoint("n1", endpoint(3, "10.1.1.3", "web"), now)
        .unwrap();
    assert_eq!(state.services()[0].1.len(), 2);
    state.take_changes();
    state.put_service(ServiceSpec {
        shared: false,
        ..service
    });
    assert_eq!(
        keys(&state.take_changes()),
        [("cilium/state/services/v1/c1/default/web", false)]
    );
    assert!(state.delete_service("default", "web"));
    assert!(!state.delete_service("default", "web"));
}

/// What a previous apiserver wrote for [`one_web_endpoint`] plus a second endpoint
/// (10.1.1.8) and an entry whose host is no node (10.9.9.9).
fn found_in_etcd() -> BTreeMap<String, Vec<u8>> {
    let now = Instant::now();
    let mut before = one_web_endpoint(now);
    before
        .put_endpoint("n1", endpoint(8, "10.1.1.8", "web"), now)
        .unwrap();
    let mut found = before.desired().clone();
    found.insert(
        "cilium/state/ip/v1/default/10.9.9.9".to_owned(),
        br#"{"IP":"10.9.9.9","Mask":null,"HostIP":"192.0.2.99","ID":65536,"Key":0,"Metadata":"","K8sNamespace":"","K8sPodName":""}"#.to_vec(),
    );
    found
}

#[test]
fn an_adopted_node_that_returns_claims_its_keys_and_what_it_no_longer_has_is_deleted() {
    let now = Instant::now();
    let found = found_in_etcd();
    let mut state = ClusterState::new("c1", 1, 255);
    assert_eq!(state.adopt(&found, now), ["n1"]);
    assert_eq!(state.adopted_nodes().collect::<Vec<_>>(), ["n1"]);
    // n1 comes back with endpoint 7 only (8 was deleted while the apiserver was away).
    state
        .publish_node(node("n1", "192.0.2.1", "10.1.1.0/24"))
        .unwrap();
    state
        .put_endpoint("n1", endpoint(7, "10.1.1.7", "web"), now)
        .unwrap();
    let _ = state.take_changes();
    state.claim_adopted("n1");
    assert_eq!(
        keys(&state.take_changes()),
        [("cilium/state/ip/v1/default/10.1.1.8", false)],
        "only what n1 no longer has goes"
    );
    assert_eq!(state.adopted_nodes().count(), 0);
}

#[test]
fn an_adopted_node_that_never_returns_goes_after_the_grace_and_so_do_entries_of_no_node() {
    let now = Instant::now();
    let grace = Duration::from_secs(900);
    let mut state = ClusterState::new("c1", 1, 255);
    state.adopt(&found_in_etcd(), now);
    assert!(
        state
            .collect_garbage(now + grace - Duration::from_secs(1), grace, grace * 4)
            .is_empty()
    );
    assert!(
        state.take_changes().is_empty(),
        "nothing goes before the grace"
    );
    let gone = state.collect_garbage(now + grace, grace, grace * 4);
    assert_eq!(gone, ["n1"]);
    assert_eq!(
        keys(&state.take_changes()),
        [
            ("cilium/state/ip/v1/default/10.1.1.7", false),
            ("cilium/state/ip/v1/default/10.1.1.8", false),
            ("cilium/state/ip/v1/default/10.9.9.9", false),
            ("cilium/state/nodes/v1/c1/n1", false),
        ]
    );
}

#[test]
fn an_adopted_node_can_be_deleted_at_once_and_a_returned_one_is_not_collected() {
    let now = Instant::now();
    let grace = Duration::from_secs(900);
    let mut state = ClusterState::new("c1", 1, 255);
    state.adopt(&found_in_etcd(), now);
    assert!(state.delete_node("n1", now), "an adopted node is known");
    let changes = state.take_changes();
    let deleted = keys(&changes);
    assert!(
        deleted.contains(&("cilium/state/nodes/v1/c1/n1", false)),
        "{deleted:?}"
    );
    assert!(!state.delete_node("n1", now), "and then it is gone");

    // A node back (connected, initial state not complete yet) is not collected.
    let mut state = ClusterState::new("c1", 1, 255);
    state.adopt(&found_in_etcd(), now);
    state
        .publish_node(node("n1", "192.0.2.1", "10.1.1.0/24"))
        .unwrap();
    let _ = state.take_changes();
    let gone = state.collect_garbage(now + grace, grace, grace * 4);
    assert!(gone.is_empty(), "{gone:?}");
    let deletes: Vec<_> = state
        .take_changes()
        .into_iter()
        .filter(|(k, v)| v.is_none() && k.contains("10.1.1."))
        .collect();
    assert!(deletes.is_empty(), "n1's entries stay: {deletes:?}");
}
