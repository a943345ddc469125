//! Meshwork meshed with itself: clusters that each run their own etcd, `meshwork-apiserver`
//! and one real `meshwork-agent` per node, nodes and pods in lab network namespaces. Every
//! remote entry an agent holds was written by the remote cluster's apiserver from what that
//! cluster's agents published; nothing is loaded by hand. The demo and the proof run on it.

mod net;
mod pods;
mod services;
mod tunnel;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use meshwork_lab::apiserver::{ApiserverOptions, ApiserverProcess};
use meshwork_lab::cgroup::ChildCgroup;
use meshwork_lab::etcd::{EtcdOptions, EtcdServer};
use meshwork_lab::kvstoremesh::{KvstoremeshOptions, KvstoremeshProcess};
use meshwork_lab::wait::Wait;

pub use self::net::{MeshNet, NodeAddrs};
pub use self::pods::POD_ENDPOINT;
pub use self::tunnel::NodeTunnel;
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
    /// Each cluster runs `meshwork-apiserver kvstoremesh`, caching the other clusters in its
    /// etcd, and its agents read every remote from there.
    pub kvstoremesh: bool,
    /// Every agent runs socket-LB (`--bpf-lb-sock`) on a child cgroup of its own node
    /// ([`MeshNode::cgroup`]), where the node's client processes go.
    pub socket_lb: bool,
    /// Traffic between clusters goes through each node's WireGuard device, whose peers its
    /// agent configures from the remote nodes ([`NodeTunnel`]).
    pub wireguard: bool,
}

impl MeshSpec {
    /// The demo's mesh: three clusters of two nodes, each with a kvstoremesh; a fresh
    /// apiserver writes its canaries 5 s after it starts (it cannot know which agents will
    /// come).
    pub fn demo() -> Self {
        Self {
            clusters: 3,
            nodes: 2,
            initial_sync_timeout: Duration::from_secs(5),
            kvstoremesh: true,
            socket_lb: false,
            wireguard: false,
        }
    }
}

/// One cluster: its etcd, its apiserver, its kvstoremesh and its nodes. Drops nodes (agents)
/// first, then the apiserver and kvstoremesh, then etcd.
pub struct MeshCluster {
    /// Its nodes.
    pub nodes: Vec<MeshNode>,
    apiserver: Option<ApiserverProcess>,
    /// Its kvstoremesh, with [`MeshSpec::kvstoremesh`].
    pub kvstoremesh: Option<(KvstoremeshOptions, KvstoremeshProcess)>,
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
    /// With [`MeshSpec::socket_lb`]: the node's cgroup, where its socket-LB programs run.
    pub cgroup: Option<ChildCgroup>,
    /// With [`MeshSpec::wireguard`]: the node's WireGuard device, held to be stopped after
    /// the agent (fields drop in order).
    _tunnel: Option<NodeTunnel>,
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
                kvstoremesh: None,
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
        if spec.kvstoremesh {
            for cluster in &mut clusters {
                cluster.start_kvstoremesh(binaries, &endpoints, dir)?;
                let (options, process) = cluster.kvstoremesh.as_mut().expect("just started");
                progress(format!(
                    "{:<10} kvstoremesh caching the other clusters in its etcd (pid {}, status {})",
                    cluster.name,
                    process.process().pid(),
                    options.api_addr(),
                ));
            }
        }
        for cluster in &mut clusters {
            for addrs in net.nodes_of(cluster.id) {
                // Through kvstoremesh every remote is read from the cluster's own etcd.
                let remotes: Vec<_> = endpoints
                    .iter()
                    .filter(|(name, _)| *name != cluster.name)
                    .map(|(name, endpoint)| {
                        let endpoint = if spec.kvstoremesh {
                            cluster.etcd.endpoint()
                        } else {
                            endpoint.clone()
                        };
                        (name.clone(), endpoint)
                    })
                    .collect();
                let mut flags = vec![
                    format!("--apiserver-addr={}", cluster.apiserver_options.grpc_addr()),
                    format!("--node-name={}", addrs.name),
                    format!("--node-ip={}", addrs.node_ip),
                    format!("--ipv4-alloc-cidr={}", addrs.pod_cidr),
                ];
                let cgroup = if spec.socket_lb {
                    let cgroup = ChildCgroup::create(&addrs.name)?;
                    flags.push("--bpf-lb-sock=true".to_owned());
                    flags.push(format!("--cgroup-root={}", cgroup.path().display()));
                    Some(cgroup)
                } else {
                    None
                };
                let tunnel = if spec.wireguard {
                    let tunnel = NodeTunnel::start(&net, addrs, &dir.join(&addrs.name))?;
                    flags.extend(tunnel.agent_flags().iter().cloned());
                    Some(tunnel)
                } else {
                    None
                };
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
                    cgroup,
                    _tunnel: tunnel,
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

    /// Waits (at most `timeout`) until every agent has every remote cluster ready, every
    /// remote pod in its ipcache map and, with WireGuard, a peer for every remote node;
    /// returns how long that took.
    pub async fn wait_converged(&self, timeout: Duration) -> anyhow::Result<Duration> {
        let started = Instant::now();
        for (cluster, node) in self.nodes() {
            let remote_pods: Vec<&str> = self
                .nodes()
                .filter(|(c, _)| c.id != cluster.id)
                .map(|(_, n)| n.addrs.pod_ip.as_str())
                .collect();
            let peers = if self.spec.wireguard {
                remote_pods.len()
            } else {
                0
            };
            let left = timeout.saturating_sub(started.elapsed());
            Wait::new(format!("{} to hold every remote pod", node.addrs.name))
                .timeout(left)
                .until_async(
                    || async {
                        node.agent.mesh_ready().await
                            && node.agent.ipcache_holds(&remote_pods).ok()
                                == Some(remote_pods.len())
                            && (peers == 0
                                || node.agent.wireguard_peers().await.ok() == Some(peers))
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

    /// Starts kvstoremesh, caching every other cluster of `endpoints` (name, etcd) in this
    /// cluster's etcd; its config directory and logs go under `<dir>/<name>`.
    fn start_kvstoremesh(
        &mut self,
        binaries: &Binaries,
        endpoints: &[(String, String)],
        dir: &Path,
    ) -> anyhow::Result<()> {
        let config = dir.join(&self.name).join("kvstoremesh-config");
        std::fs::create_dir_all(&config)
            .with_context(|| format!("creating {}", config.display()))?;
        for (remote, endpoint) in endpoints.iter().filter(|(name, _)| *name != self.name) {
            meshwork_lab::agent::write_cluster_config(&config, remote, endpoint)?;
        }
        let options = KvstoremeshOptions::new(
            &binaries.apiserver,
            (&self.name, self.id),
            &self.etcd.endpoint(),
            &config,
            &dir.join(&self.name),
        )?;
        let process = KvstoremeshProcess::start(&options, 1)
            .with_context(|| format!("starting {}'s kvstoremesh", self.name))?;
        self.kvstoremesh = Some((options, process));
        Ok(())
    }

    /// The apiserver's PID (0 when stopped).
    pub fn apiserver_pid(&mut self) -> u32 {
        self.apiserver.as_mut().map_or(0, |p| p.process().pid())
    }
}
