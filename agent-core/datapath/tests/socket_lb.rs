//! Socket-LB against the real kernel: the four cgroup programs attached to a child cgroup the
//! test made, a real process in it (and in a test namespace) connecting to a global service's
//! VIP, with the lb4 maps programmed from remote events as the agent programs them, and the
//! programs' counters (translations by hook, refusals) counting exactly what they did.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;

use meshwork_datapath::maps::PinDir;
use meshwork_datapath::remote_maps::RemoteMaps;
use meshwork_datapath::socket_lb;
use meshwork_datapath::socket_lb_stats::{self, SocketLbHook, SocketLbStats};
use meshwork_lab::bpffs::BpfRoot;
use meshwork_lab::cgroup::ChildCgroup;
use meshwork_lab::net::{LabNet, Netns};
use meshwork_lab::wait::eventually;
use meshwork_types::{Change, ClusterService, L4Addr, L4Type, RemoteEvent};
use serde_json::Value;

/// Both backends (TCP 8080, UDP 5353) serve in the namespace itself, on loopback; the client
/// opens `n` TCP connections to the VIP, sends one UDP datagram to it, and connects to the
/// frontend without backends. One JSON line of what it saw.
const CLIENT: &str = r#"
import errno, json, socket, sys, threading
vip, empty, n, backends = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split(",")

def serve_tcp(s, me):
    while True:
        c, _ = s.accept()
        c.sendall(me.encode())
        c.close()

def serve_udp(s, me):
    while True:
        _, peer = s.recvfrom(64)
        s.sendto(me.encode(), peer)

for b in backends:
    t = socket.socket()
    t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    t.bind((b, 8080))
    t.listen(64)
    threading.Thread(target=serve_tcp, args=(t, b), daemon=True).start()
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind((b, 5353))
    threading.Thread(target=serve_udp, args=(u, b), daemon=True).start()

def fail(e):
    return {"error": errno.errorcode.get(e.errno, str(e))}

out = {"tcp": [], "udp": None, "empty": None}
for _ in range(n):
    try:
        c = socket.create_connection((vip, 80), timeout=2)
        out["tcp"].append({"backend": c.recv(64).decode(), "peer": "%s:%d" % c.getpeername()})
        c.close()
    except OSError as e:
        out["tcp"].append(fail(e))
try:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(2)
    u.sendto(b"?", (vip, 53))
    data, source = u.recvfrom(64)
    out["udp"] = {"backend": data.decode(), "source": "%s:%d" % source}
except OSError as e:
    out["udp"] = fail(e)
try:
    socket.create_connection((empty, 81), timeout=2)
    out["empty"] = {"connected": True}
except OSError as e:
    out["empty"] = fail(e)
print(json.dumps(out))
"#;

const VIP: &str = "172.20.0.1";
const EMPTY_VIP: &str = "172.20.0.2";
const BACKENDS: [&str; 2] = ["127.0.0.2", "127.0.0.3"];
const CONNECTIONS: usize = 20;

fn ports(tcp: u16, udp: u16) -> BTreeMap<String, L4Addr> {
    BTreeMap::from([
        (
            "http".to_owned(),
            L4Addr {
                protocol: L4Type::Tcp,
                port: tcp,
            },
        ),
        (
            "dns".to_owned(),
            L4Addr {
                protocol: L4Type::Udp,
                port: udp,
            },
        ),
    ])
}

/// Cluster b's global services: `web` with both backends, `empty` with none.
fn services() -> Vec<RemoteEvent> {
    let web = ClusterService {
        cluster: "b".to_owned(),
        namespace: "default".to_owned(),
        name: "web".to_owned(),
        frontends: BTreeMap::from([(VIP.to_owned(), ports(80, 53))]),
        backends: BACKENDS
            .iter()
            .map(|b| ((*b).to_owned(), ports(8080, 5353)))
            .collect(),
        shared: true,
        cluster_id: 2,
        ..ClusterService::default()
    };
    let empty = ClusterService {
        name: "empty".to_owned(),
        frontends: BTreeMap::from([(EMPTY_VIP.to_owned(), ports(81, 54))]),
        backends: BTreeMap::new(),
        ..web.clone()
    };
    [web, empty]
        .into_iter()
        .map(|s| RemoteEvent::Service {
            change: Change::Upsert(Arc::new(s)),
        })
        .collect()
}

