//! The pod network plumbing as library calls, on real namespaces made by the lab: a "node"
//! namespace plays the host (the machine's own namespace is never touched), pods are
//! namespaces of their own, and every address lies in the lab's guarded pod range.
//! What the plugin made is read back with `ip -n … -j` (iproute2, not our own netlink
//! code), and traffic is probed through it.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use meshwork_cni::naming;
use meshwork_cni::netns::{HostNetns, Netns};
use meshwork_cni::plumbing::{self, PodNetwork};
use meshwork_lab::net::{Cidr, LabNet, Netns as LabNetns, POD_RANGE};
use serde_json::Value;

const REACH: Duration = Duration::from_secs(10);

/// `ip -n NS -j ARGS…`, parsed.
fn ip_json(ns: &LabNetns, args: &[&str]) -> Value {
    let mut full = vec!["-j"];
    full.extend_from_slice(args);
    let out = ns.ip(&full).unwrap();
    serde_json::from_str(&out).unwrap_or_else(|err| panic!("ip {args:?}: {err}: {out}"))
}

/// A pod address of the lab's pod range (10.214.0.0/16), refused otherwise.
fn pod_ip(third: u8, fourth: u8) -> Ipv4Addr {
    let ip = Ipv4Addr::new(10, 214, third, fourth);
    let cidr = Cidr::parse(&format!("{ip}/32")).unwrap();
    assert!(cidr.is_within(&POD_RANGE));
    cidr.check_guarded().unwrap();
    ip
}

fn network(container: &str, ip: Ipv4Addr, prefix_len: u8, gateway: Ipv4Addr) -> PodNetwork {
    PodNetwork {
        host_ifname: naming::host_ifname(container, "eth0"),
        pod_ifname: "eth0".to_owned(),
        ip,
        prefix_len,
        gateway,
        mtu: Some(1400),
    }
}

fn routes_of(ns: &LabNetns) -> Vec<Value> {
    ip_json(ns, &["route", "show"])
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn has_route(routes: &[Value], dst: &str, dev: &str, gateway: Option<&str>) -> bool {
    routes.iter().any(|r| {
        r["dst"] == dst
            && r["dev"] == dev
            && gateway.is_none_or(|gw| r["gateway"] == gw)
            && (gateway.is_some() || r.get("gateway").is_none())
    })
}

#[test]
#[ignore = "needs root and network namespaces: `cargo xtask test` runs it"]
fn pods_are_plumbed_reachable_and_torn_down_idempotently() {
    let lab = LabNet::new().unwrap();
    let node = lab.netns("cni-node").unwrap();
    node.enable_forwarding().unwrap();
    let eni_pod = lab.netns("cni-eni").unwrap();
    let pool_a = lab.netns("cni-pool-a").unwrap();
    let pool_b = lab.netns("cni-pool-b").unwrap();
    let host = HostNetns::Other(Netns::open(node.path()).unwrap());

    // An ENI-style /32 whose gateway is off-subnet, and two pods of one /24 (cluster-pool).
    let eni_gw = pod_ip(7, 1);
    let pool_gw = pod_ip(8, 1);
    let eni = network("c-eni", pod_ip(7, 5), 32, eni_gw);
    let a = network("c-pool-a", pod_ip(8, 5), 24, pool_gw);
    let b = network("c-pool-b", pod_ip(8, 6), 24, pool_gw);
    // The gateways are the node's (on its lo), so a pod's probe to them ends at the node.
    node.add_addr("lo", &format!("{eni_gw}/32")).unwrap();
    node.add_addr("lo", &format!("{pool_gw}/32")).unwrap();

    let mut attached = Vec::new();
    for (pod, net) in [(&eni_pod, &eni), (&pool_a, &a), (&pool_b, &b)] {
        let pod_ns = Netns::open(pod.path()).unwrap();
        let both = plumbing::setup(&host, &pod_ns, net).unwrap();
        assert_eq!(both.host.name, net.host_ifname);
        assert_eq!(both.pod.name, "eth0");
        assert!(both.pod.up && both.host.up);
        assert_eq!(both.host.mtu, Some(1400));
        assert_eq!(both.pod.mtu, Some(1400));
        assert!(plumbing::check(&host, &pod_ns, net).unwrap().is_empty());
        attached.push((pod, net, pod_ns, both));
    }

    // What iproute2 sees: the host ends and /32 routes in the node, nothing more.
    let node_routes = routes_of(&node);
    for (_, net, _, _) in &attached {
        let link = ip_json(&node, &["link", "show", "dev", &net.host_ifname]);
        assert_eq!(link[0]["operstate"], "UP", "{link}");
        assert!(
            has_route(&node_routes, &net.ip.to_string(), &net.host_ifname, None),
            "{node_routes:?}"
        );
    }
    // proxy_arp on the /24 pods' host ends only.
    let proxy_arp = |name: &str| {
        let path = format!("/proc/sys/net/ipv4/conf/{name}/proxy_arp");
        node.enter(move || std::fs::read_to_string(path).unwrap())
            .unwrap()
            .trim()
            .to_owned()
    };
    assert_eq!(proxy_arp(&eni.host_ifname), "0");
    assert_eq!(proxy_arp(&a.host_ifname), "1");

    // Inside the pods: the address, lo up, the gateway's neighbour, the routes.
    for (pod, net, _, both) in &attached {
        let addr = ip_json(pod, &["address", "show", "dev", "eth0"]);
        let local = &addr[0]["addr_info"];
        assert!(
            local
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a["local"] == net.ip.to_string()
                    && a["prefixlen"] == u64::from(net.prefix_len)),
            "{addr}"
        );
        let lo = ip_json(pod, &["link", "show", "dev", "lo"]);
        assert!(
            lo[0]["flags"].as_array().unwrap().iter().any(|f| f == "UP"),
            "{lo}"
        );
        let routes = routes_of(pod);
        assert!(
            has_route(&routes, "default", "eth0", Some(&net.gateway.to_string())),
            "{routes:?}"
        );
        let neigh = ip_json(pod, &["neigh", "show", "dev", "eth0"]);
        let host_mac = meshwork_cni::netlink::format_mac(&both.host.mac);
        assert!(
            neigh
                .as_array()
                .unwrap()
                .iter()
                .any(|n| n["dst"] == net.gateway.to_string()
                    && n["lladdr"] == host_mac
                    && n["state"]
                        .as_array()
                        .is_some_and(|s| s.iter().any(|s| s == "PERMANENT"))),
            "{neigh}"
        );
    }
    // The /32 needs its on-link route to the gateway; the /24 has the kernel's subnet route.
    assert!(has_route(
        &routes_of(&eni_pod),
        &eni_gw.to_string(),
        "eth0",
        None
    ));
    assert!(has_route(
        &routes_of(&pool_a),
        "10.214.8.0/24",
        "eth0",
        None
    ));

    // Traffic: each pod reaches its gateway (the node); the ENI pod reaches a pool pod
    // through the node's routes; the two pool pods reach each other through the node's
    // proxy ARP.
    eni_pod.wait_reachable(IpAddr::V4(eni_gw), REACH).unwrap();
    pool_a.wait_reachable(IpAddr::V4(pool_gw), REACH).unwrap();
    eni_pod.wait_reachable(IpAddr::V4(a.ip), REACH).unwrap();
    pool_a.wait_reachable(IpAddr::V4(b.ip), REACH).unwrap();

    // Teardown, twice: the first removes the pair (and the node's route), the second finds
    // nothing and succeeds.
    for (pod, net, pod_ns, _) in &attached {
        assert!(plumbing::teardown(&host, &net.host_ifname).unwrap());
        assert!(!plumbing::teardown(&host, &net.host_ifname).unwrap());
        assert!(
            ip_json(pod, &["link", "show"])
                .as_array()
                .unwrap()
                .iter()
                .all(|l| l["ifname"] != "eth0")
        );
        let problems = plumbing::check(&host, pod_ns, net).unwrap();
        assert!(
            problems.iter().any(|p| p.contains("missing")),
            "{problems:?}"
        );
    }
    let node_routes = routes_of(&node);
    for (_, net, _, _) in &attached {
        assert!(
            !node_routes.iter().any(|r| r["dst"] == net.ip.to_string()),
            "{node_routes:?}"
        );
    }
    let links = ip_json(&node, &["link", "show"]);
    assert!(
        links
            .as_array()
            .unwrap()
            .iter()
            .all(|l| !l["ifname"].as_str().unwrap_or_default().starts_with("mw")),
        "{links}"
    );
}

