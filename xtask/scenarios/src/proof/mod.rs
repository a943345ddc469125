//! The no-drop proof (`cargo xtask proof`): a TCP stream from pod A to pod B (another
//! cluster) through A's endpoint program; A's agent restarts while cluster B's state arrives
//! late. With the bounded wait: no drops, no gap. Without it
//! (`--clustermesh-ip-identities-sync-timeout=0s`): A regenerates onto a map without B and
//! drops — proof that the check can fail.
//!
//! It runs on one of two scenes ([`Scene`]): Meshwork meshed with itself (the demo's
//! clusters, state written by their apiservers; B is late because its etcd is down while A
//! restarts), or with `--fixtures` two clusters whose etcd holds Cilium-format state written
//! by hand, hostile entries included (B is late because its canaries are withdrawn).
//!
//! On the mesh two more figures run beside the stream. Pod A opens new connections (20/s) to
//! a global service whose only backends are cluster B's pods, through A's socket-LB: with the
//! wait the restored service entries serve until B is back; without it
//! (`--clustermesh-sync-timeout=0s` too) they are pruned while B is late, and connects fail.
//! And every cross-cluster packet goes through userspace WireGuard tunnels between the node
//! namespaces, with a second stream (UDP, pod B → pod A) that only WireGuard can break: with
//! the wait A keeps B's restored peers until B's nodes are known; without it they are pruned
//! while B is late, and that stream stalls.

mod connects;
mod fixtures;
mod fixtures_net;
mod on_mesh;
pub mod stream;
pub mod table;
pub mod timeline;
mod wg_stream;

use std::cell::Cell;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;
use meshwork_lab::cgroup::ChildCgroup;
use meshwork_lab::net::Netns;
use meshwork_lab::wait::Wait;

use self::connects::{ConnectReport, Connects};
use self::stream::{Stream, StreamReport};
use self::wg_stream::WgStream;
use crate::binaries::{self, Binaries};
use crate::node_agent::NodeAgent;

/// How long B's state stays away after A's agent is back.
pub const LATE_BY: Duration = Duration::from_secs(3);

/// `meshwork-scenarios proof`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Run only one variant: `with-wait` or `without-wait`.
    #[arg(long)]
    pub only: Option<String>,
    /// Run on two clusters whose etcd holds hand-written Cilium-format state (hostile entries
    /// included) instead of on Meshwork meshed with itself.
    #[arg(long)]
    pub fixtures: bool,
    /// Run the agent, meshctl and apiserver already next to this binary instead of building
    /// them first, as a test does after its workspace build.
    #[arg(long)]
    pub no_build: bool,
}

/// Which scene a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SceneKind {
    /// Meshwork meshed with itself: state written by each cluster's apiserver.
    Mesh,
    /// Hand-written Cilium-format state.
    Fixtures,
}

/// What a run needs of its scene: the agent that restarts, the two pods, and how cluster
/// B's state goes away and comes back.
pub trait Scene {
    /// A's agent (the one that restarts).
    fn agent_a(&self) -> &NodeAgent;
    /// The same, to restart it.
    fn agent_a_mut(&mut self) -> &mut NodeAgent;
    /// A's pod (the stream's client) and B's pod (its server).
    fn pods(&self) -> (&Netns, &Netns);
    /// Pod B's IP.
    fn pod_b(&self) -> &str;
    /// A's endpoint's ID.
    fn endpoint_a(&self) -> u64;
    /// Makes B's state unavailable while A is down.
    async fn withdraw_b(&mut self) -> anyhow::Result<()>;
    /// Brings B's state back ([`LATE_BY`] after A is up again).
    async fn restore_b(&mut self) -> anyhow::Result<()>;
    /// Hostile remote entries found in A's ipcache map.
    fn bad_written(&self) -> anyhow::Result<u32>;
    /// The global service pod A connects to through socket-LB, when the scene has one.
    fn global_service(&self) -> Option<GlobalService<'_>> {
        None
    }
    /// When traffic between the clusters goes through WireGuard: pod B (the WireGuard
    /// stream's client), pod A (its server) and pod A's IP.
    fn wireguard_stream(&self) -> Option<(&Netns, &Netns, &str)> {
        None
    }
}

