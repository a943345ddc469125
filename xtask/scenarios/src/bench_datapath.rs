//! `cargo xtask bench datapath`: ipcache inserts through the agent's `DatapathWriter` actor vs
//! a raw insert loop on an identical pinned LPM map (the floor: one aya `LpmTrie::insert`, so
//! one bpf(2) call, per entry), and the time from agent start to every restored endpoint
//! regenerated with remote clusters synced vs the raw read floor of the sync benchmark. Both
//! figures run in rounds, floor and subject back to back, alternating which goes first; each
//! reports the median of its per-round ratios.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Actor as _;
use anyhow::{Context as _, bail};
use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{Map, MapData};
use meshwork_agent::datapath::OpenMaps;
use meshwork_agent::datapath::socket_lb::SocketLbArgs;
use meshwork_agent::datapath::writer_actor::Stop;
use meshwork_clustermesh::Consumer;
use meshwork_clustermesh::barrier::SyncBarrier;
use meshwork_clustermesh::barrier_actor::SyncBarrierActor;
use meshwork_clustermesh::events::{ClusterRef, RemoteEvents};
use meshwork_datapath::endpoint::{EndpointSpec, EndpointStore};
use meshwork_datapath::ipcache_map::{self, IpCacheKey, IpCacheValue};
use meshwork_datapath::maps::{IPCACHE_MAP, IpCacheKeyData, PinDir};
use meshwork_lab::agent::{AgentOptions, AgentProcess};
use meshwork_lab::bpffs::BpfRoot;
use meshwork_lab::cilium::{Cluster, Sizes};
use meshwork_lab::etcd::EtcdServer;
use meshwork_lab::net::LabNet;
use meshwork_lab::wait::Wait;
use meshwork_proto::agent::v1 as pb;
use meshwork_proto::agent::v1::datapath_client::DatapathClient;
use meshwork_types::{Change, IpCacheEntry, IpIdentityPair, RemoteEvent, Resource};

use crate::bench_sync::{AGENT_LOG, raw_read, start_clusters};
use crate::binaries;
use crate::load::write_mesh_config;
use crate::measure::{Rounds, back_to_back, ms, odd_rounds};

const RATIO_GOAL: f64 = 1.0;
/// Entries per batch handed to the writer, as a store page delivers them.
const BATCH: usize = 1000;
/// How long the agent may take to regenerate the restored endpoint.
const REGEN_TIMEOUT: Duration = Duration::from_secs(300);
/// How often the agent is asked whether the endpoint regenerated.
const REGEN_POLL: Duration = Duration::from_millis(5);

/// Options of the datapath benchmark.
#[derive(clap::Args)]
pub struct Args {
    /// ipcache entries inserted in the insert figure.
    #[arg(long, default_value_t = 200_000)]
    entries: u32,
    /// Rounds of the insert figure (odd), each the raw loop and the writer back to back;
    /// `ratio=` is the median of the per-round ratios.
    #[arg(long, default_value_t = 5, value_parser = odd_rounds)]
    rounds: usize,
    /// Rounds of the regeneration figure (odd), each the raw read and an agent start back to
    /// back; `regen_s` and `floor_s` are the median round's.
    #[arg(long, default_value_t = 3, value_parser = odd_rounds)]
    regen_rounds: usize,
    /// Remote clusters of the regeneration figure.
    #[arg(long, default_value_t = 4)]
    clusters: u32,
    /// ipcache entries per remote cluster of the regeneration figure.
    #[arg(long, default_value_t = 50_000)]
    ipcache: u32,
}