#[test]
#[ignore = "needs root and network namespaces: `cargo xtask test` runs it"]
fn a_leftover_host_end_is_replaced_and_a_gone_pod_needs_no_teardown() {
    let lab = LabNet::new().unwrap();
    let node = lab.netns("cni-node2").unwrap();
    let first = lab.netns("cni-first").unwrap();
    let host = HostNetns::Other(Netns::open(node.path()).unwrap());
    let net = network("c-again", pod_ip(9, 5), 32, pod_ip(9, 1));

    plumbing::setup(&host, &Netns::open(first.path()).unwrap(), &net).unwrap();
    // The same attachment again (an ADD the runtime retried into a new namespace): the old
    // pair goes, the new one is made.
    let second = lab.netns("cni-second").unwrap();
    let second_ns = Netns::open(second.path()).unwrap();
    plumbing::setup(&host, &second_ns, &net).unwrap();
    assert!(plumbing::check(&host, &second_ns, &net).unwrap().is_empty());
    assert!(
        ip_json(&first, &["link", "show"])
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["ifname"] != "eth0")
    );

    // The pod's interface name taken: an error, and nothing left in the node.
    let taken = network("c-taken", pod_ip(9, 6), 32, pod_ip(9, 1));
    let err = plumbing::setup(&host, &second_ns, &taken).unwrap_err();
    assert!(err.to_string().contains("eth0"), "{err}");
    assert!(
        node.ip(&["link", "show", "dev", &taken.host_ifname])
            .is_err()
    );

    // The pod's namespace disappears (the container is gone): the kernel takes the pair
    // with it (asynchronously), and a teardown then finds nothing and succeeds.
    drop(second_ns);
    drop(second);
    meshwork_lab::wait::until(
        "the host end to go with the pod's namespace",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || {
            node.ip(&["link", "show", "dev", &net.host_ifname])
                .is_err()
                .then_some(())
        },
    )
    .unwrap();
    assert!(!plumbing::teardown(&host, &net.host_ifname).unwrap());
}
