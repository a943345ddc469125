//! The mesh's network: every node namespace plugged into one lab switch (the underlay), a pod
//! namespace per node behind a veth whose host side carries the endpoint program, and routes
//! from each node to every other node's pod CIDR (over the underlay; with WireGuard the routes
//! to other clusters go through the node's tunnel, [`super::tunnel`]). All inside lab
//! namespaces; the root namespace only holds the lab's `unreachable` guard routes.

use std::path::{Path, PathBuf};

use meshwork_lab::net::{LabNet, Netns, Switch};

/// The host side of each pod's veth, in its node's namespace.
pub const LXC: &str = "lxc0";

/// One node's names and addresses: node `n` of cluster `c` is `10.213.0.<10c+n>` on the
/// underlay, owns pod CIDR `10.214.<10c+n>.0/24` and runs one pod at `.10` of it.
#[derive(Debug, Clone)]
pub struct NodeAddrs {
    /// `cluster-<c>-node-<n>`: the agent's `--node-name`.
    pub name: String,
    /// The cluster's ID.
    pub cluster_id: u32,
    /// The pod's name (namespace `default`).
    pub pod_name: String,
    /// The node's underlay IP (`--node-ip`).
    pub node_ip: String,
    /// The node's pod CIDR (`--ipv4-alloc-cidr`).
    pub pod_cidr: String,
    /// The pod's IP.
    pub pod_ip: String,
    /// The node's namespace.
    pub netns: PathBuf,
}

/// The namespaces, removed on drop (the nodes and pods before the switch).
pub struct MeshNet {
    nodes: Vec<(NodeAddrs, Netns, Netns)>,
    _switch: Switch,
    _lab: LabNet,
}

impl MeshNet {
    /// Builds `clusters` × `nodes` nodes, each with one pod.
    pub fn build(clusters: u32, nodes: u32) -> anyhow::Result<Self> {
        let lab = LabNet::new()?;
        let switch = lab.switch("mesh-underlay")?;
        let mut built = Vec::new();
        for c in 1..=clusters {
            for n in 1..=nodes {
                let octet = c * 10 + n;
                let node = lab.netns(&format!("c{c}-node-{n}"))?;
                let pod = lab.netns(&format!("c{c}-node-{n}-pod"))?;
                let addrs = NodeAddrs {
                    name: format!("cluster-{c}-node-{n}"),
                    cluster_id: c,
                    pod_name: format!("pod-{c}-{n}"),
                    node_ip: format!("10.213.0.{octet}"),
                    pod_cidr: format!("10.214.{octet}.0/24"),
                    pod_ip: format!("10.214.{octet}.10"),
                    netns: node.path().to_owned(),
                };
                switch.connect(&node, "eth0", &format!("{}/24", addrs.node_ip))?;
                node.veth_to(LXC, &pod, "eth0")?;
                node.add_addr(LXC, &format!("10.214.{octet}.1/24"))?;
                node.enable_forwarding()?;
                pod.add_addr("eth0", &format!("{}/24", addrs.pod_ip))?;
                pod.add_route_via("default", &format!("10.214.{octet}.1"))?;
                built.push((addrs, node, pod));
            }
        }
        for (addrs, node, _) in &built {
            for (other, _, _) in &built {
                if other.name != addrs.name {
                    node.add_route_via(&other.pod_cidr, &other.node_ip)?;
                }
            }
        }
        Ok(Self {
            nodes: built,
            _switch: switch,
            _lab: lab,
        })
    }

    /// Every node.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeAddrs> {
        self.nodes.iter().map(|(addrs, _, _)| addrs)
    }

    /// The nodes of cluster `id`.
    pub fn nodes_of(&self, id: u32) -> impl Iterator<Item = &NodeAddrs> {
        self.nodes().filter(move |addrs| addrs.cluster_id == id)
    }

    /// The namespace of the node named `node`.
    pub fn node(&self, node: &str) -> Option<&Netns> {
        self.find(node).map(|(_, netns, _)| netns)
    }

    /// The pod namespace of the node named `node`.
    pub fn pod(&self, node: &str) -> Option<&Netns> {
        self.find(node).map(|(_, _, pod)| pod)
    }

    fn find(&self, node: &str) -> Option<&(NodeAddrs, Netns, Netns)> {
        self.nodes.iter().find(|(addrs, _, _)| addrs.name == node)
    }
}

impl NodeAddrs {
    /// The node's namespace path, as the endpoint API takes it.
    pub fn netns_path(&self) -> &Path {
        &self.netns
    }
}
