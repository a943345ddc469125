//! The plugin run by a CNI runtime no one here wrote: Debian's podman with its CNI backend
//! reads a conflist naming `meshwork-cni` and calls it for `podman run` (ADD) and `podman rm`
//! (DEL), exactly as a kubelet's runtime would. The agent runs `--ipam cluster-pool`; podman
//! and the pods' host ends live in a lab namespace playing the node.

use std::path::Path;

use meshwork_lab::agent::{AgentOptions, AgentProcess};
use meshwork_lab::bpffs::BpfRoot;
use meshwork_lab::net::{LabNet, command_in};
use meshwork_lab::podman::Podman;
use meshwork_proto::agent::v1 as pb;
use meshwork_proto::agent::v1::datapath_client::DatapathClient;
use meshwork_proto::agent::v1::ipam_client::IpamClient;
use serde_json::{Value, json};

/// The node's pod CIDR, in the lab's guarded pod range.
const POD_CIDR: &str = "10.214.9.0/24";

fn plugin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_meshwork-cni"))
}

fn agent_binary() -> std::path::PathBuf {
    let path = plugin().with_file_name("meshwork-agent");
    assert!(
        path.exists(),
        "{} is missing: build the workspace (cargo build --workspace) before this test",
        path.display()
    );
    path
}

/// The IPv4 addresses in the namespace at `netns` on `dev`, read with iproute2.
fn addresses(netns: &Path, dev: &str) -> Vec<String> {
    let out = command_in(netns, "ip")
        .args(["-j", "-4", "addr", "show", "dev", dev])
        .output()
        .expect("ip addr");
    let links: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    links
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|link| link["addr_info"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| {
            Some(format!(
                "{}/{}",
                a["local"].as_str()?,
                a["prefixlen"].as_u64()?
            ))
        })
        .collect()
}

async fn allocations(socket: &Path) -> Vec<pb::IpAllocation> {
    let channel = meshwork_proto::connect_unix(socket).await.expect("socket");
    IpamClient::new(channel)
        .status(pb::IpamStatusRequest {})
        .await
        .expect("Ipam/Status")
        .into_inner()
        .allocations
}

async fn endpoints(socket: &Path) -> Vec<pb::EndpointStatus> {
    let channel = meshwork_proto::connect_unix(socket).await.expect("socket");
    DatapathClient::new(channel)
        .list_endpoints(pb::ListEndpointsRequest {})
        .await
        .expect("Datapath/ListEndpoints")
        .into_inner()
        .endpoints
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, bpffs, network namespaces and podman: `cargo xtask test` runs it"]
async fn podman_runs_the_plugin_from_a_conflist_for_run_and_rm() {
    let lab = LabNet::new().expect("lab network");
    let node = lab.netns("podman-node").expect("node namespace");
    let bpf = BpfRoot::new().expect("bpffs");
    let dir = tempfile::tempdir().expect("temp dir");
    let options = AgentOptions::new(&agent_binary(), "c1", 1, &dir.path().join("state"))
        .bpf_root(bpf.path())
        .flags([
            "--node-name",
            "n1",
            "--ipam",
            "cluster-pool",
            "--ipv4-alloc-cidr",
            POD_CIDR,
        ]);
    let agent = AgentProcess::start(&options).expect("start the agent");
    let socket = agent.socket().to_owned();

    let mut podman = Podman::new(&[plugin().parent().expect("bin dir")]).expect("podman");
    podman
        .add_network(
            "meshwork",
            &json!({
                "cniVersion": "1.0.0",
                "name": "meshwork",
                "plugins": [{
                    "type": "meshwork-cni",
                    "agent-socket": socket,
                    "host-netns": node.path(),
                    "identity": 2000,
                }],
            }),
        )
        .expect("conflist");

    let web = podman
        .run(&node, "meshwork", "web")
        .unwrap_or_else(|err| panic!("podman run: {err}; agent log:\n{}", agent.log_tail()));
    let db = podman.run(&node, "meshwork", "db").expect("podman run db");

    // Each container's eth0 has the address the agent handed to its owner.
    let held = allocations(&socket).await;
    for container in [&web, &db] {
        let owner = format!("{}/eth0", container.id);
        let allocation = held
            .iter()
            .find(|a| a.owner == owner)
            .unwrap_or_else(|| panic!("no allocation for {owner}: {held:?}"));
        assert_eq!(
            addresses(&container.netns, "eth0"),
            [format!("{}/24", allocation.ip)],
            "{}'s eth0",
            container.id
        );
    }
    let ips: Vec<&str> = held.iter().map(|a| a.ip.as_str()).collect();
    let unique: std::collections::BTreeSet<&str> = ips.iter().copied().collect();
    assert_eq!(
        unique.len(),
        ips.len(),
        "an address handed out twice: {held:?}"
    );
    // Both endpoints are registered and their programs attached.
    let listed = endpoints(&socket).await;
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(listed.iter().all(|e| e.state == "ready"), "{listed:?}");

    // podman rm runs DEL: the address goes back and the endpoint is gone.
    podman.remove(&node, &web.id).expect("podman rm");
    let held = allocations(&socket).await;
    assert!(
        !held.iter().any(|a| a.owner.starts_with(&web.id)),
        "web's address outlived it: {held:?}"
    );
    assert!(held.iter().any(|a| a.owner.starts_with(&db.id)), "{held:?}");
    assert_eq!(endpoints(&socket).await.len(), 1);
    podman.remove(&node, &db.id).expect("podman rm db");
    assert!(endpoints(&socket).await.is_empty());
}
