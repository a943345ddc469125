//! `cargo xtask bench sync`: remote clusters in Cilium's format, synced by a real
//! `meshwork-agent`, against the floor of reading the same keys raw from the same etcds.
//!
//! 1. Time from agent start to `IPIdentitiesSynced` (asked through the agent's `WaitSynced`)
//!    vs the raw paginated range read of every remote key, all clusters at once.
//! 2. Propagation: a put in a remote etcd → the event at the ipcache consumer, p50/p99 at a
//!    paced rate, measured in-process on the same actors the agent runs.
//! 3. The agent's peak RSS holding 1M remote ipcache entries.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Actor;
use anyhow::{Context, bail};
use meshwork_agent_core::clustermesh::barrier::SyncBarrier;
use meshwork_agent_core::clustermesh::barrier_actor::{GetMeshWait, SyncBarrierActor};
use meshwork_agent_core::clustermesh::config_dir::{ClusterConfigEvent, RemoteClusterConfig};
use meshwork_agent_core::clustermesh::identity_actor::IdentityCacheActor;
use meshwork_agent_core::clustermesh::mesh::{ClusterMesh, ShutdownMesh};
use meshwork_agent_core::clustermesh::remote_cluster::runner::MeshSettings;
use meshwork_agent_core::clustermesh::remote_cluster::stores::Sinks;
use meshwork_agent_core::clustermesh::remote_state::RemoteStateActor;
use meshwork_agent_core::clustermesh::{SyncKind, WaitOutcome};
use meshwork_agent_core::kvstore::{
    EtcdBackend, EtcdConfig, KvstoreMetrics, etcd::DEFAULT_PAGE_SIZE, keys,
};
use meshwork_agent_core::types::IpCacheEntry;
use meshwork_lab::cilium::{Cluster, Sizes};
use meshwork_lab::etcd::{EtcdOptions, EtcdServer};
use meshwork_lab::process::LabProcess;
use meshwork_proto::agent::v1::{
    SyncKind as PbSyncKind, WaitSyncedRequest, agent_client::AgentClient,
};
use tokio::sync::mpsc;

use crate::measure::{median, ms, peak_rss_mib};
use crate::{binaries, floor};

const RATIO_GOAL: f64 = 1.30;
const P99_GOAL_MS: f64 = 5.0;
const RSS_GOAL_MIB: u64 = 250;

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
    /// Rounds of the sync figure; medians are reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Remote ipcache entries for the memory figure (spread over the clusters); 0 skips it.
    #[arg(long, default_value_t = 1_000_000)]
    rss_entries: u32,
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

    // Rounds alternate which goes first; medians are reported.
    let mut floors = Vec::new();
    let mut agents = Vec::new();
    for round in 0..args.rounds {
        if round % 2 == 0 {
            floors.push(raw_read(&servers, &clusters).await?);
            agents.push(agent_sync(&agent_bin, &servers, &clusters).await?.0);
        } else {
            agents.push(agent_sync(&agent_bin, &servers, &clusters).await?.0);
            floors.push(raw_read(&servers, &clusters).await?);
        }
        println!(
            "  round {}: raw read {:>7.1} ms   agent → IPIdentitiesSynced {:>7.1} ms",
            round + 1,
            ms(floors[round]),
            ms(agents[round])
        );
    }
    let floor = median(&mut floors);
    let agent_time = median(&mut agents);
    let ratio = agent_time.as_secs_f64() / floor.as_secs_f64();
    println!(
        "  raw paginated range read of every key, all clusters at once: {:>8.1} ms",
        ms(floor)
    );
    println!(
        "  agent start → IPIdentitiesSynced:                              {:>8.1} ms  ({ratio:.2}x, goal ≤ {RATIO_GOAL:.2})",
        ms(agent_time)
    );

    let (p50, p99) = propagation(&servers[0], &clusters[0], args.rate, args.puts).await?;
    println!(
        "  propagation put → ipcache consumer at {} puts/s ({} puts): p50 {p50:.2} ms, p99 {p99:.2} ms (goal p99 ≤ {P99_GOAL_MS:.1} ms)",
        args.rate, args.puts
    );
    drop(servers);

    let rss = if args.rss_entries > 0 {
        let per_cluster = args.rss_entries.div_ceil(args.clusters);
        let sizes = Sizes {
            nodes: 100,
            services: 10,
            identities: 1000,
            ipcache: per_cluster,
        };
        let (servers, clusters) = start_clusters(args.clusters, sizes).await?;
        let (_, rss) = agent_sync(&agent_bin, &servers, &clusters).await?;
        println!(
            "  agent peak RSS holding {} remote ipcache entries: {rss} MiB (goal ≤ {RSS_GOAL_MIB} MiB)",
            per_cluster * args.clusters
        );
        rss
    } else {
        0
    };
    println!("ratio={ratio:.2} p99_ms={p99:.2} rss_mib_1m={rss}");
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
            name: Some(cluster.name.clone()),
            ..EtcdOptions::default()
        })?;
        let backend = connect(&server).await?;
        let started = Instant::now();
        let (key, value) = cluster.config();
        backend.put(&key, value).await?;
        let state = cluster.state();
        let count = state.len();
        backend.put_many(state, 5000).await?;
        backend.put_many(cluster.canaries(), 100).await?;
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

