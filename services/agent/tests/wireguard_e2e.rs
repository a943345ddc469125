//! WireGuard end to end: the real agent and meshctl binaries, real wireguard-go devices in lab
//! network namespaces (unique device names), real etcd for the remote cluster.
//!
//! Topology: namespaces `a` (the agent's node, cluster c1) and `b` (node `n1` of cluster
//! c2) on a switch, 10.213.0.1 and 10.213.0.2; pod ranges 10.214.1.0/24 and 10.214.2.0/24
//! routed over the WireGuard devices. The agent runs in the root namespace and talks to its
//! device only through the UAPI socket; nothing in the root namespace connects to a lab
//! address.

use std::net::{IpAddr, UdpSocket};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use meshwork_kvstore::{EtcdBackend, EtcdConfig};
use meshwork_lab::agent::{AgentOptions, AgentProcess, write_cluster_config};
use meshwork_lab::cilium::{Cluster, Sizes};
use meshwork_lab::etcd::EtcdServer;
use meshwork_lab::net::{LabNet, Netns};
use meshwork_lab::wait;
use meshwork_lab::wireguard::{WireguardGo, netns_wrapper, unique_device_name};
use meshwork_wireguard::key::{Key, PrivateKey};
use serde_json::{Value, json};

mod common;
use common::binaries::{agent_binary, meshctl};

use common::{c2_node, prometheus};

const NODES: &str = "cilium/state/nodes/v1/c2";

