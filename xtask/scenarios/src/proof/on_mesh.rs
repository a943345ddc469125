//! The proof on Meshwork meshed with itself: the demo's clusters ([`crate::mesh`]), every
//! remote entry written by a Meshwork apiserver from what its agents published. A is
//! cluster-1's first node, B cluster-2's first node. B is late because cluster-2's etcd is
//! down while A restarts (a remote etcd outage) and comes back [`LATE_BY`](super::LATE_BY)
//! after A is up; cluster-2's apiserver and agents keep running throughout. Every agent runs
//! socket-LB on its node's cgroup, and cluster-2 declares the global service [`VIP`] whose
//! backends are its pods. Traffic between clusters goes through each node's WireGuard device,
//! whose peers its agent configures; a UDP stream from B's pod to A's pod shows what WireGuard
//! alone does across the restart.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use meshwork_lab::net::Netns;

use super::connects::PORT;
use super::{GlobalService, Scene};
use crate::binaries::Binaries;
use crate::mesh::{Mesh, MeshNode, MeshSpec, POD_ENDPOINT};
use crate::node_agent::NodeAgent;

/// How long the mesh may take to converge.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(60);

/// The scene: the mesh, A and B by (cluster, node) index.
pub struct MeshScene {
    mesh: Mesh,
}

const A: (usize, usize) = (0, 0);
const B: (usize, usize) = (1, 0);
/// The global service's VIP: in the lab's pod range, no pod's, routed nowhere.
const VIP: &str = "10.214.250.1";

impl MeshScene {
    /// The demo's mesh (3 clusters × 2 nodes), its pods added, converged.
    pub async fn build(binaries: &Binaries, dir: &Path) -> anyhow::Result<Self> {
        // The proof's late remote is its etcd: the agents read it directly, not through a
        // kvstoremesh cache that would hide it being down.
        let spec = MeshSpec {
            kvstoremesh: false,
            socket_lb: true,
            wireguard: true,
            ..MeshSpec::demo()
        };
        let mesh = Mesh::start(binaries, &spec, dir, "1m", &mut |_| {}).await?;
        mesh.add_pods().await?;
        let backends = mesh.declare_global_service(B.0, "echo", VIP, PORT).await?;
        anyhow::ensure!(
            backends == spec.nodes,
            "the global service has {backends} backends in {}, not one per node",
            mesh.clusters[B.0].name
        );
        mesh.wait_converged(CONVERGE_TIMEOUT)
            .await
            .context("the mesh converging")?;
        Ok(Self { mesh })
    }

    fn node(&self, (c, n): (usize, usize)) -> &MeshNode {
        &self.mesh.clusters[c].nodes[n]
    }

    fn pod(&self, at: (usize, usize)) -> &Netns {
        self.mesh
            .net
            .pod(&self.node(at).addrs.name)
            .expect("every node has a pod")
    }
}

impl Scene for MeshScene {
    fn agent_a(&self) -> &NodeAgent {
        &self.node(A).agent
    }

    fn agent_a_mut(&mut self) -> &mut NodeAgent {
        &mut self.mesh.clusters[A.0].nodes[A.1].agent
    }

    fn pods(&self) -> (&Netns, &Netns) {
        (self.pod(A), self.pod(B))
    }

    fn pod_b(&self) -> &str {
        &self.node(B).addrs.pod_ip
    }

    fn endpoint_a(&self) -> u64 {
        POD_ENDPOINT
    }

    async fn withdraw_b(&mut self) -> anyhow::Result<()> {
        self.mesh.clusters[B.0].etcd.stop();
        Ok(())
    }

    async fn restore_b(&mut self) -> anyhow::Result<()> {
        let cluster = &mut self.mesh.clusters[B.0];
        cluster
            .etcd
            .restart()
            .with_context(|| format!("restarting {}'s etcd", cluster.name))
    }

    fn bad_written(&self) -> anyhow::Result<u32> {
        // An apiserver writes only what it validated: there is nothing hostile to find.
        Ok(0)
    }

    fn wireguard_stream(&self) -> Option<(&Netns, &Netns, &str)> {
        let (a, b) = self.pods();
        Some((b, a, &self.node(A).addrs.pod_ip))
    }

    fn global_service(&self) -> Option<GlobalService<'_>> {
        let backends = self.mesh.clusters[B.0]
            .nodes
            .iter()
            .map(|node| {
                let pod = self
                    .mesh
                    .net
                    .pod(&node.addrs.name)
                    .expect("every node has a pod");
                (pod, node.addrs.pod_ip.as_str())
            })
            .collect();
        Some(GlobalService {
            cgroup: self.node(A).cgroup.as_ref()?,
            backends,
            vip: VIP,
        })
    }
}
