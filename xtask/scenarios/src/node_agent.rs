//! One node's agent for the proof and the demo: a real `meshwork-agent` process with its own
//! state dir, bpffs root and clustermesh config, restartable, and its gRPC API.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use meshwork_datapath::drops;
use meshwork_datapath::ipcache_map::IpCacheKey;
use meshwork_datapath::maps::PinDir;
use meshwork_lab::agent::{AgentOptions, AgentProcess};
use meshwork_lab::bpffs::BpfRoot;
use meshwork_lab::wait::Wait;
use meshwork_proto::agent::v1 as pb;
use meshwork_proto::agent::v1::agent_client::AgentClient;
use meshwork_proto::agent::v1::datapath_client::DatapathClient;
use meshwork_proto::agent::v1::encrypt_client::EncryptClient;

use crate::binaries::Binaries;

/// How long an agent may take to answer its first status request once it says it runs.
const API_TIMEOUT: Duration = Duration::from_secs(20);

/// A node agent's fixed parts (kept across its restarts).
pub struct NodeAgent {
    /// What it is called in messages (its node's name).
    pub name: String,
    cluster: String,
    cluster_id: u32,
    dir: PathBuf,
    flags: Vec<String>,
    bpf: BpfRoot,
    process: Option<AgentProcess>,
    starts: u32,
}

impl NodeAgent {
    /// The agent `name` of `cluster`, keeping its files in `<dir>/<name>`, watching each of
    /// `remotes` (cluster name, etcd endpoint), run with `flags` besides its own.
    pub fn new(
        dir: &Path,
        name: &str,
        (cluster, cluster_id): (&str, u32),
        remotes: &[(String, String)],
        flags: Vec<String>,
    ) -> anyhow::Result<Self> {
        let dir = dir.join(name);
        let config = dir.join("clustermesh");
        std::fs::create_dir_all(&config)?;
        for (remote, endpoint) in remotes {
            meshwork_lab::agent::write_cluster_config(&config, remote, endpoint)?;
        }
        Ok(Self {
            name: name.to_owned(),
            cluster: cluster.to_owned(),
            cluster_id,
            dir,
            flags,
            bpf: BpfRoot::new()?,
            process: None,
            starts: 0,
        })
    }

    /// How the agent runs, with `--clustermesh-ip-identities-sync-timeout=<wait>`; its log
    /// is per start (`agent-<n>.log` in its state dir), so a restart keeps the first run's.
    fn options(&self, binaries: &Binaries, wait_timeout: &str) -> AgentOptions {
        AgentOptions::new(
            &binaries.agent,
            &self.cluster,
            self.cluster_id,
            &self.dir.join("state"),
        )
        .clustermesh_config(&self.dir.join("clustermesh"))
        .bpf_root(self.bpf.path())
        .flags(self.flags.iter().cloned().chain([
            format!("--clustermesh-ip-identities-sync-timeout={wait_timeout}"),
            // The breaker of every other wait (services, nodes) goes with it.
            format!("--clustermesh-sync-timeout={wait_timeout}"),
        ]))
        .log_name(&format!("agent-{}.log", self.starts))
    }

