//! `cargo xtask bench mesh-scale`: Cilium's clustermesh scale-test shape. 250 remote
//! clusters, each its own etcd holding 100 nodes, 100 identities and 1,000 ipcache entries;
//! one `meshwork-apiserver kvstoremesh` caching them all in the local etcd; one
//! `meshwork-agent` reading every remote through that cache.
//!
//! Each round measures two pairs, each subject against its floor, back to back:
//! 1. kvstoremesh start → every cache canary written, against a raw copy: list every remote
//!    and write the same keys (config, entries, canaries) to an empty local etcd in
//!    transactions of 128 (etcd's default `--max-txn-ops`), each under a lease of at most
//!    1,000 keys, as cilium-semantics §8 has kvstoremesh write them;
//! 2. agent start → `IPIdentitiesSynced` on the filled cache, against a raw paginated read of
//!    every cache prefix; both after one unmeasured read of the cache, so neither pays for
//!    meeting an etcd fresh from its bulk load.
//!
//! `cache_ratio=` and `agent_ratio=` are the medians of the per-round ratios. Then, once, the
//! whole bootstrap: kvstoremesh and then the agent started on an empty local etcd, until the
//! agent is synced. The remotes' etcds keep their data on a ramfs, where their WAL segments
//! stay sparse (see [`meshwork_lab::ramfs`]).

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::{StreamExt as _, TryStreamExt as _};
use meshwork_clustermesh::remote_cluster::prefixes::ClusterPrefixes;
use meshwork_kvstore::etcd::DEFAULT_PAGE_SIZE;
use meshwork_kvstore::keys::SYNCED_PREFIX;
use meshwork_kvstore::lease_writer::MAX_KEYS_PER_LEASE;
use meshwork_kvstore::{EtcdBackend, KeyWrite, WatchEvent};
use meshwork_lab::cilium::{Cluster, Sizes};
use meshwork_lab::etcd::{EtcdOptions, EtcdServer};
use meshwork_lab::kvstoremesh::{KvstoremeshOptions, KvstoremeshProcess};
use meshwork_lab::ramfs::Ramfs;
use meshwork_types::ClusterConfig;

use crate::bench_sync::{AgentRun, agent_sync_with};
use crate::measure::{
    Rounds, back_to_back, cpu_time, mem_available_mib, ms, odd_rounds, peak_rss_mib,
};
use crate::{binaries, floor, load};

const CACHE_GOAL: f64 = 1.5;
const AGENT_GOAL: f64 = 1.3;
const BOOTSTRAP_GOAL: Duration = Duration::from_secs(60);
/// The local cluster's ID: above every remote's.
const LOCAL_ID: u32 = 255;
const LOCAL: &str = "bench-local";
/// How long kvstoremesh may take to write every canary.
const CACHE_TIMEOUT: Duration = Duration::from_secs(600);
/// Remotes loaded at once.
const LOADS_IN_FLIGHT: usize = 16;
/// etcd's default `--max-txn-ops`, which the raw copy keeps to as kvstoremesh does.
const OPS_PER_TXN: usize = 128;
/// kvstoremesh's lease TTL (Cilium's 15 minutes), which the raw copy's leases have too.
const LEASE_TTL_S: i64 = 15 * 60;

/// Options of the mesh-scale benchmark.
#[derive(clap::Args)]
pub struct Args {
    /// Remote clusters, each its own etcd (IDs 1..=N; the local cluster is 255).
    #[arg(long, default_value_t = 250, value_parser = clap::value_parser!(u32).range(1..=254))]
    clusters: u32,
    /// Nodes per remote.
    #[arg(long, default_value_t = 100)]
    nodes: u32,
    /// Identities per remote.
    #[arg(long, default_value_t = 100)]
    identities: u32,
    /// ipcache entries per remote.
    #[arg(long, default_value_t = 1_000)]
    ipcache: u32,
    /// Rounds (odd), each both pairs back to back; the ratios are medians of per-round ratios.
    #[arg(long, default_value_t = 3, value_parser = odd_rounds)]
    rounds: usize,
}

