//! Integration tests of the lab's network namespaces, partitions and wireguard-go (run as
//! root). Every probe runs inside a lab namespace; nothing here connects to a lab address from
//! the root namespace.

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use meshwork_lab::net::{
    GUARDED_RANGES, LabNet, Netns, list_netns, route_installed, with_no_guard_alive,
};
use meshwork_lab::wireguard::{WireguardGo, socket_path, uapi_errno, unique_device_name};
use meshwork_lab::{LabError, process, wait};

const SHORT: Duration = Duration::from_secs(1);
const REACH: Duration = Duration::from_secs(10);

fn ip(text: &str) -> IpAddr {
    text.parse().expect("test address")
}

fn pid_alive(pid: u32) -> bool {
    // A zombie has left every namespace and is as good as gone.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

fn wait_gone(what: &str, mut gone: impl FnMut() -> bool) {
    wait::until(
        what,
        Duration::from_secs(10),
        Duration::from_millis(20),
        || gone().then_some(()),
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

/// Two namespaces on one switch: a = 10.213.<net>.1, b = 10.213.<net>.2 (/24), plus IPv6.
struct Pair {
    a: Netns,
    b: Netns,
    switch: meshwork_lab::net::Switch,
    b_ip: IpAddr,
    a_ip: IpAddr,
}

fn pair(lab: &LabNet, net: u8) -> Pair {
    let switch = lab.switch("sw").unwrap();
    let a = lab.netns("a").unwrap();
    let b = lab.netns("b").unwrap();
    switch
        .connect(&a, "eth0", &format!("10.213.{net}.1/24"))
        .unwrap();
    switch
        .connect(&b, "eth0", &format!("10.213.{net}.2/24"))
        .unwrap();
    Pair {
        a,
        b,
        switch,
        a_ip: ip(&format!("10.213.{net}.1")),
        b_ip: ip(&format!("10.213.{net}.2")),
    }
}

#[test]
#[ignore = "needs root and network namespaces: `cargo xtask test` runs it"]
fn guard_routes_exist_before_addresses_and_go_with_the_last_guard() {
    let lab = LabNet::new().unwrap();
    // Before any namespace or address exists, the root namespace black-holes every range.
    for range in GUARDED_RANGES {
        assert!(
            route_installed(&range).unwrap(),
            "no unreachable route for {range}"
        );
    }
    let table =
        process::run(Command::new("ip").args(["route", "show", "type", "unreachable"])).unwrap();
    assert!(
        table.contains("10.213.0.0/16") && table.contains("10.214.0.0/16"),
        "{table}"
    );
    let v6 = process::run(Command::new("ip").args(["-6", "route", "show", "type", "unreachable"]))
        .unwrap();
    assert!(v6.contains("fd6d:77::/32"), "{v6}");

    let a = lab.netns("g").unwrap();
    a.add_addr("lo", "10.213.200.1/32").unwrap();
    drop(a);
    drop(lab);

    match with_no_guard_alive(|| {
        GUARDED_RANGES
            .iter()
            .filter(|range| route_installed(range).unwrap())
            .map(ToString::to_string)
            .collect::<Vec<_>>()
    })
    .unwrap()
    {
        Some(left) => assert!(
            left.is_empty(),
            "routes left after the last guard: {left:?}"
        ),
        None => eprintln!("another lab guard is alive (parallel tests): removal not checked"),
    }
}

#[test]
#[ignore = "needs root and network namespaces: `cargo xtask test` runs it"]
fn addresses_outside_the_guarded_ranges_are_refused() {
    let lab = LabNet::new().unwrap();
    let a = lab.netns("r").unwrap();
    for bad in [
        "10.0.0.1/24",
        "10.213.0.1/8",
        "192.168.7.1/24",
        "172.16.0.1/12",
        "fd00::1/64",
        "fd6d:77::1/16",
    ] {
        let refused = a.add_addr("lo", bad);
        assert!(refused.is_err(), "{bad} was accepted");
    }
    assert!(a.ip(&["addr", "add", "10.0.0.1/24", "dev", "lo"]).is_err());
    assert!(
        a.ip(&["-4", "a", "replace", "10.0.0.1/24", "dev", "lo"])
            .is_err()
    );
    let shown = a.ip(&["addr", "show", "dev", "lo"]).unwrap();
    assert!(
        !shown.contains("10.0.0.1") && !shown.contains("192.168"),
        "{shown}"
    );
    // The guarded ranges are fine.
    a.add_addr("lo", "10.214.3.4/32").unwrap();
    a.add_addr("lo", "fd6d:77::4/128").unwrap();
}

#[test]
#[ignore = "needs root and network namespaces: `cargo xtask test` runs it"]
fn two_namespaces_reach_each_other_through_a_switch() {
    let keep_before =
        std::fs::read_to_string("/proc/sys/net/ipv6/conf/all/keep_addr_on_down").unwrap();
    let lab = LabNet::new().unwrap();
    let p = pair(&lab, 1);
    p.a.add_addr("eth0", "fd6d:77:1::1/64").unwrap();
    p.b.add_addr("eth0", "fd6d:77:1::2/64").unwrap();

    p.a.wait_reachable(p.b_ip, REACH).unwrap();
    p.b.wait_reachable(p.a_ip, REACH).unwrap();
    p.a.wait_reachable(ip("fd6d:77:1::2"), REACH).unwrap();
    // An address nobody has does not answer.
    assert!(!p.a.can_reach(ip("10.213.1.99"), SHORT).unwrap());

    // Namespace sysctls went into the namespace, not the root one.
    let inside =
        p.a.run("cat", &["/proc/sys/net/ipv6/conf/all/keep_addr_on_down"])
            .unwrap();
    assert_eq!(inside.trim(), "1");
    p.a.enable_forwarding().unwrap();
    assert_eq!(
        p.a.run("cat", &["/proc/sys/net/ipv4/ip_forward"])
            .unwrap()
            .trim(),
        "1"
    );
    let keep_after =
        std::fs::read_to_string("/proc/sys/net/ipv6/conf/all/keep_addr_on_down").unwrap();
    assert_eq!(keep_before, keep_after);
}

#[test]
#[ignore = "needs root and network namespaces: `cargo xtask test` runs it"]
fn tcp_stream_between_namespaces_via_enter() {
    let lab = LabNet::new().unwrap();
    let p = pair(&lab, 2);
    p.a.wait_reachable(p.b_ip, REACH).unwrap();
    let server = SocketAddr::new(p.b_ip, 7000);
    let listener =
        p.b.enter(move || TcpListener::bind(server))
            .unwrap()
            .unwrap();
    let echo = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut buf = [0u8; 5];
        conn.read_exact(&mut buf).unwrap();
        conn.write_all(&buf).unwrap();
    });
    // The socket is made inside a; it is used from this (root-namespace) thread afterwards.
    let mut stream =
        p.a.enter(move || TcpStream::connect_timeout(&server, REACH))
            .unwrap()
            .unwrap();
    stream.write_all(b"hello").unwrap();
    stream.set_read_timeout(Some(REACH)).unwrap();
    let mut back = [0u8; 5];
    stream.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"hello");
    echo.join().unwrap();
}

