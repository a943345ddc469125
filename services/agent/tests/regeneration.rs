//! Endpoint regeneration, which loads programs through the verifier and attaches them with
//! netlink, never stalls the rest of the agent: the real binary, real BPF programs attached in
//! lab namespaces, a real remote etcd and a real wireguard-go.
//!
//! - While 50 restored endpoints regenerate, `Status` answers within 100 ms.
//! - A WireGuard device whose UAPI calls hang (wireguard-go stopped by SIGSTOP: the agent's
//!   request waits out its 10 s I/O timeout) does not delay the regeneration of restored
//!   endpoints: their wait counts the datapath's and the identity cache's acknowledgements,
//!   not WireGuard's.

mod common;
use common::binaries::agent_binary;

use std::path::Path;
use std::time::{Duration, Instant};

use meshwork_datapath::endpoint::{EndpointSpec, EndpointStore};
use meshwork_kvstore::{EtcdBackend, EtcdConfig};
use meshwork_lab::agent::{AgentOptions, AgentProcess, write_cluster_config};
use meshwork_lab::bpffs::BpfRoot;
use meshwork_lab::cilium::{Cluster, Sizes};
use meshwork_lab::etcd::EtcdServer;
use meshwork_lab::net::{LabNet, Netns};
use meshwork_lab::wait::Wait;
use meshwork_lab::wireguard::{WireguardGo, unique_device_name};
use meshwork_proto::agent::v1 as pb;
use meshwork_proto::agent::v1::agent_client::AgentClient;
use meshwork_wireguard::key::PrivateKey;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const STATUS_BOUND: Duration = Duration::from_millis(100);

/// A node namespace with `count` pod veths (`lxc1` …), each endpoint persisted in `state`.
fn restored_endpoints(lab: &LabNet, state: &Path, count: u64) -> (Netns, Vec<Netns>) {
    let node = lab.netns("regen-node").unwrap();
    let store = EndpointStore::new(state);
    let mut pods = Vec::new();
    for id in 1..=count {
        let pod = lab.netns(&format!("regen-pod{id}")).unwrap();
        node.veth_to(&format!("lxc{id}"), &pod, "eth0").unwrap();
        store
            .save(&EndpointSpec {
                id,
                interface: format!("lxc{id}"),
                netns: Some(node.path().to_owned()),
                ips: vec![
                    format!("10.214.{}.{}", 7 + id / 200, id % 200 + 1)
                        .parse()
                        .unwrap(),
                ],
                identity: 1000 + u32::try_from(id).unwrap(),
                allowed_identities: vec![2000],
                host: false,
                labels: Vec::new(),
                pod: None,
            })
            .unwrap();
        pods.push(pod);
    }
    (node, pods)
}

async fn status(socket: &Path) -> Option<pb::StatusResponse> {
    let channel = meshwork_proto::connect_unix(socket).await.ok()?;
    let response = AgentClient::new(channel)
        .status(pb::StatusRequest {})
        .await
        .ok()?;
    Some(response.into_inner())
}