/// Runs the benchmark.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let binaries = binaries::build()?;
    let sizes = Sizes {
        nodes: args.nodes,
        services: 0,
        identities: args.identities,
        ipcache: args.ipcache,
    };
    println!(
        "mesh-scale benchmark: {} remote clusters, each its own etcd with {} nodes, {} identities and {} ipcache entries; one kvstoremesh, one agent reading through it",
        args.clusters, sizes.nodes, sizes.identities, sizes.ipcache
    );
    let ramfs = Ramfs::mount().context("mounting a ramfs for the remotes' etcds")?;
    let (servers, clusters) = start_remotes(args.clusters, sizes, &ramfs).await?;
    let dir = tempfile::tempdir()?;
    let remote_config = dir.path().join("kvstoremesh-config");
    let agent_config = dir.path().join("agent-config");
    for dir in [&remote_config, &agent_config] {
        std::fs::create_dir(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    for (server, cluster) in servers.iter().zip(&clusters) {
        meshwork_lab::agent::write_cluster_config(
            &remote_config,
            &cluster.name,
            &server.endpoint(),
        )?;
    }

    let mut cache_rounds = Rounds::default();
    let mut agent_rounds = Rounds::default();
    let (mut agent_rss, mut kvstoremesh_rss) = (0, 0);
    for round in 0..args.rounds {
        let copy = || raw_copy(&servers, &clusters);
        let fill = || {
            fill_cache(
                &binaries.apiserver,
                &remote_config,
                dir.path(),
                round,
                &clusters,
            )
        };
        let (copy, (cache, local)) = back_to_back(round, copy, fill).await?;
        kvstoremesh_rss = kvstoremesh_rss.max(cache.peak_rss_mib);

        write_agent_config(&agent_config, &clusters, &local)?;
        // A read first, not measured: the etcd has just taken a bulk load (its last batch
        // maybe not yet committed, its heap sized for writing), and whichever of the pair
        // went first paid for that — up to twice the other's etcd CPU. An agent that restarts
        // meets a long-running etcd.
        raw_read_cache(&local, &clusters).await?;
        let etcd_cpu = || local.pid().map_or(Duration::ZERO, cpu_time);
        let read = || async {
            let before = etcd_cpu();
            let took = raw_read_cache(&local, &clusters).await?;
            anyhow::Ok((took, etcd_cpu().saturating_sub(before)))
        };
        let agent = || async {
            let before = etcd_cpu();
            let run = agent_sync_with(&binaries.agent, &agent_config, LOCAL_ID).await?;
            anyhow::Ok((run, etcd_cpu().saturating_sub(before)))
        };
        let ((read, read_etcd), (agent, agent_etcd)): ((Duration, Duration), (AgentRun, Duration)) =
            back_to_back(round, read, agent).await?;
        agent_rss = agent_rss.max(agent.peak_rss_mib);
        drop(local);

        let (cache_ratio, agent_ratio) = (
            cache.copy.elapsed.as_secs_f64() / copy.elapsed.as_secs_f64(),
            agent.elapsed.as_secs_f64() / read.as_secs_f64(),
        );
        println!(
            "  round {}: raw copy {:>7.0} ms (cpu {:.0} ms, local etcd cpu {:.0} ms)   kvstoremesh → every canary {:>7.0} ms (cpu {:.0} ms, local etcd cpu {:.0} ms, peak rss {} MiB)   ratio {cache_ratio:.2}",
            round + 1,
            ms(copy.elapsed),
            ms(copy.copier_cpu),
            ms(copy.local_etcd_cpu),
            ms(cache.copy.elapsed),
            ms(cache.copy.copier_cpu),
            ms(cache.copy.local_etcd_cpu),
            cache.peak_rss_mib,
        );
        println!(
            "           raw read of the cache {:>5.0} ms (etcd cpu {:.0} ms)   agent → IPIdentitiesSynced {:>7.0} ms (up in {:.0} ms; cpu {:.0} ms, etcd cpu {:.0} ms, peak rss {} MiB)   ratio {agent_ratio:.2}",
            ms(read),
            ms(read_etcd),
            ms(agent.elapsed),
            ms(agent.up),
            ms(agent.cpu),
            ms(agent_etcd),
            agent.peak_rss_mib,
        );
        cache_rounds.push(cache_ratio, ());
        agent_rounds.push(agent_ratio, ());
    }
    let (cache_ratio, _) = cache_rounds.median().context("no rounds")?;
    let (agent_ratio, _) = agent_rounds.median().context("no rounds")?;
    println!(
        "  per-round ratios: cache {}   agent {}",
        cache_rounds.ratios_line(),
        agent_rounds.ratios_line()
    );
    println!(
        "  kvstoremesh start → every cache canary: ratio {cache_ratio:.2} to the raw copy (goal ≤ {CACHE_GOAL:.2})"
    );
    println!(
        "  agent start → IPIdentitiesSynced through the cache: ratio {agent_ratio:.2} to the raw read (goal ≤ {AGENT_GOAL:.2})"
    );

    let (bootstrap, rss) = bootstrap(
        &binaries,
        &remote_config,
        &agent_config,
        dir.path(),
        &clusters,
    )
    .await?;
    kvstoremesh_rss = kvstoremesh_rss.max(rss.0);
    agent_rss = agent_rss.max(rss.1);
    println!(
        "  bootstrap, kvstoremesh start → agent synced on an empty local etcd: {:.1} s (goal ≤ {} s)",
        bootstrap.as_secs_f64(),
        BOOTSTRAP_GOAL.as_secs()
    );
    println!("  peak RSS: agent {agent_rss} MiB, kvstoremesh {kvstoremesh_rss} MiB");
    drop(servers);
    drop(ramfs);
    println!(
        "cache_ratio={cache_ratio:.2} agent_ratio={agent_ratio:.2} bootstrap_s={:.1} agent_rss_mib={agent_rss} kvstoremesh_rss_mib={kvstoremesh_rss}",
        bootstrap.as_secs_f64()
    );
    Ok(())
}

/// Starts one etcd per remote (data on `ramfs`) and loads each; says what they cost.
async fn start_remotes(
    count: u32,
    sizes: Sizes,
    ramfs: &Ramfs,
) -> anyhow::Result<(Vec<EtcdServer>, Vec<Cluster>)> {
    let clusters: Vec<Cluster> = (1..=count)
        .map(|id| Cluster {
            name: format!("cluster-{id}"),
            id,
            sizes,
        })
        .collect();
    let available_before = mem_available_mib();
    let started = Instant::now();
    let servers = EtcdServer::start_many(clusters.iter().map(|c| EtcdOptions {
        name: Some(c.name.clone()),
        max_txn_ops: Some(1000),
        // Hundreds of servers: no idle-spinning Go threads each.
        max_procs: Some(1),
        data_parent: Some(ramfs.path().to_owned()),
        ..EtcdOptions::default()
    }))
    .context("starting the remotes' etcds")?;
    let start_took = started.elapsed();
    let loaded = Instant::now();
    let keys: usize = futures::stream::iter(servers.iter().zip(&clusters))
        .map(|(server, cluster)| async move {
            let backend = load::connect(&server.endpoint()).await?;
            anyhow::Ok(load::load(&backend, cluster).await?)
        })
        .buffer_unordered(LOADS_IN_FLIGHT)
        .try_collect::<Vec<usize>>()
        .await?
        .into_iter()
        .sum();
    let rss: u64 = servers
        .iter()
        .filter_map(EtcdServer::pid)
        .map(|pid| peak_rss_mib(Some(pid)))
        .sum();
    println!(
        "  {count} etcds started in {:.1} s, {keys} keys loaded in {:.1} s; they hold {rss} MiB RSS ({} MiB each), {} MiB on ramfs; available memory {} → {} MiB",
        start_took.as_secs_f64(),
        loaded.elapsed().as_secs_f64(),
        rss / u64::from(count.max(1)),
        ramfs.used_bytes() / (1024 * 1024),
        available_before,
        mem_available_mib(),
    );
    Ok((servers, clusters))
}

/// An empty local etcd, as a fresh cluster's.
fn local_etcd() -> anyhow::Result<EtcdServer> {
    Ok(EtcdServer::start_with(EtcdOptions {
        name: Some(LOCAL.to_owned()),
        data_in_memory: true,
        ..EtcdOptions::default()
    })?)
}

/// What one side of the cache pair measured.
struct CopyRun {
    elapsed: Duration,
    /// CPU of the local etcd meanwhile.
    local_etcd_cpu: Duration,
    /// CPU of the copier (this process for the raw copy, kvstoremesh for the cache).
    copier_cpu: Duration,
}

/// The floor of the cache: every remote listed and its keys written to an empty local etcd
/// as kvstoremesh writes them, all remotes at once. Connecting is not timed.
async fn raw_copy(servers: &[EtcdServer], clusters: &[Cluster]) -> anyhow::Result<CopyRun> {
    let local_server = local_etcd()?;
    let local = load::connect(&local_server.endpoint()).await?;
    let mut remotes = Vec::new();
    for (server, cluster) in servers.iter().zip(clusters) {
        remotes.push((
            load::connect(&server.endpoint()).await?,
            cluster.name.clone(),
        ));
    }
    let etcd_before = local_server.pid().map_or(Duration::ZERO, cpu_time);
    // This process does nothing else meanwhile: its CPU is the copier's.
    let copier_before = cpu_time(std::process::id());
    let started = Instant::now();
    let copies: Vec<_> = remotes
        .into_iter()
        .map(|(remote, name)| {
            let local = local.clone();
            tokio::spawn(async move { copy_cluster(&remote, &local, &name).await })
        })
        .collect();
    for copy in copies {
        copy.await??;
    }
    let elapsed = started.elapsed();
    Ok(CopyRun {
        elapsed,
        local_etcd_cpu: local_server
            .pid()
            .map_or(Duration::ZERO, cpu_time)
            .saturating_sub(etcd_before),
        copier_cpu: cpu_time(std::process::id()).saturating_sub(copier_before),
    })
}

/// One remote's config, entries and canaries, copied raw into the cache layout.
async fn copy_cluster(remote: &EtcdBackend, local: &EtcdBackend, name: &str) -> anyhow::Result<()> {
    let (state, cache) = (
        ClusterPrefixes::new(name, false),
        ClusterPrefixes::new(name, true),
    );
    let mut writes = Vec::new();
    let config = ClusterConfig::key(name);
    if let Some((value, _)) = remote.get(&config).await? {
        writes.push((config, value));
    }
    let pairs = [
        (&state.nodes, &cache.nodes),
        (&state.services, &cache.services),
        (&state.identities, &cache.identities),
        (&state.ipcache, &cache.ipcache),
    ];
    for (from, to) in pairs {
        let from = format!("{}/", from.watch);
        for (key, value) in floor::list_prefix(remote, &from, DEFAULT_PAGE_SIZE).await? {
            let rest = String::from_utf8_lossy(&key[from.len()..]).into_owned();
            writes.push((format!("{}/{rest}", to.watch), value));
        }
    }
    let mut leases = Leases::default();
    put_leased(local, &mut leases, writes).await?;
    let canaries = [
        &cache.nodes,
        &cache.services,
        &cache.identities,
        &cache.ipcache,
    ]
    .map(|p| {
        (
            format!("{SYNCED_PREFIX}/{name}/{}", p.canary),
            b"2026-12-01T00:00:00Z".to_vec(),
        )
    });
    put_leased(local, &mut leases, canaries.into()).await?;
    Ok(())
}

/// The lease the raw copy of one remote puts keys under, and the room left on it.
#[derive(Default)]
struct Leases {
    current: i64,
    room: usize,
}

/// Writes `pairs` in transactions of [`OPS_PER_TXN`], every key under a lease as kvstoremesh
/// writes it (at most [`MAX_KEYS_PER_LEASE`] keys a lease, its TTL), going on with
/// `leases`' current one.
async fn put_leased(
    local: &EtcdBackend,
    leases: &mut Leases,
    pairs: Vec<(String, Vec<u8>)>,
) -> anyhow::Result<()> {
    let mut writes = Vec::with_capacity(pairs.len());
    for (key, value) in pairs {
        if leases.room == 0 {
            leases.current = local.lease_grant(LEASE_TTL_S).await?;
            leases.room = MAX_KEYS_PER_LEASE;
        }
        leases.room -= 1;
        writes.push(KeyWrite::Put {
            key,
            value,
            lease: leases.current,
        });
    }
    local.write_batch(&writes, OPS_PER_TXN).await?;
    Ok(())
}

/// What one kvstoremesh run to every canary measured.
struct CacheRun {
    copy: CopyRun,
    peak_rss_mib: u64,
}

/// kvstoremesh on an empty local etcd, from its start until every remote's four cache
/// canaries are written; answers the filled etcd (kvstoremesh stopped).
async fn fill_cache(
    apiserver: &Path,
    config: &Path,
    logs: &Path,
    round: usize,
    clusters: &[Cluster],
) -> anyhow::Result<(CacheRun, EtcdServer)> {
    let local = local_etcd()?;
    let options = KvstoremeshOptions::new(
        apiserver,
        (LOCAL, LOCAL_ID),
        &local.endpoint(),
        config,
        logs,
    )?;
    let canaries = canaries_written(&local, clusters.len() * 4).await?;
    let etcd_before = local.pid().map_or(Duration::ZERO, cpu_time);
    let started = Instant::now();
    let mut process = KvstoremeshProcess::start(&options, u32::try_from(round + 1)?)?;
    let done = tokio::time::timeout(CACHE_TIMEOUT, canaries)
        .await
        .with_context(|| {
            format!(
                "kvstoremesh did not cache every remote: {}",
                process.log_tail()
            )
        })???;
    let pid = process.process().pid();
    let run = CacheRun {
        copy: CopyRun {
            elapsed: done.duration_since(started),
            local_etcd_cpu: local
                .pid()
                .map_or(Duration::ZERO, cpu_time)
                .saturating_sub(etcd_before),
            copier_cpu: cpu_time(pid),
        },
        peak_rss_mib: peak_rss_mib(Some(pid)),
    };
    process.process().stop(Duration::from_secs(10));
    check_cache(&local, clusters).await?;
    Ok((run, local))
}

/// Fails unless `local`'s cache holds every remote key (the figures are of the whole state:
/// an entry kvstoremesh refused would make them of less).
async fn check_cache(local: &EtcdServer, clusters: &[Cluster]) -> anyhow::Result<()> {
    let backend = load::connect(&local.endpoint()).await?;
    let expected: usize = clusters.iter().map(|c| c.state().len()).sum();
    let cached = floor::read_prefix(&backend, "cilium/cache/", DEFAULT_PAGE_SIZE).await?;
    if cached != expected {
        bail!("the cache holds {cached} keys, the remotes {expected}: kvstoremesh refused some");
    }
    Ok(())
}

/// A task that ends at the instant `expected` distinct cache canaries have been put in
/// `local` (the watch is open before this returns).
async fn canaries_written(
    local: &EtcdServer,
    expected: usize,
) -> anyhow::Result<tokio::task::JoinHandle<anyhow::Result<Instant>>> {
    let backend = load::connect(&local.endpoint()).await?;
    let mut watch = backend.watch(&format!("{SYNCED_PREFIX}/"), 0).await?;
    Ok(tokio::spawn(async move {
        let mut seen = HashSet::new();
        while seen.len() < expected {
            let Some(events) = watch.next().await? else {
                bail!("the local etcd closed the canary watch");
            };
            for event in events {
                if let WatchEvent::Put { key, .. } = event {
                    seen.insert(key);
                }
            }
        }
        Ok(Instant::now())
    }))
}

/// The floor of the agent's sync: every cache prefix the agent watches, read raw from the
/// filled local etcd, all at once.
async fn raw_read_cache(local: &EtcdServer, clusters: &[Cluster]) -> anyhow::Result<Duration> {
    let backend = load::connect(&local.endpoint()).await?;
    let reads = clusters
        .iter()
        .flat_map(|cluster| {
            let p = ClusterPrefixes::new(&cluster.name, true);
            [p.nodes, p.services, p.identities, p.ipcache].map(|p| format!("{}/", p.watch))
        })
        .map(|prefix| (backend.clone(), prefix))
        .collect();
    floor::read_all(reads).await
}

/// Every remote's config file pointing at `local` (as an agent behind kvstoremesh has it).
fn write_agent_config(dir: &Path, clusters: &[Cluster], local: &EtcdServer) -> anyhow::Result<()> {
    for cluster in clusters {
        meshwork_lab::agent::write_cluster_config(dir, &cluster.name, &local.endpoint())?;
    }
    Ok(())
}

/// kvstoremesh and then the agent started on an empty local etcd; the time from
/// kvstoremesh's start until the agent is synced, and (kvstoremesh, agent) peak RSS.
async fn bootstrap(
    binaries: &binaries::Binaries,
    remote_config: &Path,
    agent_config: &Path,
    logs: &Path,
    clusters: &[Cluster],
) -> anyhow::Result<(Duration, (u64, u64))> {
    let local = local_etcd()?;
    write_agent_config(agent_config, clusters, &local)?;
    let options = KvstoremeshOptions::new(
        &binaries.apiserver,
        (LOCAL, LOCAL_ID),
        &local.endpoint(),
        remote_config,
        logs,
    )?;
    let started = Instant::now();
    let mut kvstoremesh = KvstoremeshProcess::start(&options, 0)?;
    let agent = agent_sync_with(&binaries.agent, agent_config, LOCAL_ID).await?;
    let took = started.elapsed();
    let rss = peak_rss_mib(Some(kvstoremesh.process().pid()));
    kvstoremesh.process().stop(Duration::from_secs(10));
    Ok((took, (rss, agent.peak_rss_mib)))
}