#[test]
#[ignore = "needs root and network namespaces: `cargo xtask test` runs it"]
fn pods_route_through_their_nodes() {
    let lab = LabNet::new().unwrap();
    let switch = lab.switch("sw").unwrap();
    let mut nodes = Vec::new();
    let mut pods = Vec::new();
    for i in 1..=2u8 {
        let node = lab.netns(&format!("node{i}")).unwrap();
        switch
            .connect(&node, "eth0", &format!("10.213.3.{i}/24"))
            .unwrap();
        node.enable_forwarding().unwrap();
        let pod = lab.netns(&format!("pod{i}")).unwrap();
        pod.veth_to("eth0", &node, "lxc0").unwrap();
        node.add_addr("lxc0", &format!("10.214.{i}.1/32")).unwrap();
        pod.add_addr("eth0", &format!("10.214.{i}.10/32")).unwrap();
        pod.add_route_dev(&format!("10.214.{i}.1/32"), "eth0")
            .unwrap();
        pod.add_route_via("default", &format!("10.214.{i}.1"))
            .unwrap();
        node.add_route_dev(&format!("10.214.{i}.10/32"), "lxc0")
            .unwrap();
        nodes.push(node);
        pods.push(pod);
    }
    nodes[0]
        .add_route_via("10.214.2.0/24", "10.213.3.2")
        .unwrap();
    nodes[1]
        .add_route_via("10.214.1.0/24", "10.213.3.1")
        .unwrap();
    pods[0].wait_reachable(ip("10.214.2.10"), REACH).unwrap();
    pods[1].wait_reachable(ip("10.214.1.10"), REACH).unwrap();
}

