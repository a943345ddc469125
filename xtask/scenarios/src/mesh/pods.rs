//! The mesh's pods as endpoints: each gets its identity from its cluster's apiserver (by its
//! labels), then every pod's policy allows every pod's identity; and a TCP probe from one pod
//! to another, through both endpoint programs.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use meshwork_proto::agent::v1 as pb;

use super::net::LXC;
use super::{Mesh, MeshNode, NodeAddrs};

/// Every pod's endpoint ID on its agent.
pub const POD_ENDPOINT: u64 = 1;
/// The labels every pod carries (its identity is its cluster's for this set).
pub const POD_LABELS: [&str; 2] = ["k8s:app=mesh", "k8s:io.kubernetes.pod.namespace=default"];
/// How long a probe's connect may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
const PROBE_PORT: u16 = 7302;

impl Mesh {
    /// Adds every pod with [`POD_LABELS`] (identity 0: its apiserver allocates it), then puts
    /// each again allowing every pod's identity; returns (pod name, identity) per node.
    pub async fn add_pods(&self) -> anyhow::Result<Vec<(String, u32)>> {
        let mut identities = Vec::new();
        for (_, node) in self.nodes() {
            node.agent
                .add_endpoint(pod_endpoint(&node.addrs, Vec::new()))
                .await
                .with_context(|| format!("adding {}", node.addrs.pod_name))?;
            identities.push((node.addrs.pod_name.clone(), identity_of(node).await?));
        }
        let mut allowed: Vec<u32> = identities.iter().map(|(_, id)| *id).collect();
        allowed.sort_unstable();
        allowed.dedup();
        for (_, node) in self.nodes() {
            node.agent
                .add_endpoint(pod_endpoint(&node.addrs, allowed.clone()))
                .await
                .with_context(|| format!("allowing {}'s peers", node.addrs.pod_name))?;
        }
        Ok(identities)
    }

    /// Opens a TCP connection from `from`'s pod to `to`'s pod; how long the handshake took.
    pub fn probe(&self, from: &NodeAddrs, to: &NodeAddrs) -> anyhow::Result<Duration> {
        let server = self.net.pod(&to.name).context("no such pod")?;
        let client = self.net.pod(&from.name).context("no such pod")?;
        let addr: SocketAddr = format!("{}:{PROBE_PORT}", to.pod_ip).parse()?;
        let listener = server.enter(move || TcpListener::bind(addr))??;
        let started = Instant::now();
        client
            .enter(move || TcpStream::connect_timeout(&addr, PROBE_TIMEOUT))?
            .with_context(|| format!("connecting {} to {} ({addr})", from.pod_name, to.pod_name))?;
        let took = started.elapsed();
        drop(listener);
        Ok(took)
    }
}

/// The endpoint of `addrs`'s pod allowing `allowed`.
pub fn pod_endpoint(addrs: &NodeAddrs, allowed: Vec<u32>) -> pb::Endpoint {
    pb::Endpoint {
        id: POD_ENDPOINT,
        interface: LXC.to_owned(),
        netns: addrs.netns_path().display().to_string(),
        ips: vec![addrs.pod_ip.clone()],
        identity: 0,
        allowed_identities: allowed,
        host: false,
        labels: POD_LABELS.iter().map(|l| (*l).to_owned()).collect(),
        pod_namespace: "default".to_owned(),
        pod_name: addrs.pod_name.clone(),
    }
}

/// The identity `node`'s agent gave its pod.
pub async fn identity_of(node: &MeshNode) -> anyhow::Result<u32> {
    let endpoints = node.agent.endpoints().await?;
    endpoints
        .iter()
        .filter_map(|e| e.endpoint.as_ref())
        .find(|e| e.id == POD_ENDPOINT)
        .map(|e| e.identity)
        .filter(|id| *id != 0)
        .with_context(|| format!("{} has no identity for its pod", node.addrs.name))
}
