//! `cargo xtask bench sync`: remote clusters in Cilium's format, synced by a real
//! `meshwork-agent`, against the floor of reading the same keys raw from the same etcds.
//!
//! 1. Time from agent start to `IPIdentitiesSynced` (asked through the agent's `WaitSynced`)
//!    vs the raw paginated range read of every remote key, all clusters at once, back to back
//!    in each round; `ratio=` is the median of the per-round ratios, `cpu_ratio=` the median
//!    of the per-round ratios of the agent's CPU (its whole life to that answer) to the raw
//!    reader's.
//! 2. Propagation: a put in a remote etcd → the event at the ipcache consumer, p50/p99 at a
//!    paced rate, measured on an in-process agent (the agent's own wiring), and how far that
//!    p99 lies above a raw etcd watch's p99 of the same puts (`p99_over_watch_ms=`).
//! 3. The agent's peak RSS holding 1M remote ipcache entries.
//!
//! `examples/sync_profile.rs` runs each side alone on the same data, for profilers.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use meshwork_kvstore::keys;
use meshwork_lab::agent::{AgentOptions, AgentProcess};
use meshwork_lab::cilium::{Cluster, Sizes};
use meshwork_lab::etcd::{EtcdOptions, EtcdServer};
use meshwork_proto::agent::v1::{
    SyncKind as PbSyncKind, WaitSyncedRequest, agent_client::AgentClient,
};

use crate::measure::{Rounds, back_to_back, cpu_time, ms, odd_rounds, peak_rss_mib};
use crate::{binaries, floor, load, propagation};

const RATIO_GOAL: f64 = 1.15;
const CPU_RATIO_GOAL: f64 = 2.0;
/// How far the consumer's p99 may lie above the raw watch's.
const P99_OVER_WATCH_GOAL_MS: f64 = 0.3;
const RSS_GOAL_MIB: u64 = 160;
/// The measured agents' log filter: warnings only (logging is not what is measured; the
/// lab's launcher still gets the line saying the agent runs).
pub(crate) const AGENT_LOG: &str = "warn";

/// Options of the sync benchmark.
#[derive(clap::Args)]
pub struct Args {
    /// Remote clusters.
    #[arg(long, default_value_t = 4)]
    clusters: u32,
    /// ipcache entries per cluster.
    #[arg(long, default_value_t = 50_000)]
    ipcache: u32,
    /// Identities per cluster.
    #[arg(long, default_value_t = 10_000)]
    identities: u32,
    /// Nodes per cluster.
    #[arg(long, default_value_t = 1_000)]
    nodes: u32,
    /// Services per cluster.
    #[arg(long, default_value_t = 500)]
    services: u32,
    /// Puts per second for the propagation figure.
    #[arg(long, default_value_t = 2_000)]
    rate: u32,
    /// Puts in the propagation figure.
    #[arg(long, default_value_t = 4_000)]
    puts: u32,
    /// Rounds of the sync figure (odd), each the raw read and the agent back to back;
    /// `ratio=` is the median of the per-round ratios. Single rounds vary by ±20% here (the
    /// shared machine's speed changes from one phase to the next), so an odd number above 5.
    #[arg(long, default_value_t = 9, value_parser = odd_rounds)]
    rounds: usize,
    /// Remote ipcache entries of the memory figure, each point an agent sync of its own
    /// (spread over the clusters), in ascending order: the agent's peak RSS at each, and the
    /// bytes each entry adds between points. `rss_mib_1m=` is the point at 1,000,000 (0 when
    /// absent); `--rss-points 0` skips the figure.
    #[arg(long, value_delimiter = ',', default_values_t = [100_000, 500_000, 1_000_000])]
    rss_points: Vec<u32>,
}