#[test]
#[ignore = "needs root and network namespaces: `cargo xtask test` runs it"]
fn link_down_partitions_and_heal_restores_routes() {
    let lab = LabNet::new().unwrap();
    let p = pair(&lab, 4);
    // A static route through eth0: admin-down deletes it, heal must bring it back.
    p.a.add_route_via("10.214.44.0/24", "10.213.4.2").unwrap();
    p.a.wait_reachable(p.b_ip, REACH).unwrap();

    let down = p.a.link_down("eth0").unwrap();
    assert!(!p.a.can_reach(p.b_ip, SHORT).unwrap());
    assert!(!p.b.can_reach(p.a_ip, SHORT).unwrap());
    down.heal().unwrap();
    p.a.wait_reachable(p.b_ip, REACH).unwrap();
    let routes = p.a.ip(&["route", "show"]).unwrap();
    assert!(routes.contains("10.214.44.0/24 via 10.213.4.2"), "{routes}");

    // The switch side of b's cable, healed by drop this time.
    {
        let _port_down = p.switch.netns().link_down("p1").unwrap();
        assert!(!p.a.can_reach(p.b_ip, SHORT).unwrap());
    }
    p.a.wait_reachable(p.b_ip, REACH).unwrap();
}

#[test]
#[ignore = "needs root and network namespaces: `cargo xtask test` runs it"]
fn nft_drop_partitions_and_heal() {
    let lab = LabNet::new().unwrap();
    let p = pair(&lab, 5);
    p.a.wait_reachable(p.b_ip, REACH).unwrap();

    let cut = p.a.drop_traffic("10.213.5.2/32").unwrap();
    assert!(!p.a.can_reach(p.b_ip, SHORT).unwrap());
    assert!(!p.b.can_reach(p.a_ip, SHORT).unwrap());
    // The links stay up: it is a black hole, not NO-CARRIER.
    assert!(
        p.a.ip(&["link", "show", "eth0"])
            .unwrap()
            .contains("LOWER_UP")
    );
    let table = cut.table().to_owned();
    cut.heal().unwrap();
    p.a.wait_reachable(p.b_ip, REACH).unwrap();
    assert!(
        !p.a.run("nft", &["list", "tables"])
            .unwrap()
            .contains(&table)
    );

    {
        let _cut = p.b.drop_traffic("10.213.5.0/24").unwrap();
        assert!(!p.a.can_reach(p.b_ip, SHORT).unwrap());
    }
    p.a.wait_reachable(p.b_ip, REACH).unwrap();
    assert!(
        p.b.run("nft", &["list", "tables"])
            .unwrap()
            .trim()
            .is_empty()
    );
}

#[test]
#[ignore = "needs root and network namespaces: `cargo xtask test` runs it"]
fn namespaces_and_processes_are_gone_after_drop() {
    let lab = LabNet::new().unwrap();
    let a = lab.netns("d").unwrap();
    let name = a.name().to_owned();
    assert!(name.starts_with(&format!("mw{}-", std::process::id())));
    assert!(list_netns().contains(&name));
    let mut sleeper = a.spawn("sleep", Command::new("sleep").arg("600")).unwrap();
    sleeper.check_running().unwrap();
    let pid = sleeper.pid();
    let expected = vec![i32::try_from(pid).unwrap()];
    wait::until(
        "sleep inside the namespace",
        REACH,
        Duration::from_millis(10),
        || (a.pids() == expected).then_some(()),
    )
    .unwrap();
    // A process the lab does not own: the namespace's drop still stops it.
    let mut stray = a
        .command("sleep")
        .arg("600")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    drop(sleeper);
    assert!(!pid_alive(pid));
    drop(a);
    assert!(!list_netns().contains(&name));
    let status = wait::until("stray exit", REACH, Duration::from_millis(10), || {
        stray.try_wait().unwrap()
    })
    .unwrap();
    assert!(!status.success());
}

