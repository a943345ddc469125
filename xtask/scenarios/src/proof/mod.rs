//! The no-drop proof (`cargo xtask proof`): two clusters, a pod in each, a TCP stream from pod
//! A to pod B through A's endpoint program. A's agent restarts while cluster B's state
//! arrives late (B's sync canaries are withdrawn while A is down and written back a few
//! seconds after A is up). With the bounded wait: no drops, no gap. Without it
//! (`--clustermesh-ip-identities-sync-timeout=0s`): A regenerates onto a map without B and
//! drops — proof that the check can fail.

mod agent;
mod stream;
mod topology;

use std::cell::Cell;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use meshwork_kvstore::EtcdBackend;
use meshwork_lab::cilium::{Cluster, Sizes};
use meshwork_lab::etcd::EtcdServer;
use meshwork_lab::wait::Wait;
use meshwork_proto::agent::v1 as pb;
use serde_json::json;

use self::agent::ProofAgent;
use self::stream::{Stream, StreamReport};
use self::topology::{LXC_A, LXC_B, NODE_A, NODE_B, POD_A, POD_B, Topology};
use crate::binaries::{self, Binaries};

/// How long B's state stays away after A's agent is back.
pub const LATE_BY: Duration = Duration::from_secs(3);
const ENDPOINT_A: u64 = 101;
const ENDPOINT_B: u64 = 201;

/// `meshwork-scenarios proof`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Run only one variant: `with-wait` or `without-wait`.
    #[arg(long)]
    pub only: Option<String>,
}

/// What one run measured.
#[derive(Debug, Clone, Copy)]
pub struct RunReport {
    /// Drops of A's endpoint program from the restart to the end.
    pub drops: u64,
    /// The stream's gaps and resets.
    pub stream: StreamReport,
    /// Samples where A's endpoint had regenerated while the map lacked pod B.
    pub regenerated_without_b: u32,
    /// Samples where the map held pod B before A's endpoint regenerated.
    pub b_before_regeneration: u32,
    /// Samples where A's restored endpoint was waiting for remote clusters.
    pub waiting: u32,
    /// Bad remote entries found in A's ipcache map (must be 0).
    pub bad_written: u32,
}

/// Runs both variants and prints the figures.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let binaries = binaries::build()?;
    let with = match args.only.as_deref() {
        None | Some("with-wait") => Some(Box::pin(run_once(&binaries, true)).await?),
        _ => None,
    };
    let without = match args.only.as_deref() {
        None | Some("without-wait") => Some(Box::pin(run_once(&binaries, false)).await?),
        _ => None,
    };
    for (name, report) in [("with wait", with), ("without wait (0s)", without)] {
        if let Some(r) = report {
            println!(
                "{name:<18} drops={} stream: received={} gaps={} resets={} longest_pause={} ms; \
                 samples: waiting={} regenerated-without-B={} B-before-regeneration={}; \
                 bad entries written={}",
                r.drops,
                r.stream.received,
                r.stream.gaps,
                r.stream.resets,
                r.stream.longest_pause.as_millis(),
                r.waiting,
                r.regenerated_without_b,
                r.b_before_regeneration,
                r.bad_written
            );
        }
    }
    let field = |r: Option<RunReport>, f: fn(&RunReport) -> u64| {
        r.map_or_else(|| "-".to_owned(), |r| f(&r).to_string())
    };
    println!(
        "drops_with_wait={} drops_without_wait={} stream_gaps_with_wait={}",
        field(with, |r| r.drops),
        field(without, |r| r.drops),
        field(with, |r| r.stream.gaps + r.stream.resets),
    );
    Ok(())
}