/// Runs the benchmark.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let agent_bin = binaries::build()?.agent;
    let sizes = Sizes {
        nodes: args.nodes,
        services: args.services,
        identities: args.identities,
        ipcache: args.ipcache,
    };
    println!(
        "sync benchmark: {} remote clusters × ({} ipcache, {} identities, {} nodes, {} services)",
        args.clusters, sizes.ipcache, sizes.identities, sizes.nodes, sizes.services
    );
    let (servers, clusters) = start_clusters(args.clusters, sizes).await?;

    // Rounds alternate which goes first; `ratio=` is the median of the per-round ratios,
    // `cpu_ratio=` the median of the per-round CPU ratios (not necessarily the same round).
    let mut rounds = Rounds::default();
    let mut cpu_rounds = Rounds::default();
    for round in 0..args.rounds {
        let raw = || async {
            let etcd_before = etcd_cpu(&servers);
            // This process does nothing else meanwhile: its CPU is the raw reader's.
            let reader_before = cpu_time(std::process::id());
            let elapsed = raw_read(&servers, &clusters).await?;
            let reader = cpu_time(std::process::id()).saturating_sub(reader_before);
            anyhow::Ok((
                elapsed,
                etcd_cpu(&servers).saturating_sub(etcd_before),
                reader,
            ))
        };
        let synced = || async {
            let etcd_before = etcd_cpu(&servers);
            let run = agent_sync(&agent_bin, &servers, &clusters).await?;
            anyhow::Ok((run, etcd_cpu(&servers).saturating_sub(etcd_before)))
        };
        let ((raw_time, raw_etcd, reader_cpu), (run, agent_etcd)) =
            back_to_back(round, raw, synced).await?;
        let ratio = run.elapsed.as_secs_f64() / raw_time.as_secs_f64();
        let cpu_ratio = run.cpu.as_secs_f64() / reader_cpu.as_secs_f64().max(0.001);
        println!(
            "  round {}: raw read {:>7.1} ms (etcd cpu {:>5.0} ms, reader cpu {:>4.0} ms)   agent → IPIdentitiesSynced {:>7.1} ms (etcd cpu {:>5.0} ms, agent cpu {:>5.0} ms, peak rss {} MiB)   ratio {ratio:.2}, cpu ratio {cpu_ratio:.2}",
            round + 1,
            ms(raw_time),
            ms(raw_etcd),
            ms(reader_cpu),
            ms(run.elapsed),
            ms(agent_etcd),
            ms(run.cpu),
            run.peak_rss_mib,
        );
        rounds.push(ratio, (raw_time, run.elapsed));
        cpu_rounds.push(cpu_ratio, (reader_cpu, run.cpu));
    }
    let (ratio, &(floor, agent_time)) = rounds.median().context("no rounds")?;
    let (cpu_ratio, &(reader_cpu, agent_cpu)) = cpu_rounds.median().context("no rounds")?;
    println!("  per-round ratios: {}", rounds.ratios_line());
    println!("  per-round cpu ratios: {}", cpu_rounds.ratios_line());
    println!("  median round (its ratio is the median of the per-round ratios):");
    println!(
        "    raw paginated range read of every key, all clusters at once {:>8.1} ms",
        ms(floor)
    );
    println!(
        "    agent start → IPIdentitiesSynced                            {:>8.1} ms  (ratio {ratio:.2}, goal ≤ {RATIO_GOAL:.2})",
        ms(agent_time)
    );
    println!("  median cpu round (its ratio is the median of the per-round cpu ratios):");
    println!(
        "    raw reader cpu {:>6.0} ms, agent cpu {:>6.0} ms (ratio {cpu_ratio:.2}, goal ≤ {CPU_RATIO_GOAL:.2})",
        ms(reader_cpu),
        ms(agent_cpu)
    );

    let figures = propagation::measure(&servers[0], &clusters[0], args.rate, args.puts).await?;
    let p99 = figures.consumer.p99;
    let over_watch = p99 - figures.raw_watch.p99;
    println!(
        "  propagation at {} puts/s ({} puts), put issued → ...  p50      p99",
        args.rate, args.puts
    );
    for (what, p) in [
        ("etcd acknowledges the put       ", figures.ack),
        ("raw etcd watch sees it (floor)  ", figures.raw_watch),
        ("an observer of the agent has it ", figures.consumer),
    ] {
        println!("    {what} {:>6.2} ms {:>6.2} ms", p.p50, p.p99);
    }
    println!(
        "  consumer p99 {p99:.2} ms: {over_watch:.2} ms above the raw watch's p99 (goal ≤ {P99_OVER_WATCH_GOAL_MS:.1} ms)"
    );
    drop(servers);

    let rss = memory_curve(&agent_bin, args.clusters, &args.rss_points).await?;
    println!(
        "ratio={ratio:.2} cpu_ratio={cpu_ratio:.2} p99_ms={p99:.2} p99_over_watch_ms={over_watch:.2} rss_mib_1m={rss}"
    );
    Ok(())
}

pub(crate) async fn start_clusters(
    count: u32,
    sizes: Sizes,
) -> anyhow::Result<(Vec<EtcdServer>, Vec<Cluster>)> {
    let mut servers = Vec::new();
    let mut clusters = Vec::new();
    for id in 1..=count {
        let cluster = Cluster {
            name: format!("cluster-{id}"),
            id,
            sizes,
        };
        let server = EtcdServer::start_with(EtcdOptions {
            max_txn_ops: Some(10_000),
            data_in_memory: true,
            // Four servers on a small machine: no idle-spinning Go threads next to the agent.
            max_procs: Some(1),
            name: Some(cluster.name.clone()),
            ..EtcdOptions::default()
        })?;
        let started = Instant::now();
        let count = load::load(&load::connect(&server.endpoint()).await?, &cluster).await?;
        println!(
            "  loaded {} with {count} keys in {:.1} s",
            cluster.name,
            started.elapsed().as_secs_f64()
        );
        servers.push(server);
        clusters.push(cluster);
    }
    Ok((servers, clusters))
}

