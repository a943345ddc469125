//! The checks' pods: pod A on cluster-1's first node (cluster-pool), pod B on cluster-2's
//! first node (ENI), each added through `meshwork-cni` with the CNI protocol; B's address
//! checked against EC2; then each allowed to reach the other's identity.

use anyhow::{Context as _, ensure};

use crate::dev::compose;
use crate::dev::stream::Pod;

/// The ENI subnet (compose.yaml's `c2-eni-scene`).
const ENI_SUBNET: (u32, u8) = (0xac1f_8000, 20);
/// Cluster-2's EC2 endpoint, as its nodes reach it.
const EC2: &str = "http://172.30.2.5:5000";

/// Both pods, added and allowing each other.
pub struct Pods {
    /// Pod A: cluster-1, cluster-pool IP.
    pub a: Pod,
    /// Pod B: cluster-2, an ENI IP from the operator.
    pub b: Pod,
}

/// Adds pod `name` on `node` with the mesh's labels; its IP and prefix length.
fn add(node: &str, name: &str) -> anyhow::Result<(String, u8)> {
    let result = compose::exec_json(
        node,
        &[
            "meshwork-devnode",
            "pod",
            "add",
            name,
            "--label",
            "k8s:app=mesh",
        ],
    )?;
    let address = result["ips"][0]["address"]
        .as_str()
        .with_context(|| format!("no address in the ADD result {result}"))?;
    let (ip, prefix) = address
        .split_once('/')
        .with_context(|| format!("{address} is not ADDRESS/PREFIX"))?;
    println!("  {node}: pod {name} added through meshwork-cni: {address}");
    Ok((ip.to_owned(), prefix.parse()?))
}

/// The pod's endpoint as `meshwork-devnode pod show` prints it.
fn show(node: &str, name: &str) -> anyhow::Result<serde_json::Value> {
    compose::exec_json(node, &["meshwork-devnode", "pod", "show", name])
}

/// Whether `ip` lies in [`ENI_SUBNET`].
fn in_eni_subnet(ip: &str) -> bool {
    let (net, len) = ENI_SUBNET;
    ip.parse::<std::net::Ipv4Addr>()
        .is_ok_and(|ip| u32::from(ip) >> (32 - len) == net >> (32 - len))
}

/// The EC2 instance cluster-2's first node runs as, from its PID 1's log.
fn instance_of(node: &str) -> anyhow::Result<String> {
    let log = compose::logs(node)?;
    log.lines()
        .find_map(|line| line.split("devnode: EC2 instance ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
        .with_context(|| format!("{node}'s log names no EC2 instance"))
}

/// Adds both pods; checks that B's address is an ENI address the operator attached to B's
/// node's instance, as the agent and EC2 both say; lets each pod reach the other.
pub fn add_both() -> anyhow::Result<Pods> {
    let (a_ip, _) = add("c1-node-1", "pod-a")?;
    let (b_ip, b_prefix) = add("c2-node-1", "pod-b")?;
    ensure!(
        in_eni_subnet(&b_ip) && b_prefix == 32,
        "pod-b got {b_ip}/{b_prefix}, not a /32 of the ENI subnet 172.31.128.0/20"
    );
    let b = show("c2-node-1", "pod-b")?;
    let eni = b["eni"].as_str().unwrap_or_default().to_owned();
    ensure!(
        eni.starts_with("eni-"),
        "the agent records no ENI for pod-b's {b_ip}: {b}"
    );
    let owner = compose::exec_json(
        "c2-node-1",
        &["meshwork-devnode", "eni-owner", "--ec2", EC2, "--ip", &b_ip],
    )?;
    let instance = instance_of("c2-node-1")?;
    ensure!(
        owner["eni"] == eni.as_str()
            && owner["instance"] == instance.as_str()
            && owner["device_index"].as_i64() >= Some(1),
        "EC2 says {b_ip} is {owner}; the agent says ENI {eni} of {instance} (device index ≥ 1)"
    );
    println!(
        "  pod-b's {b_ip} is on {eni}, attached to {instance} (c2-node-1) at device index {}: \
         the agent and EC2 agree",
        owner["device_index"]
    );
    let a = show("c1-node-1", "pod-a")?;
    let (a_id, b_id) = (identity(&a)?, identity(&b)?);
    compose::exec(
        "c1-node-1",
        &[
            "meshwork-devnode",
            "pod",
            "allow",
            "pod-a",
            "--identity",
            &b_id.to_string(),
        ],
    )?;
    compose::exec(
        "c2-node-1",
        &[
            "meshwork-devnode",
            "pod",
            "allow",
            "pod-b",
            "--identity",
            &a_id.to_string(),
        ],
    )?;
    println!("  pod-a (identity {a_id}) and pod-b (identity {b_id}) allow each other");
    Ok(Pods {
        a: Pod {
            node: "c1-node-1",
            name: "pod-a",
            ip: a_ip,
        },
        b: Pod {
            node: "c2-node-1",
            name: "pod-b",
            ip: b_ip,
        },
    })
}

/// The identity of a shown endpoint (allocated by its cluster's apiserver).
fn identity(endpoint: &serde_json::Value) -> anyhow::Result<u64> {
    endpoint["identity"]
        .as_u64()
        .filter(|id| *id > 0)
        .with_context(|| format!("no identity yet: {endpoint}"))
}