/// Runs the benchmark.
pub async fn run(args: Args) -> anyhow::Result<()> {
    println!(
        "datapath benchmark: {} ipcache inserts × {} rounds; then {} clusters × {} entries to regeneration × {} rounds",
        args.entries, args.rounds, args.clusters, args.ipcache, args.regen_rounds
    );
    let entries: Vec<Arc<IpCacheEntry>> = (0..args.entries).map(entry).collect();
    let rate = |d: Duration| f64::from(args.entries) / d.as_secs_f64();
    let mut inserts = Rounds::default();
    // Not a floor: what batching alone does to the raw loop, so the writer's own cost shows.
    let mut batched = Vec::new();
    let mut desired_bytes = 0;
    for round in 0..args.rounds {
        let (floor, (writer, bytes)) = back_to_back(
            round,
            || async { raw_loop(&entries) },
            || through_writer(&entries),
        )
        .await?;
        // A throughput ratio: the writer's inserts/s over the raw loop's (≥ 1 is faster).
        let ratio = rate(writer) / rate(floor);
        println!(
            "  round {}: raw insert loop {:>7.1} ms   DatapathWriter {:>7.1} ms   ratio {ratio:.2}",
            round + 1,
            ms(floor),
            ms(writer)
        );
        inserts.push(ratio, (floor, writer));
        batched.push(raw_batched(&entries)?);
        desired_bytes = bytes;
    }
    batched.sort();
    let (ratio, &(floor, writer)) = inserts.median().context("no insert rounds")?;
    println!("  per-round insert ratios: {}", inserts.ratios_line());
    println!(
        "  inserts/s in the median round: raw loop {:.0}, DatapathWriter {:.0} (median ratio {ratio:.2}, goal ≥ {RATIO_GOAL:.2})",
        rate(floor),
        rate(writer)
    );
    if let Some(median) = batched.get(batched.len() / 2) {
        println!(
            "  the raw loop batched ({BATCH} a call, same encoded entries): median {:.1} ms, {:.0} inserts/s",
            ms(*median),
            rate(*median)
        );
    }
    println!(
        "  the writer's desired state: {:.1} MiB, {} bytes per entry (hash tables at their load factor)",
        desired_bytes as f64 / f64::from(1 << 20),
        desired_bytes / entries.len().max(1)
    );

    let agent = binaries::build()?.agent;
    let sizes = Sizes {
        nodes: 100,
        services: 10,
        identities: 1000,
        ipcache: args.ipcache,
    };
    let (servers, clusters) = start_clusters(args.clusters, sizes).await?;
    let lab = LabNet::new()?;
    let mut regens = Rounds::default();
    for round in 0..args.regen_rounds {
        let (floor_read, regen) = back_to_back(
            round,
            || raw_read(&servers, &clusters),
            || regeneration(&agent, &lab, &servers, &clusters),
        )
        .await?;
        let ratio = regen.as_secs_f64() / floor_read.as_secs_f64();
        println!(
            "  round {}: raw read of every remote key {:.2} s   agent start → restored endpoint regenerated {:.2} s   ratio {ratio:.2}",
            round + 1,
            floor_read.as_secs_f64(),
            regen.as_secs_f64()
        );
        regens.push(ratio, (floor_read, regen));
    }
    let (regen_ratio, &(floor_read, regen)) = regens.median().context("no regeneration rounds")?;
    println!(
        "  per-round regeneration ratios: {} (median {regen_ratio:.2}; the closing figures are the median round's)",
        regens.ratios_line()
    );
    println!(
        "ratio={ratio:.2} regen_s={:.2} floor_s={:.2}",
        regen.as_secs_f64(),
        floor_read.as_secs_f64()
    );
    Ok(())
}

fn entry(i: u32) -> Arc<IpCacheEntry> {
    let ip = std::net::Ipv4Addr::from(0x0ad6_0000 + i);
    let pair = IpIdentityPair {
        ip: Some(ip.into()),
        host_ip: Some(std::net::Ipv4Addr::new(10, 213, (i >> 8) as u8 & 0x3f, 1).into()),
        id: 70_000 + (i % 1000),
        ..IpIdentityPair::default()
    };
    Arc::new(IpCacheEntry::from_pair(pair).expect("a valid entry"))
}

/// The floor: one insert (one BPF_MAP_UPDATE_ELEM) per entry through aya into a fresh,
/// identical map, opened from its pin independently of the agent's code.
fn raw_loop(entries: &[Arc<IpCacheEntry>]) -> anyhow::Result<Duration> {
    let root = BpfRoot::new()?;
    let pins = PinDir::under(root.path());
    // Created (and pinned) the way the agent creates it, so both maps have the same shape.
    drop(pins.recreate_ipcache()?);
    let data = MapData::from_pin(pins.map(IPCACHE_MAP)).context("opening the pinned ipcache")?;
    let mut map: LpmTrie<MapData, IpCacheKeyData, IpCacheValue> =
        LpmTrie::try_from(Map::from_map_data(data)?)?;
    // Encoding is not the syscall's cost: done before the clock starts.
    let encoded: Vec<(Key<IpCacheKeyData>, IpCacheValue)> = entries
        .iter()
        .map(|e| ipcache_map::encode(e, None).map(|(key, value)| (IpCacheKey::to_aya(&key), value)))
        .collect::<Result<_, _>>()?;
    let started = Instant::now();
    for (key, value) in &encoded {
        map.insert(key, value, 0)?;
    }
    Ok(started.elapsed())
}

/// The raw loop's entries written `BATCH` at a time through the writer's batched call: what
/// batching alone saves, without the writer's bookkeeping.
fn raw_batched(entries: &[Arc<IpCacheEntry>]) -> anyhow::Result<Duration> {
    let root = BpfRoot::new()?;
    let pins = PinDir::under(root.path());
    let mut map = pins.recreate_ipcache()?;
    let (keys, values): (Vec<IpCacheKey>, Vec<IpCacheValue>) = entries
        .iter()
        .map(|e| ipcache_map::encode(e, None))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .unzip();
    let started = Instant::now();
    for (keys, values) in keys.chunks(BATCH).zip(values.chunks(BATCH)) {
        map.update_batch(keys, values)?;
    }
    Ok(started.elapsed())
}