/// Every key the agent reads, read raw: all clusters and prefixes at once, pages in sequence.
pub(crate) async fn raw_read(
    servers: &[EtcdServer],
    clusters: &[Cluster],
) -> anyhow::Result<Duration> {
    let mut reads = Vec::new();
    for (server, cluster) in servers.iter().zip(clusters) {
        let backend = load::connect(&server.endpoint()).await?;
        for prefix in [
            format!("{}/{}/", keys::NODES_PREFIX, cluster.name),
            format!("{}/{}/", keys::SERVICES_PREFIX, cluster.name),
            format!("{}/", keys::IDENTITY_ID_PREFIX),
            format!("{}/", keys::IPCACHE_DEFAULT_PREFIX),
        ] {
            reads.push((backend.clone(), prefix));
        }
    }
    floor::read_all(reads).await
}

/// What one agent run to `IPIdentitiesSynced` measured.
pub(crate) struct AgentRun {
    /// From the agent's start to the answer of `WaitSynced`.
    pub(crate) elapsed: Duration,
    /// From the agent's start until its API socket answered (the process start).
    pub(crate) up: Duration,
    /// CPU time the agent used until then.
    pub(crate) cpu: Duration,
    /// Its peak RSS.
    pub(crate) peak_rss_mib: u64,
}

/// CPU time all `servers` have used so far.
fn etcd_cpu(servers: &[EtcdServer]) -> Duration {
    servers
        .iter()
        .filter_map(EtcdServer::pid)
        .map(cpu_time)
        .sum()
}

/// Starts the agent on `clusters` and asks `WaitSynced(IP_IDENTITIES)`.
async fn agent_sync(
    agent: &Path,
    servers: &[EtcdServer],
    clusters: &[Cluster],
) -> anyhow::Result<AgentRun> {
    let dir = tempfile::tempdir()?;
    let config = load::write_mesh_config(dir.path(), servers, clusters)?;
    agent_sync_with(agent, &config, 200).await
}

/// Starts the agent of cluster ID `local_id` on the clustermesh config `config` and asks
/// `WaitSynced(IP_IDENTITIES)`.
pub(crate) async fn agent_sync_with(
    agent: &Path,
    config: &Path,
    local_id: u32,
) -> anyhow::Result<AgentRun> {
    let dir = tempfile::tempdir()?;
    let options = AgentOptions::new(agent, "bench-local", local_id, &dir.path().join("state"))
        .clustermesh_config(config)
        .flags(["--clustermesh-sync-timeout", "10m"])
        .env("RUST_LOG", AGENT_LOG);
    let started = Instant::now();
    // Blocks until the API socket accepts connections (the sync itself takes far longer),
    // on this thread on purpose: lab processes die with the thread that started them.
    let mut process = AgentProcess::start(&options)?;
    let up = started.elapsed();
    let channel = meshwork_proto::connect_unix(process.socket())
        .await
        .context("connecting to the agent's API")?;
    let response = AgentClient::new(channel)
        .wait_synced(WaitSyncedRequest {
            kinds: vec![PbSyncKind::IpIdentities as i32],
            timeout_ms: 600_000,
        })
        .await
        .context("WaitSynced")?
        .into_inner();
    let elapsed = started.elapsed();
    if response.breaker_fired {
        bail!("the circuit breaker fired: the agent did not sync");
    }
    let run = AgentRun {
        elapsed,
        up,
        cpu: cpu_time(process.pid()),
        peak_rss_mib: peak_rss_mib(Some(process.pid())),
    };
    process.stop(Duration::from_secs(10));
    Ok(run)
}

/// The agent's peak RSS after syncing each point's remote ipcache entries, and what each entry
/// adds between points; answers the RSS at 1M entries (0 when that is not a point).
async fn memory_curve(agent_bin: &Path, clusters: u32, points: &[u32]) -> anyhow::Result<u64> {
    let points: Vec<u32> = points.iter().copied().filter(|&n| n > 0).collect();
    if points.is_empty() {
        return Ok(0);
    }
    println!("  agent peak RSS by remote ipcache entries held (with 4,000 identities, 400 nodes):");
    println!("      entries   peak RSS   per entry   per entry added since the point before");
    let mut at_1m = 0;
    let mut before: Option<(u32, u64)> = None;
    for entries in points {
        let per_cluster = entries.div_ceil(clusters);
        let sizes = Sizes {
            nodes: 100,
            services: 10,
            identities: 1000,
            ipcache: per_cluster,
        };
        let (servers, cluster_set) = start_clusters(clusters, sizes).await?;
        let rss = agent_sync(agent_bin, &servers, &cluster_set)
            .await?
            .peak_rss_mib;
        drop(servers);
        let held = per_cluster * clusters;
        let per_entry = (rss << 20) / u64::from(held);
        let added = before.map_or(String::new(), |(n, r)| {
            let bytes = (rss.saturating_sub(r) << 20) / u64::from(held.saturating_sub(n).max(1));
            format!("{bytes:>6} B")
        });
        println!("    {held:>9} {rss:>7} MiB {per_entry:>7} B   {added}");
        if held == 1_000_000 {
            at_1m = rss;
            println!(
                "  agent peak RSS holding 1000000 remote ipcache entries: {rss} MiB (goal ≤ {RSS_GOAL_MIB} MiB)"
            );
        }
        before = Some((held, rss));
    }
    Ok(at_1m)
}
