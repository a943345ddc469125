//! The fixture scene's network: two nodes (one per cluster) joined by a veth underlay, and a pod on
//! each behind a veth whose host side carries the endpoint program. All inside lab
//! namespaces; the root namespace only holds the lab's `unreachable` guard routes.

use meshwork_lab::net::{LabNet, Netns};

/// Pod A's IP (cluster a, node a).
pub const POD_A: &str = "10.214.1.10";
/// Pod B's IP (cluster b, node b).
pub const POD_B: &str = "10.214.2.10";
/// Node A's underlay IP.
pub const NODE_A: &str = "10.213.0.1";
/// Node B's underlay IP.
pub const NODE_B: &str = "10.213.0.2";
/// Host side of pod A's veth (in node A).
pub const LXC_A: &str = "lxca";
/// Host side of pod B's veth (in node B).
pub const LXC_B: &str = "lxcb";

/// The namespaces, removed on drop.
pub struct Topology {
    /// Node of cluster a.
    pub node_a: Netns,
    /// Node of cluster b.
    pub node_b: Netns,
    /// Pod on node a.
    pub pod_a: Netns,
    /// Pod on node b.
    pub pod_b: Netns,
    _lab: LabNet,
}

impl Topology {
    /// Builds it.
    pub fn build() -> anyhow::Result<Self> {
        let lab = LabNet::new()?;
        let node_a = lab.netns("proof-node-a")?;
        let node_b = lab.netns("proof-node-b")?;
        let pod_a = lab.netns("proof-pod-a")?;
        let pod_b = lab.netns("proof-pod-b")?;
        node_a.veth_to("eth0", &node_b, "eth0")?;
        node_a.add_addr("eth0", &format!("{NODE_A}/24"))?;
        node_b.add_addr("eth0", &format!("{NODE_B}/24"))?;
        pod(&node_a, &pod_a, LXC_A, "10.214.1", POD_A)?;
        pod(&node_b, &pod_b, LXC_B, "10.214.2", POD_B)?;
        node_a.add_route_via("10.214.2.0/24", NODE_B)?;
        node_b.add_route_via("10.214.1.0/24", NODE_A)?;
        Ok(Self {
            node_a,
            node_b,
            pod_a,
            pod_b,
            _lab: lab,
        })
    }
}

/// A pod namespace with `ip`/24 on eth0, routed through the node side `lxc` (`net`.1).
fn pod(node: &Netns, pod: &Netns, lxc: &str, net: &str, ip: &str) -> anyhow::Result<()> {
    node.veth_to(lxc, pod, "eth0")?;
    node.add_addr(lxc, &format!("{net}.1/24"))?;
    pod.add_addr("eth0", &format!("{ip}/24"))?;
    pod.add_route_via("default", &format!("{net}.1"))?;
    node.enable_forwarding()?;
    Ok(())
}