#[test]
#[ignore = "needs root and network namespaces: `cargo xtask test` runs it"]
fn everything_is_removed_when_a_test_panics() {
    let names = Mutex::new(Vec::<String>::new());
    let pids = Mutex::new(Vec::<u32>::new());
    let sockets = Mutex::new(Vec::new());
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let lab = LabNet::new().unwrap();
        let p = pair(&lab, 6);
        let sleeper =
            p.b.spawn("sleep", Command::new("sleep").arg("600"))
                .unwrap();
        let wg = WireguardGo::start(&p.a, &unique_device_name()).unwrap();
        let _cut = p.a.drop_traffic("10.213.6.2").unwrap();
        names.lock().unwrap().extend(
            [&p.a, &p.b, p.switch.netns()]
                .iter()
                .map(|ns| ns.name().to_owned()),
        );
        pids.lock().unwrap().extend([sleeper.pid(), wg.pid()]);
        sockets.lock().unwrap().push(wg.uapi_socket());
        panic!("deliberate panic with live lab objects");
    }));
    assert!(outcome.is_err());
    let names = names.into_inner().unwrap();
    assert_eq!(names.len(), 3);
    let left: Vec<String> = list_netns()
        .into_iter()
        .filter(|n| names.contains(n))
        .collect();
    assert!(left.is_empty(), "namespaces left: {left:?}");
    for pid in pids.into_inner().unwrap() {
        assert!(!pid_alive(pid), "process {pid} survived");
    }
    for socket in sockets.into_inner().unwrap() {
        assert!(!socket.exists(), "{} left", socket.display());
    }
}

#[test]
#[ignore = "needs root and network namespaces: `cargo xtask test` runs it"]
fn stale_namespaces_of_dead_processes_are_swept() {
    // A PID that has just exited (and been reaped) stands for a killed test process.
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    assert!(!Path::new(&format!("/proc/{dead}")).exists());
    let stale = format!("mw{dead}-0-x");
    let foreign = format!("mwforeign{}-x", std::process::id());
    for name in [&stale, &foreign] {
        process::run(Command::new("ip").args(["netns", "add", name])).unwrap();
    }
    let lab = LabNet::new();
    let listed = list_netns();
    // Remove the foreign one ourselves before asserting, so a failure leaves nothing behind.
    let _ = process::run(Command::new("ip").args(["netns", "del", &foreign]));
    let _lab = lab.unwrap();
    assert!(!listed.contains(&stale), "stale namespace kept");
    assert!(listed.contains(&foreign), "foreign namespace touched");
}

#[test]
#[ignore = "needs root and network namespaces: `cargo xtask test` runs it"]
fn wireguard_go_starts_answers_and_cleans_up() {
    let lab = LabNet::new().unwrap();
    let a = lab.netns("w").unwrap();
    let device = unique_device_name();
    assert!(device.len() <= 15, "{device}");
    assert_ne!(device, unique_device_name());

    let mut wg = WireguardGo::start(&a, &device).unwrap();
    assert_eq!(wg.device(), device);
    assert_eq!(wg.uapi_socket(), socket_path(&device));
    assert!(wg.uapi_socket().exists());
    let comm = std::fs::read_to_string(format!("/proc/{}/comm", wg.pid())).unwrap();
    assert_eq!(
        comm.trim(),
        "wireguard-go",
        "the PID is wireguard-go itself"
    );
    let answer = wg.uapi_get().unwrap();
    assert_eq!(uapi_errno(&answer), Some(0), "{answer}");
    // The TUN device is in the namespace, not in the root one.
    a.ip(&["link", "show", "dev", &device]).unwrap();
    assert!(process::run(Command::new("ip").args(["link", "show", "dev", &device])).is_err());
    // A bad key answers an errno, surfaced as an error.
    assert!(wg.uapi_set("private_key=zz").is_err());
    // The same name a second time is refused while the first answers.
    assert!(matches!(
        WireguardGo::start(&a, &device),
        Err(LabError::CommandFailed { .. })
    ));

    // A crash: the device vanishes, the socket stays until drop.
    let pid = wg.pid();
    wg.kill();
    assert!(!wg.is_running());
    assert!(!pid_alive(pid));
    wait_gone("the TUN device to vanish", || {
        a.ip(&["link", "show", "dev", &device]).is_err()
    });
    drop(wg);
    assert!(!socket_path(&device).exists());

    // Normal stop.
    let device = unique_device_name();
    let wg = WireguardGo::start(&a, &device).unwrap();
    let pid = wg.pid();
    drop(wg);
    assert!(!pid_alive(pid));
    assert!(!socket_path(&device).exists());
}