    /// The API socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("state").join("agent.sock")
    }

    /// Its clustermesh config directory (one file per remote cluster).
    pub fn clustermesh_config(&self) -> PathBuf {
        self.dir.join("clustermesh")
    }

    /// Where its maps are pinned.
    pub fn pins(&self) -> PinDir {
        PinDir::under(self.bpf.path())
    }

    /// Starts the agent with `--clustermesh-ip-identities-sync-timeout=<wait>` and waits for
    /// its API to answer.
    pub async fn start(&mut self, binaries: &Binaries, wait_timeout: &str) -> anyhow::Result<()> {
        self.starts += 1;
        let options = self.options(binaries, wait_timeout);
        let process = AgentProcess::start(&options)
            .with_context(|| format!("starting agent {}", self.name))?;
        let log = process.log().to_owned();
        self.process = Some(process);
        let socket = options.socket();
        Wait::new(format!("agent {}'s API", self.name))
            .timeout(API_TIMEOUT)
            .some_async(|| {
                let socket = socket.clone();
                async move { status(&socket).await.ok() }
            })
            .await
            .with_context(|| {
                format!(
                    "agent {} did not serve its API; log {}",
                    self.name,
                    log.display()
                )
            })?;
        Ok(())
    }

    /// SIGTERM, then waits for the exit.
    pub fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.stop(Duration::from_secs(10));
        }
    }

    /// The current run's PID, if it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(AgentProcess::pid)
    }

    /// The log of the current run.
    pub fn log_tail(&self) -> String {
        self.process
            .as_ref()
            .map(AgentProcess::log_tail)
            .unwrap_or_default()
    }

    /// Adds an endpoint through the API.
    pub async fn add_endpoint(&self, endpoint: pb::Endpoint) -> anyhow::Result<()> {
        let channel = meshwork_proto::connect_unix(&self.socket()).await?;
        DatapathClient::new(channel)
            .put_endpoint(pb::PutEndpointRequest {
                endpoint: Some(endpoint),
            })
            .await
            .context("PutEndpoint")?;
        Ok(())
    }

    /// Its endpoints as the API lists them.
    pub async fn endpoints(&self) -> anyhow::Result<Vec<pb::EndpointStatus>> {
        let channel = meshwork_proto::connect_unix(&self.socket()).await?;
        Ok(DatapathClient::new(channel)
            .list_endpoints(pb::ListEndpointsRequest {})
            .await?
            .into_inner()
            .endpoints)
    }

    /// The endpoint `id`'s (state, generation).
    pub async fn endpoint(&self, id: u64) -> anyhow::Result<Option<(String, u64)>> {
        Ok(self
            .endpoints()
            .await?
            .into_iter()
            .find(|e| e.endpoint.as_ref().is_some_and(|e| e.id == id))
            .map(|e| (e.state, e.generation)))
    }

    /// Whether every remote cluster is ready.
    pub async fn mesh_ready(&self) -> bool {
        status(&self.socket())
            .await
            .ok()
            .and_then(|s| s.clustermesh)
            .is_some_and(|m| m.total > 0 && m.ready == m.total)
    }

    /// How many WireGuard peers its device has, as its Encrypt API reports them.
    pub async fn wireguard_peers(&self) -> anyhow::Result<usize> {
        let channel = meshwork_proto::connect_unix(&self.socket()).await?;
        Ok(EncryptClient::new(channel)
            .status(pb::EncryptStatusRequest {})
            .await?
            .into_inner()
            .peers
            .len())
    }

    /// Total drops of its endpoint programs.
    pub fn drops(&self) -> anyhow::Result<u64> {
        Ok(drops::total(&drops::read(&self.pins())?))
    }

    /// Whether the pinned ipcache holds `ip` now.
    pub fn ipcache_has(&self, ip: &str) -> anyhow::Result<bool> {
        Ok(self.ipcache_holds(&[ip])? == 1)
    }

    /// How many of `ips` the pinned ipcache holds now (one read of the map).
    pub fn ipcache_holds(&self, ips: &[&str]) -> anyhow::Result<usize> {
        let keys = ips
            .iter()
            .map(|ip| IpCacheKey::parse(ip, 0))
            .collect::<Result<Vec<_>, _>>()?;
        let entries = self.pins().open_ipcache()?.entries()?;
        Ok(keys
            .iter()
            .filter(|key| entries.iter().any(|(k, _)| k == *key))
            .count())
    }
}

impl Drop for NodeAgent {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn status(socket: &Path) -> anyhow::Result<pb::StatusResponse> {
    let channel = meshwork_proto::connect_unix(socket).await?;
    Ok(AgentClient::new(channel)
        .status(pb::StatusRequest {})
        .await?
        .into_inner())
}