/// A global service of the scene whose only backends are cluster B's pods.
pub struct GlobalService<'a> {
    /// A's node cgroup, where A's socket-LB runs (the client joins it).
    pub cgroup: &'a ChildCgroup,
    /// B's pods (namespace, IP), where its backends listen.
    pub backends: Vec<(&'a Netns, &'a str)>,
    /// Its VIP.
    pub vip: &'a str,
}

/// What one run measured.
#[derive(Debug, Clone)]
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
    /// New connections to the global service, when the scene has one.
    pub connects: Option<ConnectReport>,
    /// The stream that only WireGuard can break, when the scene has tunnels.
    pub wg_stream: Option<StreamReport>,
}

/// Runs both variants and prints the figures.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let binaries = if args.no_build {
        binaries::built()?
    } else {
        binaries::build()?
    };
    let kind = if args.fixtures {
        SceneKind::Fixtures
    } else {
        SceneKind::Mesh
    };
    let with = match args.only.as_deref() {
        None | Some("with-wait") => Some(Box::pin(run_once(&binaries, kind, true)).await?),
        _ => None,
    };
    let without = match args.only.as_deref() {
        None | Some("without-wait") => Some(Box::pin(run_once(&binaries, kind, false)).await?),
        _ => None,
    };
    for (name, report) in [("with wait", &with), ("without wait (0s)", &without)] {
        if let Some(r) = report {
            println!("{}", table::details(name, r));
        }
    }
    if with.is_some() && without.is_some() {
        let page = timeline::side_by_side(kind)?;
        println!("timelines side by side: {}", page.display());
    }
    println!("\n{}", table::table(with.as_ref(), without.as_ref()));
    println!("{}", table::closing_line(with.as_ref(), without.as_ref()));
    Ok(())
}

/// One run on a fresh scene of `kind`.
pub async fn run_once(
    binaries: &Binaries,
    kind: SceneKind,
    with_wait: bool,
) -> anyhow::Result<RunReport> {
    let dir = tempfile::Builder::new()
        .prefix("meshwork-proof-")
        .tempdir()?;
    let picture = timeline::path(kind, with_wait);
    match kind {
        SceneKind::Mesh => {
            let scene = Box::pin(on_mesh::MeshScene::build(binaries, dir.path())).await?;
            Box::pin(restart_a(binaries, scene, with_wait, &picture)).await
        }
        SceneKind::Fixtures => {
            let scene = Box::pin(fixtures::FixtureScene::build(binaries, dir.path())).await?;
            Box::pin(restart_a(binaries, scene, with_wait, &picture)).await
        }
    }
}

