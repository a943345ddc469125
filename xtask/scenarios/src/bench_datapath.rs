//! `cargo xtask bench datapath`: ipcache inserts through the `DatapathWriter` actor vs a raw
//! bpf(2) insert loop on an identical LPM map (the floor), and the time from agent start to
//! every restored endpoint regenerated with remote clusters synced vs the raw read floor of
//! the sync benchmark.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Actor as _;
use anyhow::{Context as _, bail};
use meshwork_agent_core::clustermesh::events::{Change, RemoteEvent, RemoteEvents};
use meshwork_agent_core::datapath::bpf_sys;
use meshwork_agent_core::datapath::endpoint::{EndpointSpec, EndpointStore};
use meshwork_agent_core::datapath::ipcache_map;
use meshwork_agent_core::datapath::maps::PinDir;
use meshwork_agent_core::datapath::writer_actor::{DatapathWriter, GetWriterReport};
use meshwork_agent_core::types::{IpCacheEntry, IpIdentityPair};
use meshwork_lab::bpffs::BpfRoot;
use meshwork_lab::cilium::Sizes;
use meshwork_lab::net::LabNet;
use meshwork_lab::process::LabProcess;
use meshwork_proto::agent::v1 as pb;
use meshwork_proto::agent::v1::datapath_client::DatapathClient;

use crate::bench_sync::{raw_read, start_clusters};
use crate::binaries;
use crate::load::write_mesh_config;
use crate::measure::{median, ms};

const RATIO_GOAL: f64 = 0.90;
/// Entries per batch handed to the writer, as a store page delivers them.
const BATCH: usize = 1000;

/// Options of the datapath benchmark.
#[derive(clap::Args)]
pub struct Args {
    /// ipcache entries inserted in the insert figure.
    #[arg(long, default_value_t = 200_000)]
    entries: u32,
    /// Rounds of the insert figure; medians are reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
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
        "datapath benchmark: {} ipcache inserts; then {} clusters × {} entries to regeneration",
        args.entries, args.clusters, args.ipcache
    );
    let entries: Vec<Arc<IpCacheEntry>> = (0..args.entries).map(entry).collect();
    let mut floors = Vec::new();
    let mut writers = Vec::new();
    for round in 0..args.rounds {
        let floor = raw_loop(&entries)?;
        let writer = through_writer(&entries).await?;
        println!(
            "  round {}: raw bpf(2) loop {:>7.1} ms   DatapathWriter {:>7.1} ms",
            round + 1,
            ms(floor),
            ms(writer)
        );
        floors.push(floor);
        writers.push(writer);
    }
    let floor = median(&mut floors);
    let writer = median(&mut writers);
    let rate = |d: Duration| f64::from(args.entries) / d.as_secs_f64();
    let ratio = rate(writer) / rate(floor);
    println!(
        "  inserts/s: raw loop {:.0}, DatapathWriter {:.0} ({ratio:.2}x of the floor, goal ≥ {RATIO_GOAL:.2})",
        rate(floor),
        rate(writer)
    );

    let agent = binaries::build()?.agent;
    let sizes = Sizes {
        nodes: 100,
        services: 10,
        identities: 1000,
        ipcache: args.ipcache,
    };
    let (servers, clusters) = start_clusters(args.clusters, sizes).await?;
    let floor_read = raw_read(&servers, &clusters).await?;
    let regen = regeneration(&agent, &servers, &clusters).await?;
    println!(
        "  raw read of every remote key {:.2} s; agent start → restored endpoint regenerated {:.2} s",
        floor_read.as_secs_f64(),
        regen.as_secs_f64()
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

/// The floor: one BPF_MAP_UPDATE_ELEM per entry into a fresh, identical map.
fn raw_loop(entries: &[Arc<IpCacheEntry>]) -> anyhow::Result<Duration> {
    let root = BpfRoot::new()?;
    let map = PinDir::under(root.path()).recreate_ipcache()?;
    // Encoding is not the syscall's cost: done before the clock starts.
    let encoded: Vec<_> = entries
        .iter()
        .map(|e| ipcache_map::encode(e, None))
        .collect::<Result<_, _>>()?;
    let started = Instant::now();
    for (key, value) in &encoded {
        bpf_sys::update(map.fd(), key, value)?;
    }
    Ok(started.elapsed())
}

/// Batches of remote events through the actor, until it reports every entry written.
async fn through_writer(entries: &[Arc<IpCacheEntry>]) -> anyhow::Result<Duration> {
    let root = BpfRoot::new()?;
    let map = PinDir::under(root.path()).recreate_ipcache()?;
    let cluster: Arc<str> = Arc::from("bench");
    let batches: Vec<RemoteEvents> = entries
        .chunks(BATCH)
        .map(|chunk| RemoteEvents {
            cluster: cluster.clone(),
            events: chunk
                .iter()
                .map(|e| RemoteEvent::IpCache {
                    created: true,
                    change: Change::Upsert(e.clone()),
                })
                .collect(),
        })
        .collect();
    let writer = DatapathWriter::new(map, None).start();
    let started = Instant::now();
    for batch in batches {
        writer.do_send(batch);
    }
    let report = writer.send(GetWriterReport).await?;
    let elapsed = started.elapsed();
    if report.entries != entries.len() || report.stats.written != entries.len() as u64 {
        bail!(
            "the writer wrote {} of {} entries",
            report.stats.written,
            entries.len()
        );
    }
    Ok(elapsed)
}

/// Agent start → its restored endpoint regenerated, with `clusters` to sync first.
async fn regeneration(
    agent: &std::path::Path,
    servers: &[meshwork_lab::etcd::EtcdServer],
    clusters: &[meshwork_lab::cilium::Cluster],
) -> anyhow::Result<Duration> {
    let dir = tempfile::tempdir()?;
    let lab = LabNet::new()?;
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
    })?;
    let config = write_mesh_config(dir.path(), servers, clusters)?;
    let socket = dir.path().join("agent.sock");
    let mut command = Command::new(agent);
    command
        .args(["--cluster-name", "bench-local", "--cluster-id", "200"])
        .args(["--prometheus-serve-addr", ""])
        .arg("--clustermesh-config")
        .arg(&config)
        .arg("--state-dir")
        .arg(&state)
        .arg("--api-socket")
        .arg(&socket)
        .arg("--bpf-root")
        .arg(bpf.path())
        .args(["--clustermesh-ip-identities-sync-timeout", "10m"])
        .args(["--clustermesh-sync-timeout", "10m"])
        .env("RUST_LOG", "warn");
    let started = Instant::now();
    let mut process = LabProcess::spawn("meshwork-agent", command, &dir.path().join("agent.log"))?;
    loop {
        process.check_running()?;
        if started.elapsed() > Duration::from_secs(300) {
            bail!(
                "the endpoint did not regenerate; log:\n{}",
                process.log_tail()
            );
        }
        if let Ok(channel) = meshwork_proto::connect_unix(&socket).await
            && let Ok(list) = DatapathClient::new(channel)
                .list_endpoints(pb::ListEndpointsRequest {})
                .await
            && list.get_ref().endpoints.iter().any(|e| e.generation > 0)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    let ipcache = PinDir::under(bpf.path())
        .open_ipcache()
        .context("opening the agent's ipcache")?
        .entries()?
        .len();
    process.stop(Duration::from_secs(10));
    println!("  the agent's ipcache held {ipcache} entries when measured");
    Ok(elapsed)
}