fn block_on<T>(f: impl Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn etcd_put(server: &EtcdServer, pairs: Vec<(String, Vec<u8>)>) {
    block_on(async {
        let backend = EtcdBackend::connect(
            &EtcdConfig::new([server.endpoint()]),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        backend.put_many(pairs, 100).await.unwrap();
    });
}

fn etcd_delete(server: &EtcdServer, key: &str) {
    block_on(async {
        let backend = EtcdBackend::connect(
            &EtcdConfig::new([server.endpoint()]),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        assert!(backend.delete(key).await.unwrap());
    });
}

/// The remote cluster c2: its config, the given nodes, and its sync canaries.
fn remote_cluster(nodes: Vec<(String, Vec<u8>)>) -> EtcdServer {
    let server = EtcdServer::start().unwrap();
    let cluster = Cluster {
        name: "c2".into(),
        id: 2,
        sizes: Sizes {
            nodes: 0,
            services: 0,
            identities: 0,
            ipcache: 0,
        },
    };
    let mut pairs = vec![cluster.config()];
    pairs.extend(nodes);
    pairs.extend(cluster.canaries());
    etcd_put(&server, pairs);
    server
}

struct Agent {
    dir: tempfile::TempDir,
    process: Option<AgentProcess>,
    /// The metrics port on 127.0.0.1, if any.
    metrics_port: Option<u16>,
}

impl Agent {
    fn start(etcd: &EtcdServer, extra: &[&str]) -> Self {
        Self::start_with_metrics(etcd, None, extra)
    }

    /// Also serves metrics on 127.0.0.1:`metrics_port`.
    fn start_with_metrics(etcd: &EtcdServer, metrics_port: Option<u16>, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        write_cluster_config(&dir.path().join("clustermesh"), "c2", &etcd.endpoint()).unwrap();
        let mut agent = Self {
            dir,
            process: None,
            metrics_port,
        };
        agent.spawn(extra);
        agent
    }

    fn spawn(&mut self, extra: &[&str]) {
        let mut options = AgentOptions::new(agent_binary(), "c1", 1, self.dir.path())
            .clustermesh_config(&self.dir.path().join("clustermesh"))
            // WireGuard alone: no BPF maps pinned in the host's bpffs.
            .flags(["--clustermesh-sync-timeout", "30s", "--enable-wireguard"])
            .flags(extra.iter().copied());
        if let Some(port) = self.metrics_port {
            options = options.metrics_port(port);
        }
        self.process = Some(AgentProcess::start(&options).unwrap());
    }

    fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.stop(Duration::from_secs(10));
        }
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("agent.sock")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }

    /// `meshctl encrypt status --json`, once the agent answers.
    fn status(&self) -> Option<Value> {
        let output = Command::new(meshctl())
            .arg("--socket")
            .arg(self.socket())
            .args(["encrypt", "status", "--json"])
            .output()
            .unwrap();
        output
            .status
            .success()
            .then(|| serde_json::from_slice(&output.stdout).unwrap())
    }

    /// Remote cluster `name` as `meshctl status --json` shows it, once the agent answers.
    fn mesh_cluster(&self, name: &str) -> Option<Value> {
        let output = Command::new(meshctl())
            .arg("--socket")
            .arg(self.socket())
            .args(["status", "--json"])
            .output()
            .unwrap();
        if !output.status.success() {
            return None;
        }
        let status: Value = serde_json::from_slice(&output.stdout).unwrap();
        status["clustermesh"]["clusters"]
            .as_array()?
            .iter()
            .find(|c| c["name"] == name)
            .cloned()
    }

    /// Waits (60 s at most) until remote cluster c2's status satisfies `check`.
    fn until_mesh(&self, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        wait::until(
            what,
            Duration::from_secs(60),
            Duration::from_millis(100),
            || self.mesh_cluster("c2").filter(|c| check(c)),
        )
        .unwrap_or_else(|err| {
            panic!(
                "{err}: last c2 status {:?}\nagent log:\n{}",
                self.mesh_cluster("c2"),
                self.log()
            )
        })
    }

    /// Waits (60 s at most) until the status satisfies `check`.
    fn until(&self, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        let found = wait::until(
            what,
            Duration::from_secs(60),
            Duration::from_millis(100),
            || self.status().filter(|s| check(s)),
        );
        found.unwrap_or_else(|err| {
            panic!(
                "{err}: last status {:?}\nagent log:\n{}",
                self.status(),
                self.log()
            )
        })
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}

fn peer_keys(status: &Value) -> Vec<String> {
    let mut keys: Vec<String> = status["peers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["public_key"].as_str().unwrap().to_owned())
        .collect();
    keys.sort();
    keys
}

/// What the restored peers still pending GC wait for.
fn pending_waits(status: &Value) -> Vec<String> {
    status["pending_gc"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["wait"].as_str().unwrap().to_owned())
        .collect()
}

/// The device's peers with their endpoints and allowed IPs, as wireguard-go reports them
/// (handshake times and byte counters left out: they move with traffic).
fn device_peers(wg: &WireguardGo) -> Vec<String> {
    let mut peers: Vec<String> = Vec::new();
    for line in wg.uapi_get().unwrap().lines() {
        if line.starts_with("public_key=") {
            peers.push(line.to_owned());
        } else if line.starts_with("endpoint=") || line.starts_with("allowed_ip=") {
            let peer = peers.last_mut().expect("a peer line first");
            peer.push(' ');
            peer.push_str(line);
        }
    }
    peers.sort();
    peers
}

fn sorted(mut keys: Vec<String>) -> Vec<String> {
    keys.sort();
    keys
}

/// Brings a node's WireGuard device up with its pod IP, routing the other pod range over it.
fn plumb(ns: &Netns, device: &str, pod_ip: &str, remote_pods: &str) {
    ns.add_addr(device, &format!("{pod_ip}/32")).unwrap();
    ns.link_up(device).unwrap();
    ns.add_route_dev(remote_pods, device).unwrap();
}

#[test]
#[ignore = "needs real etcd, network namespaces and wireguard-go: `cargo xtask test` runs it"]
fn tunnel_survives_an_agent_restart_during_a_partition_and_gc_removes_only_the_deleted_node() {
    let lab = LabNet::new().unwrap();
    let switch = lab.switch("sw").unwrap();
    let a = lab.netns("a").unwrap();
    let b = lab.netns("b").unwrap();
    switch.connect(&a, "eth0", "10.213.0.1/24").unwrap();
    switch.connect(&b, "eth0", "10.213.0.2/24").unwrap();
    let dev_a = unique_device_name();
    let wg_a = WireguardGo::start(&a, &dev_a).unwrap();
    let wg_b = WireguardGo::start(&b, &unique_device_name()).unwrap();

    let key_b = PrivateKey::generate();
    let gone_key = PrivateKey::generate().public_key().to_base64();
    let mut etcd = remote_cluster(vec![
        c2_node(
            "n1",
            "10.213.0.2",
            "10.214.2",
            &key_b.public_key().to_base64(),
        ),
        c2_node("n2", "10.213.0.3", "10.214.3", &gone_key),
    ]);
    let mut agent = Agent::start(&etcd, &["--wireguard-device", &dev_a]);
    let status = agent.until("two peers", |s| {
        s["peers"].as_array().is_some_and(|p| p.len() == 2)
    });
    assert_eq!(status["listen_port"], 51871);
    // The agent's own node object carries its public key, as other clusters will read it.
    assert_eq!(
        status["local_node"]["WireguardPubKey"],
        status["public_key"]
    );
    assert_eq!(status["local_node"]["Cluster"], "c1");
    let pub_a = Key::from_base64(status["public_key"].as_str().unwrap()).unwrap();
    let n1 = status["peers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["node"] == "c2/n1")
        .unwrap()
        .clone();
    assert_eq!(n1["endpoint"], "10.213.0.2:51871");
    assert_eq!(n1["allowed_ips"], json!(["10.214.2.0/24"]));

    // Node b's side, configured by hand: the peer of the agent's node.
    wg_b.uapi_set(&format!(
        "private_key={}\nlisten_port=51871\npublic_key={}\nendpoint=10.213.0.1:51871\nallowed_ip=10.214.1.0/24",
        key_b.secret().to_hex(),
        pub_a.to_hex()
    ))
    .unwrap();
    plumb(&a, &dev_a, "10.214.1.1", "10.214.2.0/24");
    plumb(&b, wg_b.device(), "10.214.2.1", "10.214.1.0/24");
    let pod_b: IpAddr = "10.214.2.1".parse().unwrap();
    a.wait_reachable(pod_b, Duration::from_secs(20)).unwrap();

    // A UDP echo stream through the tunnel from before the restart until after the heal.
    let stream = EchoStream::start(&a, &b);
    stream.wait_echoed(5);
    let device_at_stop = device_peers(&wg_a);
    assert_eq!(device_at_stop.len(), 2);

    agent.stop();
    etcd_delete(&etcd, &format!("{NODES}/n2"));
    etcd.stop(); // the remote cluster is partitioned away
    agent.spawn(&["--wireguard-device", &dev_a]);
    let restarted = agent.until("the restarted agent", |s| s["device_up"] == true);
    let both = sorted(vec![key_b.public_key().to_base64(), gone_key]);
    assert_eq!(
        peer_keys(&restarted),
        both,
        "restored peers stay while the remote is unreachable"
    );

    // The partition outlives the restart: the agent reports c2's connection failing, and
    // for 3 s from then the peers, their allowed IPs and the stream stay untouched.
    let failing = agent.until_mesh("c2 reported failing", |c2| {
        c2["connected"] == false && c2["ready"] == false && c2["failures"].as_u64() >= Some(1)
    });
    let since = Instant::now();
    let (sent_before, lost_before) = (stream.sent(), stream.lost());
    let device_before = device_peers(&wg_a);
    assert_eq!(
        device_before, device_at_stop,
        "the restart changed the device"
    );
    let mut polls = 0;
    wait::until(
        "3 s of partition with the agent up",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            let c2 = agent.mesh_cluster("c2").expect("the agent answers");
            assert_eq!(c2["ready"], false, "c2 during the partition: {c2}");
            let status = agent.status().expect("the agent answers");
            assert_eq!(peer_keys(&status), both, "peers during the partition");
            assert_eq!(pending_waits(&status), ["NodesSynced", "NodesSynced"]);
            assert_eq!(device_peers(&wg_a), device_before, "the device was changed");
            polls += 1;
            (since.elapsed() >= Duration::from_secs(3)).then_some(())
        },
    )
    .unwrap();
    assert!(polls >= 10, "the window was watched ({polls} polls)");
    let c2 = agent.mesh_cluster("c2").unwrap();
    assert_eq!(
        c2["connected"], false,
        "still partitioned after the window: {c2}"
    );
    assert!(
        c2["failures"].as_u64() >= failing["failures"].as_u64(),
        "{c2}"
    );
    assert_eq!(
        stream.lost(),
        lost_before,
        "datagrams lost during the partition"
    );
    assert!(
        stream.sent() >= sent_before + 20,
        "the stream ran through the window ({} → {})",
        sent_before,
        stream.sent()
    );
    etcd.restart().unwrap();

    let synced = agent.until("the deleted node's peer removed", |s| {
        s["peers"].as_array().is_some_and(|p| p.len() == 1)
            && s["pending_gc"].as_array().is_some_and(Vec::is_empty)
    });
    assert_eq!(peer_keys(&synced), vec![key_b.public_key().to_base64()]);
    assert_eq!(synced["peers"][0]["node"], "c2/n1");
    assert_eq!(
        synced["peers"][0]["allowed_ips"],
        json!(["10.214.2.0/24"]),
        "n1's peer kept its allowed IPs"
    );

    // A few more echoes after the heal, then the whole stream must have come back.
    let after_heal = stream.echoed();
    stream.wait_echoed(after_heal + 5);
    let (sent, echoed) = stream.stop();
    assert!(
        sent >= 40,
        "the stream ran through the restart ({sent} sent)"
    );
    assert_eq!(echoed, sent, "the stream through the tunnel lost datagrams");
    assert!(synced["peers"][0]["rx_bytes"].as_u64().unwrap() > 0);
    a.wait_reachable(pod_b, Duration::from_secs(5)).unwrap();
}

#[test]
#[ignore = "needs real etcd, network namespaces and wireguard-go: `cargo xtask test` runs it"]
fn duplicate_and_malformed_keys_are_rejected_and_a_vanished_fallback_device_is_recreated() {
    let lab = LabNet::new().unwrap();
    let a = lab.netns("a").unwrap();
    let dev_a = unique_device_name();
    // The agent's fallback runs wireguard-go inside the node namespace, never in the root one.
    let bin_dir = tempfile::tempdir().unwrap();
    let wrapper = netns_wrapper(&a, bin_dir.path()).unwrap();

    let key1 = PrivateKey::generate().public_key().to_base64();
    let key3 = PrivateKey::generate().public_key().to_base64();
    let etcd = remote_cluster(vec![
        c2_node("n1", "10.213.0.2", "10.214.2", &key1),
        c2_node("n2", "10.213.0.3", "10.214.3", &key1), // duplicate of n1's
        c2_node("n3", "10.213.0.4", "10.214.4", "bm90IGEga2V5"), // base64, not 32 bytes
        c2_node("n4", "10.213.0.5", "10.214.5", &key3),
    ]);
    let metrics_port = wait::free_port().unwrap();
    let mut agent = Agent::start_with_metrics(
        &etcd,
        Some(metrics_port),
        &[
            "--wireguard-device",
            &dev_a,
            "--wireguard-userspace-fallback",
            "--wireguard-userspace-bin",
            wrapper.to_str().unwrap(),
        ],
    );
    let status = agent.until("two peers and two rejections", |s| {
        s["peers"].as_array().is_some_and(|p| p.len() == 2)
            && s["rejected_duplicate_keys"] == 1
            && s["rejected_malformed_keys"] == 1
    });
    assert_eq!(peer_keys(&status), sorted(vec![key1.clone(), key3.clone()]));
    let owner = |s: &Value, key: &str| {
        s["peers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["public_key"] == key)
            .unwrap()["node"]
            .clone()
    };
    assert_eq!(
        owner(&status, &key1),
        "c2/n1",
        "the first node keeps the key"
    );
    assert!(agent.log().contains("detected duplicate public key"));
    let expected = [
        r#"meshwork_wireguard_rejected_peers_total{reason="duplicate_key"} 1"#,
        r#"meshwork_wireguard_rejected_peers_total{reason="malformed_key"} 1"#,
        "meshwork_wireguard_peers 2",
        "meshwork_wireguard_restored_peers_pending_gc 0",
    ];
    let metrics = wait::until(
        "the WireGuard metrics",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || prometheus::scrape(metrics_port).filter(|m| expected.iter().all(|l| m.contains(l))),
    )
    .unwrap_or_else(|err| panic!("{err}: {:?}", prometheus::scrape(metrics_port)));
    prometheus::assert_promtool_clean(&metrics);
    let pid = status["userspace_pid"].as_u64().unwrap();
    assert!(pid > 0);
    assert!(
        a.pids().contains(&i32::try_from(pid).unwrap()),
        "wireguard-go runs inside the lab namespace"
    );

    // The device vanishes (wireguard-go crashes): the agent starts a new one and configures it.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let recreated = agent.until("the device recreated", |s| {
        s["device_recreations"].as_u64() >= Some(1)
            && s["userspace_pid"]
                .as_u64()
                .is_some_and(|p| p != 0 && p != pid)
            && s["peers"].as_array().is_some_and(|p| p.len() == 2)
    });
    assert_eq!(peer_keys(&recreated), sorted(vec![key1, key3]));
    assert_eq!(recreated["listen_port"], 51871);
    let new_pid = recreated["userspace_pid"].as_u64().unwrap();
    assert!(a.pids().contains(&i32::try_from(new_pid).unwrap()));
    agent.stop();
    // The device outlives the agent (reused by the next one); this test ends it by PID.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(new_pid).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
}

/// Numbered UDP datagrams from pod a (10.214.1.1) to an echo server on pod b (10.214.2.1),
/// one per 100 ms until stopped (bounded: 600 at most), each awaited for at most 1 s.
struct EchoStream {
    sent: Arc<AtomicU32>,
    echoed: Arc<AtomicU32>,
    done: Arc<AtomicBool>,
    client: Option<std::thread::JoinHandle<()>>,
    echo: Option<std::thread::JoinHandle<()>>,
}

impl EchoStream {
    const MAX: u32 = 600;

    fn start(a: &Netns, b: &Netns) -> Self {
        let server = b
            .enter(|| UdpSocket::bind("10.214.2.1:7000"))
            .unwrap()
            .unwrap();
        let client = a
            .enter(|| UdpSocket::bind("10.214.1.1:0"))
            .unwrap()
            .unwrap();
        client.connect("10.214.2.1:7000").unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        server
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU32::new(0));
        let echoed = Arc::new(AtomicU32::new(0));
        let server_done = Arc::clone(&done);
        let echo = std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while !server_done.load(Ordering::Relaxed) {
                if let Ok((n, from)) = server.recv_from(&mut buf) {
                    let _ = server.send_to(&buf[..n], from);
                }
            }
        });
        let (client_done, client_sent, client_echoed) =
            (Arc::clone(&done), Arc::clone(&sent), Arc::clone(&echoed));
        let client = std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            for seq in 0..Self::MAX {
                if client_done.load(Ordering::Relaxed) {
                    break;
                }
                client.send(&seq.to_be_bytes()).unwrap();
                // Late echoes of earlier datagrams are skipped; this one counts if it comes.
                let mut got = false;
                while let Ok(n) = client.recv(&mut buf) {
                    if n == 4 && buf[..4] == seq.to_be_bytes() {
                        got = true;
                        break;
                    }
                }
                // Counted together so that sent - echoed is the loss at any time.
                if got {
                    client_echoed.fetch_add(1, Ordering::SeqCst);
                }
                client_sent.fetch_add(1, Ordering::SeqCst);
                // Pacing of the traffic, not synchronisation.
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Self {
            sent,
            echoed,
            done,
            client: Some(client),
            echo: Some(echo),
        }
    }

    fn sent(&self) -> u32 {
        self.sent.load(Ordering::SeqCst)
    }

    fn echoed(&self) -> u32 {
        self.echoed.load(Ordering::SeqCst)
    }

    /// Datagrams whose echo never came (so far).
    fn lost(&self) -> u32 {
        // echoed is bumped before sent: read it second so a datagram in between is not lost.
        let sent = self.sent();
        sent - self.echoed().min(sent)
    }

    /// Waits (20 s at most) until `count` datagrams have come back.
    fn wait_echoed(&self, count: u32) {
        wait::until(
            "echoes through the tunnel",
            Duration::from_secs(20),
            Duration::from_millis(50),
            || (self.echoed() >= count).then_some(()),
        )
        .unwrap();
    }

    /// Stops the stream; returns (sent, echoed).
    fn stop(mut self) -> (u32, u32) {
        self.done.store(true, Ordering::Relaxed);
        for thread in [self.client.take(), self.echo.take()].into_iter().flatten() {
            thread.join().unwrap();
        }
        (self.sent(), self.echoed())
    }
}

impl Drop for EchoStream {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}
