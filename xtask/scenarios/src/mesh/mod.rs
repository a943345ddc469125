//! Meshwork meshed with itself: clusters that each run their own etcd, `meshwork-apiserver`
//! and one real `meshwork-agent` per node, nodes and pods in lab network namespaces. Every
//! remote entry an agent holds was written by the remote cluster's apiserver from what that
//! cluster's agents published; nothing is loaded by hand. The demo and the proof run on it.

mod net;
mod pods;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use meshwork_lab::apiserver::{ApiserverOptions, ApiserverProcess};
use meshwork_lab::etcd::{EtcdOptions, EtcdServer};
use meshwork_lab::wait::Wait;

pub use self::net::{MeshNet, NodeAddrs};
pub use self::pods::POD_ENDPOINT;
use crate::binaries::Binaries;
use crate::node_agent::NodeAgent;

/// The mesh's shape and the agents' wait.
#[derive(Debug, Clone)]
pub struct MeshSpec {
    /// Clusters (1–9), named `cluster-<n>` with cluster ID `n`.
    pub clusters: u32,
    /// Nodes per cluster (1–9).
    pub nodes: u32,
    /// The apiservers' `--initial-sync-timeout`.
    pub initial_sync_timeout: Duration,
}

impl MeshSpec {
    /// The demo's mesh: three clusters of two nodes; a fresh apiserver writes its canaries 5 s
    /// after it starts (it cannot know which agents will come).
    pub fn demo() -> Self {
        Self {
            clusters: 3,
            nodes: 2,
            initial_sync_timeout: Duration::from_secs(5),
        }
    }
}

/// One cluster: its etcd, its apiserver and its nodes. Drops nodes (agents) first, then the
/// apiserver, then etcd.
pub struct MeshCluster {
    /// Its nodes.
    pub nodes: Vec<MeshNode>,
    apiserver: Option<ApiserverProcess>,
    apiserver_starts: u32,
    /// How its apiserver runs.
    pub apiserver_options: ApiserverOptions,
    /// Its etcd.
    pub etcd: EtcdServer,
    /// `cluster-<id>`.
    pub name: String,
    /// Its cluster ID.
    pub id: u32,
}

/// One node: its agent and its namespaces.
pub struct MeshNode {
    /// Its agent.
    pub agent: NodeAgent,
    /// Its addresses and names.
    pub addrs: NodeAddrs,
}

/// The running mesh; dropping it stops every process and removes the namespaces.
pub struct Mesh {
    /// The clusters, by ID order.
    pub clusters: Vec<MeshCluster>,
    /// The namespaces.
    pub net: MeshNet,
    /// Its shape.
    pub spec: MeshSpec,
}