/// The run proper: the stream flowing, A restarted while B is late, sampled until A runs on
/// a map holding B; then A's timeline drawn into `picture`.
async fn restart_a<S: Scene>(
    binaries: &Binaries,
    mut scene: S,
    with_wait: bool,
    picture: &Path,
) -> anyhow::Result<RunReport> {
    let (client, server) = scene.pods();
    let stream = Stream::start(client, server, scene.pod_b())?;
    let connects = match scene.global_service() {
        Some(service) => Some(Connects::start(
            client,
            service.cgroup,
            &service.backends,
            service.vip,
        )?),
        None => None,
    };
    let wg_stream = match scene.wireguard_stream() {
        Some((client, server, server_ip)) => Some(WgStream::start(client, server, server_ip)?),
        None => None,
    };
    Wait::new("the stream flowing")
        .timeout(Duration::from_secs(10))
        .until(|| stream.received(), |received| *received >= 200)?;
    let mut wg_stream = wg_stream;
    if let Some(wg_stream) = &mut wg_stream {
        Wait::new("the WireGuard stream flowing")
            .timeout(Duration::from_secs(10))
            .until(|| wg_stream.received(), |received| *received >= 200)?;
        wg_stream.count_from_here();
    }
    let mut connects = connects;
    if let Some(connects) = &mut connects {
        // Counted once the service reached A's maps and connections succeed.
        Wait::new("new connections to the global service succeeding")
            .timeout(Duration::from_secs(30))
            .until(|| connects.ok(), |ok| *ok >= 20)?;
        connects.count_from_here();
    }
    let drops_before = scene.agent_a().drops()?;

    // A goes down; B's state goes away; A comes back.
    scene.agent_a_mut().stop();
    scene.withdraw_b().await?;
    let wait = if with_wait { "1m" } else { "0s" };
    scene.agent_a_mut().start(binaries, wait).await?;
    let back = Instant::now();
    // B is late: sample until it has been for LATE_BY, then bring it back and sample until
    // A runs on a map holding B (and a while after).
    let samples = Sampler::new(&scene, Samples::default())
        .until(|_| back.elapsed() >= LATE_BY)
        .await?;
    scene.restore_b().await?;
    let regenerated_at: Cell<Option<Instant>> = Cell::new(None);
    let samples = Sampler::new(&scene, samples)
        .until(|sample| {
            if !(sample.regenerated && sample.has_b) {
                return false;
            }
            let at = regenerated_at.get().unwrap_or_else(Instant::now);
            regenerated_at.set(Some(at));
            at.elapsed() >= AFTER_REGENERATION
        })
        .await?;
    timeline::save(binaries, scene.agent_a(), with_wait, picture).await;
    Ok(RunReport {
        stream: stream.finish(),
        regenerated_without_b: samples.regenerated_without_b,
        b_before_regeneration: samples.b_before_regeneration,
        waiting: samples.waiting,
        bad_written: scene.bad_written()?,
        drops: scene.agent_a().drops()? - drops_before,
        connects: connects.map(Connects::finish),
        wg_stream: wg_stream.map(WgStream::finish),
    })
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

/// One sample of A: whether its endpoint has regenerated and whether its map holds pod B.
#[derive(Debug, Clone, Copy)]
struct Sample {
    regenerated: bool,
    has_b: bool,
}

/// Samples A's endpoint and map after its restart, counting what it sees. Its counters live
/// in a cell: a wait's observation borrows it only shared.
struct Sampler<'a, S> {
    scene: &'a S,
    samples: Cell<Samples>,
}

impl<'a, S: Scene> Sampler<'a, S> {
    fn new(scene: &'a S, samples: Samples) -> Self {
        Self {
            scene,
            samples: Cell::new(samples),
        }
    }

    /// Samples every [`SAMPLE_INTERVAL`] until `done` says so (at most [`SAMPLING_TIMEOUT`]);
    /// the counts so far.
    async fn until(self, done: impl Fn(Sample) -> bool) -> anyhow::Result<Samples> {
        let sampled = Wait::new("endpoint A regenerated onto a map holding pod B")
            .timeout(SAMPLING_TIMEOUT)
            .every(SAMPLE_INTERVAL)
            .until_async(
                || self.sample(),
                |sample| match sample {
                    Ok(sample) => done(*sample),
                    Err(_) => true,
                },
            )
            .await;
        match sampled {
            Ok(Ok(_)) => Ok(self.samples.get()),
            Ok(Err(err)) => Err(err),
            Err(timeout) => bail!("{timeout}; agent log:\n{}", self.scene.agent_a().log_tail()),
        }
    }

    async fn sample(&self) -> anyhow::Result<Sample> {
        // The endpoint's state first, then the map: a regenerated endpoint must find B there.
        let agent = self.scene.agent_a();
        let state = agent.endpoint(self.scene.endpoint_a()).await?;
        let has_b = agent.ipcache_has(self.scene.pod_b())?;
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
        Ok(Sample { regenerated, has_b })
    }
}
