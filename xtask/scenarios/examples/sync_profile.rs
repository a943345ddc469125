//! The profiling harness of `cargo xtask bench sync`: the same remote clusters, with each
//! side of the benchmark runnable alone, so a profiler (callgrind, perf, heaptrack) sees one
//! thing at a time and load-independent figures (instructions, allocations, bytes) can be
//! taken on a busy machine.
//!
//! ```sh
//! cargo build --release -p meshwork-scenarios -p meshwork-agent -p meshctl \
//!     -p meshwork-apiserver --bins --example sync_profile   # the bench's package set
//! H=target/release/examples/sync_profile
//! $H serve --dir /tmp/sync &            # 4 etcds loaded as bench sync loads them; ^C stops
//! $H raw --dir /tmp/sync                # the floor: every key read raw (etcd-client's Range)
//! $H raw --dir /tmp/sync --in-place     # the same keys read as the agent's lists read them
//! $H store --dir /tmp/sync              # the agent's ipcache path in process: allocations
//!                                       # and heap bytes per entry
//! $H agent --dir /tmp/sync --bin target/release/meshwork-agent   # start → IPIdentitiesSynced
//! valgrind --tool=callgrind $H store --dir /tmp/sync   # instructions per entry
//! $H kvstoremesh --dir /tmp/sync --bin target/release/meshwork-apiserver  # start → canaries
//! $H serve-cache --dir /tmp/cache &     # 250 remotes already cached in one etcd
//! $H agent --dir /tmp/cache --bin target/release/meshwork-agent --cluster-id 255
//! $H raw --dir /tmp/cache --cached      # the floor of that: the cache prefixes read raw
//! $H configs --dir /tmp/cache [--batched]  # the remotes' first reads, one transaction each
//!                                       # or sent together as the agent's connection does
//! ```
//!
//! `--bin` may be a wrapper script that `exec`s a profiler on the agent.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use actix::{Actor, Context, Handler};
use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use meshwork_clustermesh::barrier_actor::BarrierUpdate;
use meshwork_clustermesh::events::{
    ClusterRef, Forwarder, IdentityEvents, IpCacheRoute, RemoteEvents, Sinks,
};
use meshwork_clustermesh::remote_cluster::prefixes::ClusterPrefixes;
use meshwork_clustermesh::remote_cluster::runner::read_cluster_config;
use meshwork_kvstore::{EtcdBackend, EtcdConfig, WatchStore, WatchStoreOptions, keys};
use meshwork_lab::agent::{AgentOptions, AgentProcess, write_cluster_config};
use meshwork_lab::cilium::{Cluster, Sizes};
use meshwork_lab::etcd::{EtcdOptions, EtcdServer};
use meshwork_lab::kvstoremesh::{KvstoremeshOptions, KvstoremeshProcess};
use meshwork_lab::proc_stat::{STAT_MINFLT, STAT_UTIME, cpu_time, stat_sum};
use meshwork_proto::agent::v1::{SyncKind, WaitSyncedRequest, agent_client::AgentClient};
use meshwork_types::{IpCacheDecoder, IpCacheEntryDecoder, RemoteEvent};
use tokio_util::sync::CancellationToken;

/// Counts every allocation and the bytes live, to report both per synced entry.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator, whose contract the
// caller already meets; the counters are plain atomics and never allocate.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        LIVE_BYTES.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: `ptr` came from this allocator (so from `System`) with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        LIVE_BYTES.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        // SAFETY: forwarded as received; `ptr` came from `System` with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

