//! The proof's fixture scene: two clusters whose etcd holds Cilium-format state written by
//! hand (as a Cilium cluster would have it, hostile entries included), a node and a pod in
//! each, a real agent per node. B is late because its sync canaries are withdrawn while A is
//! down and written back [`LATE_BY`](super::LATE_BY) after A is up.

use std::time::Duration;

use anyhow::Context as _;
use meshwork_kvstore::EtcdBackend;
use meshwork_lab::cilium::{Cluster, Sizes};
use meshwork_lab::etcd::EtcdServer;
use meshwork_lab::net::Netns;
use meshwork_lab::wait::Wait;
use meshwork_proto::agent::v1 as pb;
use serde_json::json;

use super::Scene;
use super::fixtures_net::{LXC_A, LXC_B, NODE_A, NODE_B, POD_A, POD_B, Topology};
use crate::binaries::Binaries;
use crate::node_agent::NodeAgent;

const ENDPOINT_A: u64 = 101;
const ENDPOINT_B: u64 = 201;

/// The scene; drops the agents, then etcd, then the namespaces.
pub struct FixtureScene {
    agent_a: NodeAgent,
    _agent_b: NodeAgent,
    kv_b: EtcdBackend,
    cluster_b: Cluster,
    _etcd_a: EtcdServer,
    _etcd_b: EtcdServer,
    topo: Topology,
}

impl FixtureScene {
    /// Builds it: namespaces, both etcds seeded, both agents up and ready, both endpoints in.
    pub async fn build(binaries: &Binaries, dir: &std::path::Path) -> anyhow::Result<Self> {
        let topo = Topology::build()?;
        let etcd_a = EtcdServer::start()?;
        let etcd_b = EtcdServer::start()?;
        let cluster_a = cluster("a", 1);
        let cluster_b = cluster("b", 2);
        let _kv_a = seed(&etcd_a, &cluster_a, POD_A, NODE_A).await?;
        let kv_b = seed(&etcd_b, &cluster_b, POD_B, NODE_B).await?;

        let remote = |name: &str, etcd: &EtcdServer| vec![(name.to_owned(), etcd.endpoint())];
        let mut agent_b = NodeAgent::new(dir, "b", ("b", 2), &remote("a", &etcd_a), Vec::new())?;
        let mut agent_a = NodeAgent::new(dir, "a", ("a", 1), &remote("b", &etcd_b), Vec::new())?;
        agent_b.start(binaries, "1m").await?;
        agent_a.start(binaries, "1m").await?;
        for agent in [&agent_a, &agent_b] {
            Wait::new("the remote cluster ready")
                .timeout(Duration::from_secs(30))
                .until_async(|| agent.mesh_ready(), |ready| *ready)
                .await
                .with_context(|| format!("agent {}: {}", agent.name, agent.log_tail()))?;
        }
        let id_a = cluster_a.identity(0);
        let id_b = cluster_b.identity(0);
        agent_b
            .add_endpoint(endpoint(ENDPOINT_B, LXC_B, &topo.node_b, POD_B, id_b, id_a))
            .await?;
        agent_a
            .add_endpoint(endpoint(ENDPOINT_A, LXC_A, &topo.node_a, POD_A, id_a, id_b))
            .await?;
        Ok(Self {
            agent_a,
            _agent_b: agent_b,
            kv_b,
            cluster_b,
            _etcd_a: etcd_a,
            _etcd_b: etcd_b,
            topo,
        })
    }
}

impl Scene for FixtureScene {
    fn agent_a(&self) -> &NodeAgent {
        &self.agent_a
    }

    fn agent_a_mut(&mut self) -> &mut NodeAgent {
        &mut self.agent_a
    }

    fn pods(&self) -> (&Netns, &Netns) {
        (&self.topo.pod_a, &self.topo.pod_b)
    }

    fn pod_b(&self) -> &str {
        POD_B
    }

    fn endpoint_a(&self) -> u64 {
        ENDPOINT_A
    }

    async fn withdraw_b(&mut self) -> anyhow::Result<()> {
        for (key, _) in self.cluster_b.canaries() {
            self.kv_b.delete(&key).await?;
        }
        Ok(())
    }

    async fn restore_b(&mut self) -> anyhow::Result<()> {
        self.kv_b.put_many(self.cluster_b.canaries(), 100).await?;
        Ok(())
    }

    fn bad_written(&self) -> anyhow::Result<u32> {
        let mut written = 0;
        for (ip, _) in bad_entries(&self.cluster_b) {
            if self.agent_a.ipcache_has(ip)? {
                written += 1;
            }
        }
        Ok(written)
    }
}

fn cluster(name: &str, id: u32) -> Cluster {
    Cluster {
        name: name.to_owned(),
        id,
        sizes: Sizes {
            nodes: 2,
            services: 1,
            identities: 2,
            ipcache: 20,
        },
    }
}

/// Writes the cluster's Cilium state plus its pod's entry (hosted on `node`), then canaries.
async fn seed(
    etcd: &EtcdServer,
    cluster: &Cluster,
    pod: &str,
    node: &str,
) -> anyhow::Result<EtcdBackend> {
    let kv = crate::load::connect(&etcd.endpoint()).await?;
    let value = json!({
        "IP": pod, "Mask": null, "HostIP": node, "ID": cluster.identity(0), "Key": 0,
        "Metadata": "", "K8sNamespace": "default", "K8sPodName": format!("pod-{}", cluster.name),
    });
    kv.put(
        &format!("cilium/state/ip/v1/default/{pod}"),
        value.to_string().into_bytes(),
    )
    .await?;
    // Bad input the agent must reject, count and never write: an unparsable IP, a mask
    // longer than the family, identity 0.
    for (ip, value) in bad_entries(cluster) {
        kv.put(
            &format!("cilium/state/ip/v1/default/{ip}"),
            value.to_string().into_bytes(),
        )
        .await?;
    }
    crate::load::load(&kv, cluster).await?;
    Ok(kv)
}

/// Bad ipcache entries, by the IP of their key.
fn bad_entries(cluster: &Cluster) -> [(&'static str, serde_json::Value); 3] {
    let id = cluster.identity(1);
    [
        (
            "10.214.9.1",
            json!({"IP": "10.214.9.300", "Mask": null, "HostIP": NODE_B, "ID": id}),
        ),
        (
            "10.214.9.2",
            json!({"IP": "10.214.9.2", "Mask": "/////wA=", "HostIP": NODE_B, "ID": id}),
        ),
        (
            "10.214.9.3",
            json!({"IP": "10.214.9.3", "Mask": null, "HostIP": NODE_B, "ID": 0}),
        ),
    ]
}

fn endpoint(
    id: u64,
    interface: &str,
    node: &Netns,
    ip: &str,
    identity: u32,
    allow: u32,
) -> pb::Endpoint {
    pb::Endpoint {
        id,
        interface: interface.to_owned(),
        netns: node.path().display().to_string(),
        ips: vec![ip.to_owned()],
        identity,
        allowed_identities: vec![allow],
        host: false,
        ..pb::Endpoint::default()
    }
}