/// Batches of remote events through the agent's writer actor (on its own arbiter, as the
/// agent runs it), until it has handled the last one.
async fn through_writer(entries: &[Arc<IpCacheEntry>]) -> anyhow::Result<(Duration, usize)> {
    let root = BpfRoot::new()?;
    let barrier = SyncBarrierActor::new(
        SyncBarrier::new(Duration::from_secs(600)).with_consumer(Consumer::Datapath),
    )
    .start();
    let cluster = ClusterRef::new("bench", 0);
    let mut batches: Vec<RemoteEvents> = entries
        .chunks(BATCH)
        .map(|chunk| {
            let events = chunk
                .iter()
                .map(|e| RemoteEvent::IpCache {
                    created: true,
                    change: Change::Upsert(e.clone()),
                })
                .collect();
            RemoteEvents::new(cluster.clone(), events)
        })
        .collect();
    // The end of a first list, as a store sends it: the writer acknowledges it.
    batches.push(RemoteEvents::new(
        cluster,
        vec![RemoteEvent::ListDone(Resource::IpCache)],
    ));
    let datapath = OpenMaps::recreate(root.path(), None, &SocketLbArgs::default())?.start(
        barrier.recipient(),
        None,
        ("bench", 1),
    );
    let last = batches.pop().context("no batches")?;
    let started = Instant::now();
    for batch in batches {
        datapath.writer.do_send(batch);
    }
    // Answered once handled: the mailbox is in order, so every batch before it is written.
    datapath.writer.send(last).await?;
    let elapsed = started.elapsed();
    let report = datapath.report();
    datapath.writer.send(Stop).await?;
    if report.entries != entries.len() || report.stats.written != entries.len() as u64 {
        bail!(
            "the writer wrote {} of {} entries",
            report.stats.written,
            entries.len()
        );
    }
    Ok((elapsed, report.desired_bytes))
}

/// Agent start → its restored endpoint regenerated, with `clusters` to sync first.
async fn regeneration(
    agent: &Path,
    lab: &LabNet,
    servers: &[EtcdServer],
    clusters: &[Cluster],
) -> anyhow::Result<Duration> {
    let dir = tempfile::tempdir()?;
    let node = lab.netns("bench-node")?;
    let pod = lab.netns("bench-pod")?;
    node.veth_to("lxcbench", &pod, "eth0")?;
    let bpf = BpfRoot::new()?;
    let state = dir.path().join("state");
    // A restored endpoint: it regenerates only after every remote cluster synced.
    EndpointStore::new(&state).save(&EndpointSpec {
        id: 1,
        interface: "lxcbench".to_owned(),
        netns: Some(node.path().to_owned()),
        ips: vec!["10.214.9.10".parse()?],
        identity: 1000,
        allowed_identities: vec![clusters[0].identity(0)],
        host: false,
        labels: Vec::new(),
        pod: None,
    })?;
    let config = write_mesh_config(dir.path(), servers, clusters)?;
    let options = AgentOptions::new(agent, "bench-local", 200, &state)
        .clustermesh_config(&config)
        .bpf_root(bpf.path())
        .flags([
            "--clustermesh-ip-identities-sync-timeout",
            "10m",
            "--clustermesh-sync-timeout",
            "10m",
        ])
        .env("RUST_LOG", AGENT_LOG);
    let started = Instant::now();
    let mut process = AgentProcess::start(&options)?;
    let socket = process.socket().to_owned();
    let regenerated = Wait::new("the restored endpoint regenerated")
        .timeout(REGEN_TIMEOUT)
        .every(REGEN_POLL)
        .until_async(
            || {
                let running = process.process().check_running();
                let socket = socket.clone();
                async move {
                    running?;
                    anyhow::Ok(endpoint_regenerated(&socket).await)
                }
            },
            |seen| !matches!(seen, Ok(false)),
        )
        .await;
    let elapsed = started.elapsed();
    match regenerated {
        Ok(Ok(_)) => {}
        Ok(Err(exited)) => return Err(exited.context(process.log_tail())),
        Err(timeout) => bail!("{timeout}; log:\n{}", process.log_tail()),
    }
    let ipcache = PinDir::under(bpf.path())
        .open_ipcache()
        .context("opening the agent's ipcache")?
        .entries()?
        .len();
    process.stop(Duration::from_secs(10));
    println!("  the agent's ipcache held {ipcache} entries when measured");
    Ok(elapsed)
}

/// Whether the agent on `socket` lists an endpoint that has regenerated.
async fn endpoint_regenerated(socket: &Path) -> bool {
    let Ok(channel) = meshwork_proto::connect_unix(socket).await else {
        return false;
    };
    DatapathClient::new(channel)
        .list_endpoints(pb::ListEndpointsRequest {})
        .await
        .is_ok_and(|list| list.get_ref().endpoints.iter().any(|e| e.generation > 0))
}