/// One run: build everything, restart A's agent while B is late, measure.
pub async fn run_once(binaries: &Binaries, with_wait: bool) -> anyhow::Result<RunReport> {
    let dir = tempfile::Builder::new()
        .prefix("meshwork-proof-")
        .tempdir()?;
    let topo = Topology::build()?;
    let etcd_a = EtcdServer::start()?;
    let etcd_b = EtcdServer::start()?;
    let cluster_a = cluster("a", 1);
    let cluster_b = cluster("b", 2);
    let _kv_a = seed(&etcd_a, &cluster_a, POD_A, NODE_A).await?;
    let kv_b = seed(&etcd_b, &cluster_b, POD_B, NODE_B).await?;

    let mut agent_b = ProofAgent::new(dir.path(), "b", 2, "a", &etcd_a.endpoint())?;
    let mut agent_a = ProofAgent::new(dir.path(), "a", 1, "b", &etcd_b.endpoint())?;
    agent_b.start(binaries, "1m").await?;
    agent_a.start(binaries, "1m").await?;
    for agent in [&agent_a, &agent_b] {
        Wait::new("the remote cluster ready")
            .timeout(Duration::from_secs(30))
            .until_async(|| agent.mesh_ready(), |ready| *ready)
            .await
            .with_context(|| format!("agent {}: {}", agent.cluster, agent.log_tail()))?;
    }
    let id_a = cluster_a.identity(0);
    let id_b = cluster_b.identity(0);
    agent_b
        .add_endpoint(endpoint(
            ENDPOINT_B,
            LXC_B,
            topo.node_b.path(),
            POD_B,
            id_b,
            id_a,
        ))
        .await?;
    agent_a
        .add_endpoint(endpoint(
            ENDPOINT_A,
            LXC_A,
            topo.node_a.path(),
            POD_A,
            id_a,
            id_b,
        ))
        .await?;

    let stream = Stream::start(&topo.pod_a, &topo.pod_b, POD_B)?;
    Wait::new("the stream flowing")
        .timeout(Duration::from_secs(10))
        .until(|| stream.received(), |received| *received >= 200)?;
    let drops_before = agent_a.drops()?;

    // A goes down; B's canaries vanish (its state is being re-synced); A comes back.
    agent_a.stop();
    for (key, _) in cluster_b.canaries() {
        kv_b.delete(&key).await?;
    }
    let wait = if with_wait { "1m" } else { "0s" };
    agent_a.start(binaries, wait).await?;
    let back = Instant::now();
    let sampler = Sampler {
        agent: &agent_a,
        kv_b: &kv_b,
        cluster_b: &cluster_b,
        back,
        samples: Cell::default(),
        canaries_written: Cell::new(false),
        regenerated_at: Cell::new(None),
    };
    let sampled = Wait::new("endpoint A regenerated onto a map holding pod B")
        .timeout(SAMPLING_TIMEOUT)
        .every(SAMPLE_INTERVAL)
        .until_async(|| sampler.sample(), |done| !matches!(done, Ok(false)))
        .await;
    match sampled {
        Ok(Ok(_)) => {}
        Ok(Err(err)) => return Err(err),
        Err(timeout) => bail!("{timeout}; agent log:\n{}", agent_a.log_tail()),
    }
    let samples = sampler.samples.get();
    let mut report = RunReport {
        drops: 0,
        stream: stream.finish(),
        regenerated_without_b: samples.regenerated_without_b,
        b_before_regeneration: samples.b_before_regeneration,
        waiting: samples.waiting,
        bad_written: 0,
    };
    for (ip, _) in bad_entries(&cluster_b) {
        if agent_a.ipcache_has(ip)? {
            report.bad_written += 1;
        }
    }
    report.drops = agent_a.drops()? - drops_before;
    Ok(report)
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
    netns: &std::path::Path,
    ip: &str,
    identity: u32,
    allow: u32,
) -> pb::Endpoint {
    pb::Endpoint {
        id,
        interface: interface.to_owned(),
        netns: netns.display().to_string(),
        ips: vec![ip.to_owned()],
        identity,
        allowed_identities: vec![allow],
        host: false,
        ..pb::Endpoint::default()
    }
}

/// How long after A's restart the sampling may take at most.
const SAMPLING_TIMEOUT: Duration = Duration::from_secs(60);
/// How often A's endpoint and map are sampled.
const SAMPLE_INTERVAL: Duration = Duration::from_millis(20);
/// How long the stream keeps going on the regenerated program before the run ends.
const AFTER_REGENERATION: Duration = Duration::from_secs(1);

/// Counts of what the samples saw.
#[derive(Debug, Clone, Copy, Default)]
struct Samples {
    waiting: u32,
    regenerated_without_b: u32,
    b_before_regeneration: u32,
}

/// Samples A's endpoint and map after its restart, writes B's canaries back once B has been
/// late long enough, and says when the run is done. Its counters live in cells: a wait's
/// observation borrows it only shared.
struct Sampler<'a> {
    agent: &'a ProofAgent,
    kv_b: &'a EtcdBackend,
    cluster_b: &'a Cluster,
    back: Instant,
    samples: Cell<Samples>,
    canaries_written: Cell<bool>,
    regenerated_at: Cell<Option<Instant>>,
}

impl Sampler<'_> {
    /// One sample; `Ok(true)` once A regenerated onto a map holding B after B's canaries
    /// came back, and the stream ran on it a while.
    async fn sample(&self) -> anyhow::Result<bool> {
        // The endpoint's state first, then the map: a regenerated endpoint must find B there.
        let state = self.agent.endpoint(ENDPOINT_A).await?;
        let has_b = self.agent.ipcache_has(POD_B)?;
        let regenerated = state
            .as_ref()
            .is_some_and(|(_, generation)| *generation > 0);
        let mut samples = self.samples.get();
        if state.as_ref().is_some_and(|(s, _)| s == "waiting-for-sync") {
            samples.waiting += 1;
        }
        match (regenerated, has_b) {
            (true, false) => samples.regenerated_without_b += 1,
            (false, true) => samples.b_before_regeneration += 1,
            _ => {}
        }
        self.samples.set(samples);
        if !self.canaries_written.get() && self.back.elapsed() >= LATE_BY {
            self.kv_b.put_many(self.cluster_b.canaries(), 100).await?;
            self.canaries_written.set(true);
        }
        if regenerated && has_b && self.canaries_written.get() {
            let at = self.regenerated_at.get().unwrap_or_else(Instant::now);
            self.regenerated_at.set(Some(at));
            // Keep the stream going a while on the regenerated program.
            return Ok(at.elapsed() >= AFTER_REGENERATION);
        }
        Ok(false)
    }
}