async fn connect(server: &EtcdServer) -> anyhow::Result<EtcdBackend> {
    Ok(EtcdBackend::connect(
        &EtcdConfig::new([server.endpoint()]),
        Duration::from_secs(10),
    )
    .await?)
}

/// Every key the agent reads, read raw: all clusters and prefixes at once, pages in sequence.
pub(crate) async fn raw_read(
    servers: &[EtcdServer],
    clusters: &[Cluster],
) -> anyhow::Result<Duration> {
    let mut reads = Vec::new();
    for (server, cluster) in servers.iter().zip(clusters) {
        let backend = connect(server).await?;
        for prefix in [
            format!("{}/{}/", keys::NODES_PREFIX, cluster.name),
            format!("{}/{}/", keys::SERVICES_PREFIX, cluster.name),
            format!("{}/", keys::IDENTITY_ID_PREFIX),
            format!("{}/", keys::IPCACHE_DEFAULT_PREFIX),
        ] {
            reads.push((backend.clone(), prefix));
        }
    }
    let started = Instant::now();
    let tasks: Vec<_> = reads
        .into_iter()
        .map(|(backend, prefix)| {
            tokio::spawn(
                async move { floor::read_prefix(&backend, &prefix, DEFAULT_PAGE_SIZE).await },
            )
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(started.elapsed())
}

/// Writes `<dir>/clustermesh` with one config file per cluster (its etcd endpoint).
pub(crate) fn write_mesh_config(
    dir: &Path,
    servers: &[EtcdServer],
    clusters: &[Cluster],
) -> anyhow::Result<std::path::PathBuf> {
    let config = dir.join("clustermesh");
    std::fs::create_dir(&config)?;
    for (server, cluster) in servers.iter().zip(clusters) {
        std::fs::write(
            config.join(&cluster.name),
            format!("endpoints:\n- {}\n", server.endpoint()),
        )?;
    }
    Ok(config)
}

/// Starts the agent on `clusters`, asks `WaitSynced(IP_IDENTITIES)`; returns the time from
/// the agent's start and its peak RSS in MiB.
async fn agent_sync(
    agent: &Path,
    servers: &[EtcdServer],
    clusters: &[Cluster],
) -> anyhow::Result<(Duration, u64)> {
    let dir = tempfile::tempdir()?;
    let config = write_mesh_config(dir.path(), servers, clusters)?;
    let socket = dir.path().join("agent.sock");
    let mut command = Command::new(agent);
    command
        .args([
            "--cluster-name",
            "bench-local",
            "--cluster-id",
            "200",
            "--prometheus-serve-addr",
            "",
        ])
        .arg("--clustermesh-config")
        .arg(&config)
        .arg("--enable-bpf-datapath=false")
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--api-socket")
        .arg(&socket)
        .arg("--clustermesh-sync-timeout")
        .arg("10m")
        .env("RUST_LOG", "warn");
    let started = Instant::now();
    let mut process = LabProcess::spawn("meshwork-agent", command, &dir.path().join("agent.log"))?;
    let channel = loop {
        process.check_running()?;
        if let Ok(channel) = meshwork_proto::connect_unix(&socket).await {
            break channel;
        }
        if started.elapsed() > Duration::from_secs(30) {
            bail!(
                "the agent's socket did not appear; log:\n{}",
                process.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
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
    let rss = peak_rss_mib(Some(process.pid()));
    process.stop(Duration::from_secs(10));
    Ok((elapsed, rss))
}

/// Puts new ipcache entries into `server` at `rate` per second and times each until the
/// in-process ipcache consumer sees it.
async fn propagation(
    server: &EtcdServer,
    cluster: &Cluster,
    rate: u32,
    puts: u32,
) -> anyhow::Result<(f64, f64)> {
    let (tap_tx, mut tap_rx) = mpsc::unbounded_channel::<Arc<IpCacheEntry>>();
    let barrier = SyncBarrierActor::new(SyncBarrier::new(Duration::from_secs(600))).start();
    let state = RemoteStateActor::new(barrier.clone().recipient())
        .with_ipcache_tap(tap_tx)
        .start();
    let sinks = Sinks {
        barrier: barrier.clone().recipient(),
        state: state.recipient(),
        identities: IdentityCacheActor::default().start().recipient(),
    };
    let mesh = ClusterMesh::new(
        MeshSettings::new("bench-local"),
        200,
        sinks,
        KvstoreMetrics::default(),
    )
    .start();
    let config = RemoteClusterConfig {
        name: cluster.name.clone(),
        etcd: EtcdConfig::new([server.endpoint()]),
        hash: 0,
    };
    mesh.send(ClusterConfigEvent::Upsert {
        name: cluster.name.clone(),
        config,
    })
    .await?;
    let wait = barrier.send(GetMeshWait(SyncKind::IpIdentities)).await?;
    if wait.wait(None).await? != WaitOutcome::Synced {
        bail!("the in-process mesh did not sync");
    }
    // The initial list's events are in the tap too; drain them before timing.
    while tap_rx.try_recv().is_ok() {}

    let backend = connect(server).await?;
    let first = cluster.sizes.ipcache + 1000;
    let receiver = tokio::spawn(async move {
        let mut seen = HashMap::new();
        while seen.len() < puts as usize {
            match tokio::time::timeout(Duration::from_secs(30), tap_rx.recv()).await {
                Ok(Some(entry)) => {
                    seen.entry(entry.key_name()).or_insert_with(Instant::now);
                }
                _ => break,
            }
        }
        seen
    });
    let interval = Duration::from_secs(1) / rate.max(1);
    let started = Instant::now();
    let mut sent = HashMap::new();
    let mut inflight = Vec::new();
    for n in 0..puts {
        // Paced against the clock, not by sleeping a fixed step, so the rate holds on average.
        let due = started + interval * n;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            tokio::time::sleep(wait).await;
        }
        let (key, value) = cluster.ipcache(first + n);
        let relative = key
            .trim_start_matches(&format!("{}/", keys::IPCACHE_DEFAULT_PREFIX))
            .to_owned();
        sent.insert(relative, Instant::now());
        let backend = backend.clone();
        inflight.push(tokio::spawn(async move { backend.put(&key, value).await }));
    }
    for put in inflight {
        put.await??;
    }
    let seen = receiver.await?;
    if seen.len() < puts as usize {
        bail!("only {} of {puts} puts reached the consumer", seen.len());
    }
    let mut latencies: Vec<f64> = sent
        .iter()
        .map(|(key, at)| {
            seen.get(key)
                .map_or(f64::MAX, |got| ms(got.saturating_duration_since(*at)))
        })
        .collect();
    // The in-process mesh stops here, before its etcd does.
    mesh.send(ShutdownMesh).await?;
    latencies.sort_by(f64::total_cmp);
    let pick = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    Ok((pick(0.50), pick(0.99)))
}