/// (endpoints, ready) as the agent reports them.
fn ready_of(status: &pb::StatusResponse) -> (u32, u32) {
    status
        .datapath
        .as_ref()
        .map_or((0, 0), |d| (d.endpoints, d.endpoints_ready))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real etcd, root, bpffs and network namespaces: `cargo xtask test` runs it"]
async fn status_answers_within_100ms_while_50_restored_endpoints_regenerate() {
    let lab = LabNet::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (_node, _pods) = restored_endpoints(&lab, &state, 50);
    let bpf = BpfRoot::new().unwrap();
    // No remote cluster: the restored endpoints regenerate right after the start.
    let options = AgentOptions::new(agent_binary(), "c1", 1, &state).bpf_root(bpf.path());
    let agent = AgentProcess::start(&options).unwrap();

    // How long each answer took that came while some endpoint still waited.
    let during = std::sync::Mutex::new(Vec::new());
    let (socket, answers) = (agent.socket(), &during);
    let done = Wait::new("every endpoint regenerated")
        .timeout(Duration::from_secs(120))
        .every(Duration::from_millis(5))
        .until_async(
            || async move {
                let asked = Instant::now();
                let ready = status(socket).await.as_ref().map(ready_of);
                if let Some((all, ready)) = ready
                    && ready < all
                {
                    answers.lock().unwrap().push(asked.elapsed());
                }
                ready
            },
            |ready| ready.is_some_and(|(all, ready)| all == 50 && ready == all),
        )
        .await;
    done.unwrap_or_else(|err| panic!("{err}; log:\n{}", agent.log_tail()));
    let during = during.into_inner().unwrap();
    assert!(
        during.len() >= 3,
        "too few answers while regenerating to say anything: {during:?}"
    );
    let slowest = during.iter().max().unwrap();
    let mut sorted = during.clone();
    sorted.sort();
    eprintln!(
        "{} answers while regenerating: median {:?}, slowest {slowest:?}",
        sorted.len(),
        sorted[sorted.len() / 2]
    );
    assert!(
        *slowest < STATUS_BOUND,
        "Status took {slowest:?} while endpoints regenerated (all: {during:?})"
    );
}

/// Remote cluster c2: identities, ipcache entries, a service, and two nodes that carry
/// WireGuard keys (so WireGuard has peers to configure once they arrive).
fn remote_c2() -> (Cluster, Vec<(String, Vec<u8>)>) {
    let cluster = Cluster {
        name: "c2".to_owned(),
        id: 2,
        sizes: Sizes {
            nodes: 0,
            services: 1,
            identities: 3,
            ipcache: 20,
        },
    };
    let mut state = cluster.state();
    for i in 0..2u8 {
        let key = PrivateKey::generate().public_key().to_base64();
        state.push(common::c2_node(
            &format!("c2-node-{i}"),
            &format!("10.213.9.{}", i + 1),
            &format!("10.214.{}", 20 + i),
            &key,
        ));
    }
    (cluster, state)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real etcd, root, bpffs and network namespaces: `cargo xtask test` runs it"]
async fn a_hung_wireguard_device_does_not_delay_endpoint_regeneration() {
    let lab = LabNet::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (node, _pods) = restored_endpoints(&lab, &state, 1);
    let device = unique_device_name();
    let mut wireguard = WireguardGo::start(&node, &device).unwrap();
    // The remote holds its state but announces nothing yet: nothing syncs before the device
    // hangs.
    let etcd = EtcdServer::start().unwrap();
    let (cluster, remote_state) = remote_c2();
    let backend =
        EtcdBackend::connect(&EtcdConfig::new([etcd.endpoint()]), Duration::from_secs(10))
            .await
            .unwrap();
    let (key, value) = cluster.config();
    backend.put(&key, value).await.unwrap();
    backend.put_many(remote_state, 100).await.unwrap();
    let config = dir.path().join("clustermesh");
    write_cluster_config(&config, "c2", &etcd.endpoint()).unwrap();
    let bpf = BpfRoot::new().unwrap();
    let options = AgentOptions::new(agent_binary(), "c1", 1, &state)
        .bpf_root(bpf.path())
        .clustermesh_config(&config)
        .flags(["--enable-wireguard", "--wireguard-device", &device])
        .env("RUST_LOG", "info");
    let agent = AgentProcess::start(&options).unwrap();
    let waiting = status(agent.socket()).await.map(|s| ready_of(&s));
    assert_eq!(waiting, Some((1, 0)), "the endpoint waits for c2");

    // Every UAPI call from now on hangs until its timeout.
    let pid = Pid::from_raw(i32::try_from(wireguard.pid()).unwrap());
    kill(pid, Signal::SIGSTOP).unwrap();
    let stopped = Instant::now();
    backend.put_many(cluster.canaries(), 100).await.unwrap();

    let regenerated = Wait::new("the endpoint to regenerate while WireGuard hangs")
        .timeout(Duration::from_secs(30))
        .until_async(
            || async { status(agent.socket()).await.map(|s| ready_of(&s)) },
            |ready| *ready == Some((1, 1)),
        )
        .await;
    let regenerated_after = stopped.elapsed();
    // The hang is real: the agent's request to the device times out (10 s) while the device
    // is stopped.
    let hung = Wait::new("the agent's WireGuard request to time out")
        .timeout(Duration::from_secs(30))
        .until(
            || std::fs::read_to_string(agent.log()).unwrap_or_default(),
            |log| log.contains("WireGuard device request failed"),
        );
    kill(pid, Signal::SIGCONT).unwrap();
    regenerated.unwrap_or_else(|err| panic!("{err}; log:\n{}", agent.log_tail()));
    hung.unwrap_or_else(|err| panic!("{err}"));
    eprintln!("regenerated {regenerated_after:?} after the device hung");
    assert!(
        regenerated_after < Duration::from_secs(10),
        "the endpoint regenerated {regenerated_after:?} after the device hung, not before the \
         device's 10 s timeout"
    );
    assert!(wireguard.is_running());
}