impl Mesh {
    /// Builds the network, starts each cluster's etcd and apiserver, then every agent with
    /// `--clustermesh-ip-identities-sync-timeout=<wait>`; `progress` gets one line per step.
    pub async fn start(
        binaries: &Binaries,
        spec: &MeshSpec,
        dir: &Path,
        wait: &str,
        progress: &mut dyn FnMut(String),
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(
            (1..=9).contains(&spec.clusters) && (1..=9).contains(&spec.nodes),
            "a mesh has 1–9 clusters of 1–9 nodes"
        );
        let net = MeshNet::build(spec.clusters, spec.nodes).context("building the network")?;
        let mut clusters = Vec::new();
        for id in 1..=spec.clusters {
            let name = format!("cluster-{id}");
            let etcd = EtcdServer::start_with(EtcdOptions {
                max_txn_ops: Some(1000),
                name: Some(name.clone()),
                ..EtcdOptions::default()
            })
            .with_context(|| format!("starting {name}'s etcd"))?;
            let apiserver_options = ApiserverOptions::new(
                &binaries.apiserver,
                &name,
                id,
                &etcd.endpoint(),
                &dir.join(&name),
            )?
            .flags([format!(
                "--initial-sync-timeout={}s",
                spec.initial_sync_timeout.as_secs()
            )]);
            let mut cluster = MeshCluster {
                nodes: Vec::new(),
                apiserver: None,
                apiserver_starts: 0,
                apiserver_options,
                etcd,
                name,
                id,
            };
            cluster.start_apiserver()?;
            let apiserver_pid = cluster.apiserver_pid();
            progress(format!(
                "{:<10} etcd {} (pid {}), meshwork-apiserver {} (pid {})",
                cluster.name,
                cluster.etcd.endpoint(),
                cluster.etcd.pid().unwrap_or(0),
                cluster.apiserver_options.grpc_addr(),
                apiserver_pid,
            ));
            clusters.push(cluster);
        }
        let endpoints: Vec<(String, String)> = clusters
            .iter()
            .map(|c| (c.name.clone(), c.etcd.endpoint()))
            .collect();
        for cluster in &mut clusters {
            for addrs in net.nodes_of(cluster.id) {
                let remotes: Vec<_> = endpoints
                    .iter()
                    .filter(|(name, _)| *name != cluster.name)
                    .cloned()
                    .collect();
                let flags = vec![
                    format!("--apiserver-addr={}", cluster.apiserver_options.grpc_addr()),
                    format!("--node-name={}", addrs.name),
                    format!("--node-ip={}", addrs.node_ip),
                    format!("--ipv4-alloc-cidr={}", addrs.pod_cidr),
                ];
                let mut agent = NodeAgent::new(
                    dir,
                    &addrs.name,
                    (&cluster.name, cluster.id),
                    &remotes,
                    flags,
                )?;
                let started = Instant::now();
                agent.start(binaries, wait).await?;
                progress(format!(
                    "{:<10} node {} ({}, pods {}): meshwork-agent up in {} ms",
                    cluster.name,
                    addrs.name,
                    addrs.node_ip,
                    addrs.pod_cidr,
                    started.elapsed().as_millis()
                ));
                cluster.nodes.push(MeshNode {
                    agent,
                    addrs: addrs.clone(),
                });
            }
        }
        Ok(Self {
            clusters,
            net,
            spec: spec.clone(),
        })
    }

    /// Every node, cluster by cluster.
    pub fn nodes(&self) -> impl Iterator<Item = (&MeshCluster, &MeshNode)> {
        self.clusters
            .iter()
            .flat_map(|c| c.nodes.iter().map(move |n| (c, n)))
    }

    /// Waits (at most `timeout`) until every agent has every remote cluster ready and every
    /// remote pod in its ipcache map; returns how long that took.
    pub async fn wait_converged(&self, timeout: Duration) -> anyhow::Result<Duration> {
        let started = Instant::now();
        for (cluster, node) in self.nodes() {
            let remote_pods: Vec<&str> = self
                .nodes()
                .filter(|(c, _)| c.id != cluster.id)
                .map(|(_, n)| n.addrs.pod_ip.as_str())
                .collect();
            let left = timeout.saturating_sub(started.elapsed());
            Wait::new(format!("{} to hold every remote pod", node.addrs.name))
                .timeout(left)
                .until_async(
                    || async {
                        node.agent.mesh_ready().await
                            && node.agent.ipcache_holds(&remote_pods).ok()
                                == Some(remote_pods.len())
                    },
                    |done| *done,
                )
                .await
                .with_context(|| format!("{}: {}", node.addrs.name, node.agent.log_tail()))?;
        }
        Ok(started.elapsed())
    }
}

impl MeshCluster {
    /// Starts (or restarts) the apiserver.
    pub fn start_apiserver(&mut self) -> anyhow::Result<()> {
        self.apiserver_starts += 1;
        let process = ApiserverProcess::start(&self.apiserver_options, self.apiserver_starts)
            .with_context(|| format!("starting {}'s apiserver", self.name))?;
        self.apiserver = Some(process);
        Ok(())
    }

    /// The apiserver's PID (0 when stopped).
    pub fn apiserver_pid(&mut self) -> u32 {
        self.apiserver.as_mut().map_or(0, |p| p.process().pid())
    }
}