/// Runs the client in `netns`, as a process of `cgroup`; what it printed.
fn client(netns: &Netns, cgroup: &ChildCgroup) -> Value {
    let python = meshwork_lab::paths::find_program("python3").unwrap();
    let mut inner = netns.command(python);
    inner.args([
        "-c",
        CLIENT,
        VIP,
        EMPTY_VIP,
        &CONNECTIONS.to_string(),
        &BACKENDS.join(","),
    ]);
    let out = cgroup.wrap(&inner).output().unwrap();
    assert!(
        out.status.success(),
        "client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Every connection reached a backend and read the VIP back as its peer; both backends served;
/// the UDP reply came from the VIP; the frontend without backends refused.
fn assert_translated(seen: &Value) {
    let tcp = seen["tcp"].as_array().unwrap();
    assert_eq!(tcp.len(), CONNECTIONS, "{seen}");
    let mut served = std::collections::BTreeSet::new();
    for connection in tcp {
        let backend = connection["backend"].as_str().unwrap_or_default();
        assert!(BACKENDS.contains(&backend), "{connection} in {seen}");
        assert_eq!(connection["peer"], format!("{VIP}:80"), "{seen}");
        served.insert(backend.to_owned());
    }
    // Random per connection: 20 on one backend of two is a 2-in-a-million chance.
    assert_eq!(served.len(), BACKENDS.len(), "{seen}");
    let udp = &seen["udp"];
    assert!(
        BACKENDS.contains(&udp["backend"].as_str().unwrap_or_default()),
        "{seen}"
    );
    assert_eq!(udp["source"], format!("{VIP}:53"), "{seen}");
    assert_eq!(seen["empty"]["error"], "EHOSTUNREACH", "{seen}");
}

/// The counters after `runs` runs of the client through the programs: per run, one connect
/// and one getpeername per TCP connection, one sendmsg and one recvmsg for the datagram, and
/// one refusal (the frontend without backends). A socket the programs leave alone (the
/// backends' own, a destination that is no frontend) counts nothing.
fn counted_after(runs: u64) -> SocketLbStats {
    let connections = CONNECTIONS as u64;
    SocketLbStats {
        translations: vec![
            (SocketLbHook::Connect4, connections * runs),
            (SocketLbHook::Sendmsg4, runs),
            (SocketLbHook::Recvmsg4, runs),
            (SocketLbHook::Getpeername4, connections * runs),
        ],
        refusals: runs,
    }
}

/// The programs attached to `cgroup` (`bpftool cgroup show`), by attach type.
fn attached(cgroup: &ChildCgroup) -> Vec<String> {
    let out = Command::new(meshwork_lab::paths::find_program("bpftool").unwrap())
        .args(["-j", "cgroup", "show"])
        .arg(cgroup.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Nothing attached: bpftool prints an empty line, not `[]`.
    let text = String::from_utf8(out.stdout).unwrap();
    let programs: Vec<Value> = if text.trim().is_empty() {
        Vec::new()
    } else {
        serde_json::from_str(&text).unwrap()
    };
    let mut types: Vec<String> = programs
        .iter()
        .map(|p| p["attach_type"].as_str().unwrap_or_default().to_owned())
        .collect();
    types.sort();
    types
}

#[test]
#[ignore = "needs root, bpffs, cgroup2 and netns: `cargo xtask test` runs it"]
fn a_global_service_is_translated_at_connect_and_read_back_as_the_vip() {
    let root = BpfRoot::new().unwrap();
    let pins = PinDir::under(root.path());
    drop(pins.recreate_ipcache().unwrap());
    let mut lb = RemoteMaps::open(&pins).unwrap();
    lb.apply(&Arc::from("b"), &services());
    let net = LabNet::new().unwrap();
    let netns = net.netns("sock-lb").unwrap();
    let links = socket_lb::links_dir(root.path());

    // Negative control: the same client in a cgroup without the programs reaches no VIP
    // (the namespace has no route to it).
    let bare = ChildCgroup::create("sock-lb-bare").unwrap();
    let seen = client(&netns, &bare);
    assert!(
        seen["tcp"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["error"] == "ENETUNREACH"),
        "{seen}"
    );
    // The counters exist (the endpoint object made them with the ipcache) and count nothing.
    assert_eq!(socket_lb_stats::read(&pins).unwrap(), counted_after(0));

    let cgroup = ChildCgroup::create("sock-lb").unwrap();
    let first = socket_lb::attach(&pins, &links, cgroup.path()).unwrap();
    assert_eq!(first.replaced, 0);
    // The loader is gone: the pinned links alone keep the programs attached.
    assert_translated(&client(&netns, &cgroup));
    assert_eq!(socket_lb_stats::read(&pins).unwrap(), counted_after(1));
    // libbpf's names, as bpftool prints them.
    let four = [
        "cgroup_inet4_connect",
        "cgroup_inet4_getpeername",
        "cgroup_udp4_recvmsg",
        "cgroup_udp4_sendmsg",
    ];
    assert_eq!(attached(&cgroup), four);
    // The programs stay inside their cgroup: the one beside it is untouched.
    assert!(attached(&bare).is_empty());
    let seen = client(&netns, &bare);
    assert_eq!(seen["tcp"][0]["error"], "ENETUNREACH", "{seen}");
    assert_eq!(socket_lb_stats::read(&pins).unwrap(), counted_after(1));

    // A restarted agent replaces the links: still one program per hook, still translating.
    let again = socket_lb::attach(&pins, &links, cgroup.path()).unwrap();
    assert_eq!(again.replaced, 4);
    assert_eq!(socket_lb::pinned(&links), socket_lb::PROGRAMS);
    // The replaced links go once the kernel frees their pins' inodes (after an RCU period).
    eventually(
        "the replaced links to detach",
        || attached(&cgroup),
        |t| *t == four,
    );
    assert_translated(&client(&netns, &cgroup));
    // The new programs count on where the old ones stopped: the counters are pinned.
    assert_eq!(socket_lb_stats::read(&pins).unwrap(), counted_after(2));

    // Detached: the programs stop with their pins.
    assert_eq!(socket_lb::detach(&links).unwrap(), 4);
    eventually(
        "the programs to detach",
        || attached(&cgroup),
        Vec::is_empty,
    );
    let seen = client(&netns, &cgroup);
    assert_eq!(seen["tcp"][0]["error"], "ENETUNREACH", "{seen}");
    assert_eq!(socket_lb_stats::read(&pins).unwrap(), counted_after(2));
}