fn wg_keypair(ns: &Netns) -> (String, String) {
    let private = ns.run("wg", &["genkey"]).unwrap().trim().to_owned();
    let mut child = ns
        .command("wg")
        .arg("pubkey")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(private.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    (
        private,
        String::from_utf8(out.stdout).unwrap().trim().to_owned(),
    )
}

#[test]
#[ignore = "needs root and network namespaces: `cargo xtask test` runs it"]
fn wireguard_tunnel_between_two_namespaces() {
    let lab = LabNet::new().unwrap();
    let a = lab.netns("wa").unwrap();
    let b = lab.netns("wb").unwrap();
    a.veth_to("eth0", &b, "eth0").unwrap();
    a.add_addr("eth0", "10.213.7.1/30").unwrap();
    b.add_addr("eth0", "10.213.7.2/30").unwrap();
    a.wait_reachable(ip("10.213.7.2"), REACH).unwrap();

    let keys_dir = tempfile::tempdir().unwrap();
    let ends = [
        (&a, "10.213.7.1", "10.214.7.1"),
        (&b, "10.213.7.2", "10.214.7.2"),
    ];
    let mut devices = Vec::new();
    let mut keys = Vec::new();
    for (ns, _, _) in ends {
        devices.push(WireguardGo::start(ns, &unique_device_name()).unwrap());
        keys.push(wg_keypair(ns));
    }
    for (i, (ns, _, tunnel_ip)) in ends.iter().enumerate() {
        let peer = 1 - i;
        let key_file = keys_dir.path().join(format!("key{i}"));
        std::fs::write(&key_file, &keys[i].0).unwrap();
        let dev = devices[i].device();
        ns.run(
            "wg",
            &[
                "set",
                dev,
                "private-key",
                key_file.to_str().unwrap(),
                "listen-port",
                "51820",
                "peer",
                &keys[peer].1,
                "endpoint",
                &format!("{}:51820", ends[peer].1),
                "allowed-ips",
                &format!("{}/32", ends[peer].2),
            ],
        )
        .unwrap();
        ns.add_addr(dev, &format!("{tunnel_ip}/24")).unwrap();
        ns.link_up(dev).unwrap();
    }
    // 10.214.7.0/24 is routed only through the tunnel devices.
    a.wait_reachable(ip("10.214.7.2"), Duration::from_secs(20))
        .unwrap();
    b.wait_reachable(ip("10.214.7.1"), REACH).unwrap();
    let state = devices[0].uapi_get().unwrap();
    let handshake = state
        .lines()
        .find_map(|l| l.strip_prefix("last_handshake_time_sec="))
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(handshake > 0, "no handshake: {state}");
    let received = state
        .lines()
        .find_map(|l| l.strip_prefix("rx_bytes="))
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(received > 0, "nothing came through the tunnel: {state}");

    // Partition the underlay: the tunnel stops answering too.
    let cut = a.drop_traffic("10.213.7.2").unwrap();
    assert!(!a.can_reach(ip("10.214.7.2"), SHORT).unwrap());
    cut.heal().unwrap();
    a.wait_reachable(ip("10.214.7.2"), REACH).unwrap();
}