// The bench's floor itself, not a copy of it.
#[path = "../src/floor.rs"]
#[allow(dead_code)]
mod floor;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Starts and loads the remote etcds, writes `<dir>/clustermesh`, and runs until ^C.
    Serve {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 4)]
        clusters: u32,
        #[arg(long, default_value_t = 50_000)]
        ipcache: u32,
        #[arg(long, default_value_t = 10_000)]
        identities: u32,
        #[arg(long, default_value_t = 1_000)]
        nodes: u32,
        #[arg(long, default_value_t = 500)]
        services: u32,
    },
    /// One local etcd holding `clusters` remotes in kvstoremesh's cache layout (configs with
    /// `cached`, entries under `cilium/cache/`, the cache canaries), as `bench mesh-scale`'s
    /// filled cache, with `<dir>/clustermesh` pointing every remote at it; runs until ^C.
    ServeCache {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 250)]
        clusters: u32,
        #[arg(long, default_value_t = 1_000)]
        ipcache: u32,
        #[arg(long, default_value_t = 100)]
        identities: u32,
        #[arg(long, default_value_t = 100)]
        nodes: u32,
    },
    /// Reads every key the agent reads, raw, as the bench's floor does (etcd-client's Range).
    Raw {
        #[arg(long)]
        dir: PathBuf,
        /// Read the pages as the agent's lists do instead (in place, `ListPage`).
        #[arg(long)]
        in_place: bool,
        /// Read the kvstoremesh cache prefixes (behind `serve-cache`), as `bench
        /// mesh-scale`'s floor does.
        #[arg(long)]
        cached: bool,
    },
    /// Every remote's first read (cluster config, heartbeat, canaries: one transaction
    /// each), all at once over one connection per etcd, as an agent's loops start.
    Configs {
        #[arg(long)]
        dir: PathBuf,
        /// Send the reads that overlap together, as the agent's shared connections do.
        #[arg(long)]
        batched: bool,
    },
    /// `meshwork-apiserver kvstoremesh` caching the remotes of `<dir>/clustermesh` into a
    /// fresh local etcd, from its start until every cache canary is written.
    Kvstoremesh {
        #[arg(long)]
        dir: PathBuf,
        /// The apiserver binary, or a wrapper that execs one under a profiler.
        #[arg(long)]
        bin: PathBuf,
    },
    /// Every cluster's ipcache through the agent's store and forwarder, in process.
    Store {
        #[arg(long)]
        dir: PathBuf,
    },
    /// A real agent process from start to `IPIdentitiesSynced`.
    Agent {
        #[arg(long)]
        dir: PathBuf,
        /// The agent binary, or a wrapper that execs one under a profiler.
        #[arg(long)]
        bin: PathBuf,
        /// The wrapper runs callgrind: dump its counts once synced (`callgrind_control -d`),
        /// so the first dump is the sync alone, without the shutdown.
        #[arg(long)]
        callgrind_dump: bool,
        /// The agent's cluster ID (255 behind `serve-cache`, whose remotes take 1..=250).
        #[arg(long, default_value_t = 200)]
        cluster_id: u32,
        /// The agent's `RUST_LOG`; its log is then kept in `<dir>/agent-state/`.
        #[arg(long)]
        log: Option<String>,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Serve {
            dir,
            clusters,
            ipcache,
            identities,
            nodes,
            services,
        } => {
            let sizes = Sizes {
                nodes,
                services,
                identities,
                ipcache,
            };
            runtime()?.block_on(serve(&dir, clusters, sizes))
        }
        Command::ServeCache {
            dir,
            clusters,
            ipcache,
            identities,
            nodes,
        } => {
            let sizes = Sizes {
                nodes,
                services: 0,
                identities,
                ipcache,
            };
            runtime()?.block_on(serve_cache(&dir, clusters, sizes))
        }
        Command::Raw {
            dir,
            in_place,
            cached,
        } => runtime()?.block_on(raw(&dir, in_place, cached)),
        Command::Agent {
            dir,
            bin,
            callgrind_dump,
            cluster_id,
            log,
        } => runtime()?.block_on(agent(&dir, &bin, callgrind_dump, cluster_id, log)),
        Command::Configs { dir, batched } => runtime()?.block_on(configs(&dir, batched)),
        Command::Kvstoremesh { dir, bin } => runtime()?.block_on(kvstoremesh(&dir, &bin)),
        Command::Store { dir } => actix::System::new().block_on(store(&dir)),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// The remote clusters in `<dir>/clustermesh`: (name, etcd endpoint).
fn clusters_of(dir: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let mut clusters = Vec::new();
    for file in std::fs::read_dir(dir.join("clustermesh"))? {
        let file = file?;
        let text = std::fs::read_to_string(file.path())?;
        let endpoint = text
            .lines()
            .find_map(|line| line.trim().strip_prefix("- "))
            .context("no endpoint")?;
        let name = file.file_name().to_string_lossy().into_owned();
        clusters.push((name, endpoint.to_owned()));
    }
    clusters.sort();
    Ok(clusters)
}

async fn connect(endpoint: &str) -> anyhow::Result<EtcdBackend> {
    Ok(EtcdBackend::connect(&EtcdConfig::new([endpoint]), Duration::from_secs(10)).await?)
}

async fn serve(dir: &Path, count: u32, sizes: Sizes) -> anyhow::Result<()> {
    let mut servers = Vec::new();
    let config = dir.join("clustermesh");
    std::fs::create_dir_all(&config)?;
    for id in 1..=count {
        let cluster = Cluster {
            name: format!("cluster-{id}"),
            id,
            sizes,
        };
        // As bench sync starts its etcds.
        let server = EtcdServer::start_with(EtcdOptions {
            max_txn_ops: Some(10_000),
            data_in_memory: true,
            max_procs: Some(1),
            name: Some(cluster.name.clone()),
            ..EtcdOptions::default()
        })?;
        let backend = connect(&server.endpoint()).await?;
        let (key, value) = cluster.config();
        backend.put(&key, value).await?;
        backend.put_many(cluster.state(), 1000).await?;
        backend.put_many(cluster.canaries(), 1000).await?;
        write_cluster_config(&config, &cluster.name, &server.endpoint())?;
        println!("loaded {}", cluster.name);
        servers.push(server);
    }
    println!("ready: {}", config.display());
    tokio::signal::ctrl_c().await?;
    Ok(())
}

async fn serve_cache(dir: &Path, count: u32, sizes: Sizes) -> anyhow::Result<()> {
    let config = dir.join("clustermesh");
    std::fs::create_dir_all(&config)?;
    let server = EtcdServer::start_with(EtcdOptions {
        max_txn_ops: Some(10_000),
        data_in_memory: true,
        name: Some("cache".to_owned()),
        ..EtcdOptions::default()
    })?;
    let backend = connect(&server.endpoint()).await?;
    for id in 1..=count {
        let cluster = Cluster {
            name: format!("cluster-{id}"),
            id,
            sizes,
        };
        let (state, cache) = (
            ClusterPrefixes::new(&cluster.name, false),
            ClusterPrefixes::new(&cluster.name, true),
        );
        let moves = [
            (&state.nodes, &cache.nodes),
            (&state.services, &cache.services),
            (&state.identities, &cache.identities),
            (&state.ipcache, &cache.ipcache),
        ];
        let entries = cluster.state().into_iter().filter_map(|(key, value)| {
            moves.iter().find_map(|(from, to)| {
                let rest = key.strip_prefix(&format!("{}/", from.watch))?;
                Some((format!("{}/{rest}", to.watch), value.clone()))
            })
        });
        backend.put_many(entries, 1000).await?;
        let (key, _) = cluster.config();
        let value = serde_json::json!({"id": id, "capabilities": {
            "syncedCanaries": true, "cached": true, "maxConnectedClusters": 255}});
        backend.put(&key, value.to_string()).await?;
        let canaries = moves.map(|(_, to)| {
            let key = format!("{}/{}/{}", keys::SYNCED_PREFIX, cluster.name, to.canary);
            (key, b"2026-12-01T00:00:00Z".to_vec())
        });
        backend.put_many(canaries, 1000).await?;
        write_cluster_config(&config, &cluster.name, &server.endpoint())?;
    }
    println!(
        "ready: {} ({count} remotes cached in one etcd)",
        config.display()
    );
    tokio::signal::ctrl_c().await?;
    Ok(())
}

async fn kvstoremesh(dir: &Path, bin: &Path) -> anyhow::Result<()> {
    let remotes = clusters_of(dir)?;
    let local = EtcdServer::start_with(EtcdOptions {
        data_in_memory: true,
        name: Some("local".to_owned()),
        ..EtcdOptions::default()
    })?;
    let backend = connect(&local.endpoint()).await?;
    let mut watch = backend
        .watch(&format!("{}/", keys::SYNCED_PREFIX), 0)
        .await?;
    let logs = tempfile::tempdir()?;
    let options = KvstoremeshOptions::new(
        bin,
        ("local", 255),
        &local.endpoint(),
        &dir.join("clustermesh"),
        logs.path(),
    )?;
    let etcd_before = local.pid().map_or(Duration::ZERO, cpu_time);
    let started = Instant::now();
    let mut process = KvstoremeshProcess::start(&options, 0)?;
    let mut seen = std::collections::HashSet::new();
    while seen.len() < remotes.len() * 4 {
        let Some(events) = watch.next().await? else {
            bail!("the local etcd closed the canary watch");
        };
        for event in events {
            if let meshwork_kvstore::WatchEvent::Put { key, .. } = event {
                seen.insert(key);
            }
        }
    }
    let elapsed = started.elapsed();
    let pid = process.process().pid();
    println!(
        "kvstoremesh: {:.1} ms to every canary of {} remotes, cpu {:.1} ms, local etcd cpu {:.1} ms",
        elapsed.as_secs_f64() * 1e3,
        remotes.len(),
        cpu_time(pid).as_secs_f64() * 1e3,
        local
            .pid()
            .map_or(Duration::ZERO, cpu_time)
            .saturating_sub(etcd_before)
            .as_secs_f64()
            * 1e3,
    );
    process.process().stop(Duration::from_secs(10));
    Ok(())
}

/// The prefixes the agent reads of `cluster`: its state, or its kvstoremesh cache.
fn prefixes(cluster: &str, cached: bool) -> [String; 4] {
    if cached {
        let p = ClusterPrefixes::new(cluster, true);
        return [p.nodes, p.services, p.identities, p.ipcache].map(|p| format!("{}/", p.watch));
    }
    [
        format!("{}/{cluster}/", keys::NODES_PREFIX),
        format!("{}/{cluster}/", keys::SERVICES_PREFIX),
        format!("{}/", keys::IDENTITY_ID_PREFIX),
        format!("{}/", keys::IPCACHE_DEFAULT_PREFIX),
    ]
}

async fn raw(dir: &Path, in_place: bool, cached: bool) -> anyhow::Result<()> {
    let mut tasks = Vec::new();
    let mut backends = Vec::new();
    for (name, backend) in connections(dir, false).await? {
        for prefix in prefixes(&name, cached) {
            backends.push((backend.clone(), prefix));
        }
    }
    let (allocations, cpu) = (ALLOCATIONS.load(Ordering::Relaxed), cpu_ms());
    let started = Instant::now();
    for (backend, prefix) in backends {
        tasks.push(tokio::spawn(async move {
            read_prefix(&backend, &prefix, in_place).await
        }));
    }
    let mut keys = 0;
    for task in tasks {
        keys += task.await??;
    }
    report(
        "raw",
        keys,
        started.elapsed(),
        cpu_ms() - cpu,
        ALLOCATIONS.load(Ordering::Relaxed) - allocations,
    );
    Ok(())
}

/// Each remote of `dir` with its etcd client: one connection per etcd, as the agent and the
/// bench's floor hold, `batched` as the agent's shared connections are.
async fn connections(dir: &Path, batched: bool) -> anyhow::Result<Vec<(String, EtcdBackend)>> {
    let mut connections: std::collections::HashMap<String, EtcdBackend> = Default::default();
    let mut remotes = Vec::new();
    for (name, endpoint) in clusters_of(dir)? {
        let backend = match connections.get(&endpoint) {
            Some(backend) => backend.clone(),
            None => {
                let mut backend = connect(&endpoint).await?;
                if batched {
                    backend = backend.with_batched_reads();
                }
                connections.insert(endpoint, backend.clone());
                backend
            }
        };
        remotes.push((name, backend));
    }
    Ok(remotes)
}

async fn configs(dir: &Path, batched: bool) -> anyhow::Result<()> {
    let reads = connections(dir, batched).await?;
    let cpu = cpu_ms();
    let started = Instant::now();
    let tasks: Vec<_> = reads
        .into_iter()
        .map(|(name, backend)| {
            tokio::spawn(async move { read_cluster_config(&backend, &name).await })
        })
        .collect();
    let count = tasks.len();
    for task in tasks {
        task.await??;
    }
    println!(
        "configs: {count} first reads in {:.1} ms, cpu {} ms",
        ms(started.elapsed()),
        cpu_ms() - cpu
    );
    Ok(())
}

/// Pages through `prefix` at one revision: through etcd-client as the bench's floor does, or
/// `in_place` as the watch store's list does.
async fn read_prefix(backend: &EtcdBackend, prefix: &str, in_place: bool) -> anyhow::Result<u64> {
    if !in_place {
        let page_size = meshwork_kvstore::etcd::DEFAULT_PAGE_SIZE;
        return Ok(floor::read_prefix(backend, prefix, page_size).await? as u64);
    }
    let mut from = prefix.as_bytes().to_vec();
    let (mut revision, mut count) = (0, 0);
    loop {
        let (page, more) = backend
            .list_page(
                prefix,
                &from,
                revision,
                meshwork_kvstore::etcd::DEFAULT_PAGE_SIZE,
            )
            .await?;
        revision = page.revision;
        count += page.len() as u64;
        match page.last() {
            Some(last) if more => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => return Ok(count),
        }
    }
}

/// Drops what it is sent, counting the ipcache entries.
struct Sink {
    entries: Arc<AtomicU64>,
}

impl Actor for Sink {
    type Context = Context<Self>;
}

impl Handler<RemoteEvents> for Sink {
    type Result = ();

    fn handle(&mut self, batch: RemoteEvents, _: &mut Context<Self>) {
        let entries = batch
            .events
            .iter()
            .filter(|event| matches!(event, RemoteEvent::IpCache { .. }))
            .count();
        self.entries.fetch_add(entries as u64, Ordering::Relaxed);
    }
}

impl Handler<BarrierUpdate> for Sink {
    type Result = ();

    fn handle(&mut self, _: BarrierUpdate, _: &mut Context<Self>) {}
}

impl Handler<IdentityEvents> for Sink {
    type Result = ();

    fn handle(&mut self, _: IdentityEvents, _: &mut Context<Self>) {}
}

async fn store(dir: &Path) -> anyhow::Result<()> {
    let clusters = clusters_of(dir)?;
    let mut backends = Vec::new();
    for (name, endpoint) in &clusters {
        backends.push((name.clone(), connect(endpoint).await?));
    }
    let entries = Arc::new(AtomicU64::new(0));
    let sink = Sink {
        entries: Arc::clone(&entries),
    }
    .start();
    let sinks = Sinks {
        barrier: sink.clone().recipient(),
        consumers: vec![sink.clone().recipient()],
        identities: sink.clone().recipient(),
    };
    let (rss, live, allocations, cpu) = (
        rss_kib(),
        LIVE_BYTES.load(Ordering::Relaxed),
        ALLOCATIONS.load(Ordering::Relaxed),
        cpu_ms(),
    );
    let started = Instant::now();
    let mut runs = Vec::new();
    for (id, (name, backend)) in (1..).zip(backends) {
        let cluster = ClusterRef::new(name.as_str(), 1);
        let forwarder = Forwarder::new(cluster, sinks.clone(), IpCacheRoute);
        let decoder = IpCacheEntryDecoder(IpCacheDecoder::new(Some(id)));
        let mut store =
            WatchStore::keyed_by_value(decoder, forwarder, WatchStoreOptions::new(name));
        let cancel = CancellationToken::new();
        let listed = cancel.clone();
        // Stop at the end of the first list: the store is then what the agent holds.
        store.on_sync(move || listed.cancel());
        runs.push(actix::spawn(async move {
            let prefix = format!("{}/", keys::IPCACHE_DEFAULT_PREFIX);
            store.watch(&backend, &prefix, &cancel).await;
            store
        }));
    }
    let mut stores = Vec::new();
    for run in runs {
        stores.push(run.await?);
    }
    let elapsed = started.elapsed();
    let held: usize = stores.iter().map(WatchStore::len).sum();
    // Let the sink handle every batch sent.
    while entries.load(Ordering::Relaxed) < held as u64 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    report(
        "store",
        held as u64,
        elapsed,
        cpu_ms() - cpu,
        ALLOCATIONS.load(Ordering::Relaxed) - allocations,
    );
    let per_entry = |bytes: i64| bytes as f64 / held.max(1) as f64;
    println!(
        "  held: {held} entries, heap {:.1} bytes/entry (requested), rss {:.1} bytes/entry",
        per_entry(LIVE_BYTES.load(Ordering::Relaxed) - live),
        per_entry((rss_kib() - rss) * 1024),
    );
    if held == 0 {
        bail!("no entries");
    }
    drop(stores);
    Ok(())
}

async fn agent(
    dir: &Path,
    bin: &Path,
    callgrind_dump: bool,
    cluster_id: u32,
    log: Option<String>,
) -> anyhow::Result<()> {
    let state = tempfile::tempdir()?;
    let state_dir = match &log {
        Some(_) => dir.join("agent-state"),
        None => state.path().join("state"),
    };
    let options = AgentOptions::new(bin, "bench-local", cluster_id, &state_dir)
        .clustermesh_config(&dir.join("clustermesh"))
        .flags(["--clustermesh-sync-timeout", "10m"])
        .env("RUST_LOG", log.as_deref().unwrap_or("warn"));
    let started = Instant::now();
    let mut process = AgentProcess::start(&options)?;
    let channel = meshwork_proto::connect_unix(process.socket()).await?;
    let response = AgentClient::new(channel)
        .wait_synced(WaitSyncedRequest {
            kinds: vec![SyncKind::IpIdentities as i32],
            timeout_ms: 3_600_000,
        })
        .await?
        .into_inner();
    let elapsed = started.elapsed();
    if response.breaker_fired {
        bail!("the agent did not sync");
    }
    if callgrind_dump {
        std::process::Command::new("callgrind_control")
            .args(["-d", &process.pid().to_string()])
            .status()?;
    }
    let status = std::fs::read_to_string(format!("/proc/{}/status", process.pid()))?;
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", process.pid()))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
            .unwrap_or_default()
    };
    println!(
        "agent: {:.1} ms to IPIdentitiesSynced, cpu {:.1} ms (user {} ms in 10 ms ticks; {} \
         context switches), {} minor faults, VmHWM {}, VmRSS {}",
        elapsed.as_secs_f64() * 1000.0,
        ms(cpu_time(process.pid())),
        stat_sum(&stat, &[STAT_UTIME]) * 10,
        context_switches(process.pid()),
        stat_sum(&stat, &[STAT_MINFLT]),
        field("VmHWM:"),
        field("VmRSS:"),
    );
    process.stop(Duration::from_secs(120));
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn report(what: &str, keys: u64, elapsed: Duration, cpu_ms: u64, allocations: u64) {
    println!(
        "{what}: {keys} keys in {:.1} ms, cpu {cpu_ms} ms, {:.2} allocations/key",
        elapsed.as_secs_f64() * 1000.0,
        allocations as f64 / keys.max(1) as f64
    );
}

/// CPU time of this process in ms (user + system).
fn cpu_ms() -> u64 {
    u64::try_from(cpu_time(std::process::id()).as_millis()).unwrap_or(u64::MAX)
}

/// Context switches of every live thread of `pid`, voluntary or not.
fn context_switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("status")).ok())
        .flat_map(|status| {
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

fn rss_kib() -> i64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}
