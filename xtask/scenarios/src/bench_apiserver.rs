//! `cargo xtask bench apiserver`: 100 agents (gRPC clients in this process) × 500 endpoints
//! publishing to the real `meshwork-apiserver` binary, from the first connect to the sync
//! canaries written, against the floor: the same keys and values written to the same etcd
//! with lease-bound transactions from one client. Each round starts from a fresh etcd holding
//! only the agents' nodes (an apiserver restart after the nodes registered, so the canaries
//! wait for every node to republish and not for `--initial-sync-timeout`); floor and subject
//! run back to back, alternating which goes first; `ratio=` is the median of the per-round
//! ratios.
//!
//! Then, on the last round's apiserver: one agent adds endpoints at 1,000 per second, and a
//! watch of the ipcache prefix times each from the agent's send to its key in etcd (`p99_ms`).
//! `rss_mib` is the apiserver's peak RSS over the rounds.

use std::net::IpAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use meshwork_apiserver::state::{ClusterState, EndpointSpec, KeyChange, NodeSpec};
use meshwork_kvstore::{EtcdBackend, EtcdConfig, KeyWrite, WatchEvent};
use meshwork_lab::etcd::{EtcdOptions, EtcdServer};
use meshwork_lab::process::LabProcess;
use meshwork_lab::wait::{Wait, free_port};
use meshwork_proto::apiserver::v1 as pb;
use meshwork_proto::apiserver::v1::export_client::ExportClient;
use meshwork_types::{Address, AddressType, IpPrefix, Label};
use pb::publish_request::Request as Publish;
use pb::publish_response::Response as Answer;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::measure::{Rounds, back_to_back, cpu_time, ms, odd_rounds, peak_rss_mib, quantile};

const GOAL_RATIO: f64 = 1.30;
const GOAL_P99_MS: f64 = 10.0;
const MAX_KEYS_PER_LEASE: usize = 1000;
const OPS_PER_TXN: usize = 128;
/// Distinct label sets (identities) among the endpoints.
const APPS: u32 = 10;

/// Options of the apiserver benchmark.
#[derive(clap::Args)]
pub struct Args {
    /// Agents (nodes), each its own publishing session.
    #[arg(long, default_value_t = 100)]
    agents: u32,
    /// Endpoints per agent.
    #[arg(long, default_value_t = 500)]
    endpoints: u32,
    /// Rounds (odd); `ratio=` is the median of the per-round ratios.
    #[arg(long, default_value_t = 5, value_parser = odd_rounds)]
    rounds: usize,
    /// Endpoints added at 1,000/s for the latency figure (at most 4,000).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..=4000))]
    latency_changes: u32,
}

fn node_ip(k: u32) -> IpAddr {
    IpAddr::from([
        192,
        0,
        2 + u8::try_from(k / 250).unwrap_or(0),
        u8::try_from(k % 250 + 1).unwrap_or(1),
    ])
}

/// Node `k`'s pod CIDR: 10.(100 + k / 256).(k % 256).0/22-like blocks, one /23 per node.
fn pod_cidr(k: u32) -> String {
    format!("10.{}.{}.0/23", 100 + k / 128, (k % 128) * 2)
}

fn endpoint_ip(k: u32, i: u32) -> String {
    format!(
        "10.{}.{}.{}",
        100 + k / 128,
        (k % 128) * 2 + i / 250,
        i % 250 + 1
    )
}

fn node(k: u32) -> pb::Node {
    pb::Node {
        name: format!("n{k}"),
        addresses: vec![pb::NodeAddress {
            r#type: "InternalIP".to_owned(),
            ip: node_ip(k).to_string(),
        }],
        ipv4_alloc_cidrs: vec![pod_cidr(k)],
        ..pb::Node::default()
    }
}

/// The latency phase's node: a /20 of its own, outside the fleet's, for up to 4,000 pods.
const LATENCY_NODE: u32 = 900;

fn latency_node() -> pb::Node {
    pb::Node {
        ipv4_alloc_cidrs: vec!["10.200.0.0/20".to_owned()],
        ..node(LATENCY_NODE)
    }
}

fn latency_endpoint(i: u32) -> pb::Endpoint {
    pb::Endpoint {
        ips: vec![latency_ip(i)],
        ..endpoint(LATENCY_NODE, i)
    }
}

fn latency_ip(i: u32) -> String {
    format!("10.200.{}.{}", i / 250, i % 250 + 1)
}

fn endpoint(k: u32, i: u32) -> pb::Endpoint {
    pb::Endpoint {
        id: u64::from(i) + 1,
        ips: vec![endpoint_ip(k, i)],
        labels: vec![format!("k8s:app=app{}", i % APPS)],
        pod_namespace: "default".to_owned(),
        pod_name: format!("pod-{k}-{i}"),
        ..pb::Endpoint::default()
    }
}

/// The keys the apiserver writes for the fleet, computed by its own state machine (so the
/// floor writes the same bytes): nodes, then ipcache entries and identities.
fn fleet_keys(args: &Args) -> anyhow::Result<(Vec<KeyChange>, Vec<KeyChange>)> {
    let now = tokio::time::Instant::now();
    let mut state = ClusterState::new("bench", 1, 255);
    for k in 0..args.agents {
        state
            .publish_node(NodeSpec {
                name: format!("n{k}"),
                addresses: vec![Address {
                    address_type: AddressType::InternalIp,
                    ip: Some(node_ip(k)),
                }],
                ipv4_cidrs: vec![pod_cidr(k).parse::<IpPrefix>()?],
                ipv6_cidrs: vec![],
                ipv4_health_ip: None,
                ipv6_health_ip: None,
                wireguard_public_key: String::new(),
                encryption_key: 0,
                labels: Default::default(),
                eni_ipam: false,
            })
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let nodes = state.take_changes();
    for k in 0..args.agents {
        for i in 0..args.endpoints {
            let endpoint = EndpointSpec {
                id: u64::from(i) + 1,
                ips: vec![endpoint_ip(k, i).parse()?],
                labels: vec![Label::parse(&format!("k8s:app=app{}", i % APPS))],
                named_ports: vec![],
                pod_namespace: "default".to_owned(),
                pod_name: format!("pod-{k}-{i}"),
            };
            state
                .put_endpoint(&format!("n{k}"), endpoint, now)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
    }
    Ok((nodes, state.take_changes()))
}

/// Writes `changes` with leases of at most 1000 keys in transactions of 128 puts.
async fn raw_write(backend: &EtcdBackend, changes: &[KeyChange]) -> anyhow::Result<()> {
    for chunk in changes.chunks(MAX_KEYS_PER_LEASE) {
        let lease = backend.lease_grant(900).await?;
        let writes: Vec<KeyWrite> = chunk
            .iter()
            .filter_map(|(key, value)| {
                Some(KeyWrite::Put {
                    key: key.clone(),
                    value: value.clone()?,
                    lease,
                })
            })
            .collect();
        backend.write_batch(&writes, OPS_PER_TXN).await?;
    }
    Ok(())
}

/// A fresh etcd holding only the fleet's nodes (as a previous apiserver wrote them).
async fn seeded_etcd(nodes: &[KeyChange]) -> anyhow::Result<(EtcdServer, EtcdBackend)> {
    let server = EtcdServer::start_with(EtcdOptions {
        data_in_memory: true,
        ..EtcdOptions::default()
    })?;
    let backend = EtcdBackend::connect(
        &EtcdConfig::new([server.endpoint()]),
        Duration::from_secs(10),
    )
    .await?;
    raw_write(&backend, nodes).await?;
    Ok((server, backend))
}

/// The floor: the fleet's ipcache entries and identities, raw, from one client; with the
/// CPU its etcd spent.
async fn floor_round(
    etcd: &EtcdServer,
    backend: &EtcdBackend,
    keys: &[KeyChange],
) -> anyhow::Result<(Duration, Duration)> {
    let etcd_cpu = cpu_time(etcd.pid().unwrap_or(0));
    let started = Instant::now();
    raw_write(backend, keys).await?;
    let elapsed = started.elapsed();
    Ok((elapsed, cpu_time(etcd.pid().unwrap_or(0)) - etcd_cpu))
}

/// A running apiserver binary.
struct Apiserver {
    process: LabProcess,
    grpc: u16,
    health: u16,
}

fn start_apiserver(binary: &Path, etcd: &EtcdServer, dir: &Path) -> anyhow::Result<Apiserver> {
    let (grpc, health) = (free_port()?, free_port()?);
    let mut command = Command::new(binary);
    command
        .args(["--cluster-name", "bench", "--cluster-id", "1"])
        .args(["--kvstore-endpoints", &etcd.endpoint()])
        .args(["--initial-sync-timeout", "10m"])
        .args(["--grpc-serve-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--health-serve-addr", &format!("127.0.0.1:{health}")])
        .args(["--prometheus-serve-addr", ""]);
    let log = dir.join(format!("apiserver-{grpc}.log"));
    let process = LabProcess::spawn("meshwork-apiserver", command, &log)?;
    Wait::new("the apiserver to run")
        .timeout(Duration::from_secs(30))
        .every(Duration::from_millis(20))
        .until(
            || std::fs::read_to_string(&log).unwrap_or_default(),
            |log| log.contains("meshwork-apiserver running") || log.contains("meshwork-apiserver:"),
        )?;
    ensure!(
        std::fs::read_to_string(&log)?.contains("meshwork-apiserver running"),
        "the apiserver did not start: {}",
        process.log_tail()
    );
    Ok(Apiserver {
        process,
        grpc,
        health,
    })
}

async fn readyz(port: u16) -> bool {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    let request = "GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply).await;
    reply.starts_with("HTTP/1.1 200")
}

/// One agent's session: node, every endpoint, the end of the initial state, its answers read.
async fn publish_agent(port: u16, k: u32, endpoints: u32) -> anyhow::Result<()> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))?
        .connect()
        .await?;
    let (requests, rx) = mpsc::channel(1024);
    let send = |request| pb::PublishRequest {
        request: Some(request),
    };
    requests.send(send(Publish::Node(node(k)))).await?;
    let mut answers = ExportClient::new(channel)
        .publish(ReceiverStream::new(rx))
        .await?
        .into_inner();
    // The sender runs ahead; answers are read as they come.
    let sender = tokio::spawn(async move {
        for i in 0..endpoints {
            requests
                .send(send(Publish::Endpoint(endpoint(k, i))))
                .await?;
        }
        requests
            .send(send(Publish::InitialStateComplete(true)))
            .await?;
        anyhow::Ok(requests)
    });
    loop {
        match answers.message().await?.and_then(|a| a.response) {
            Some(Answer::InitialStateWritten(_)) => break,
            Some(Answer::Identity(_) | Answer::LocalServices(_)) => {}
            None => bail!("agent n{k}: the session ended early"),
        }
    }
    // Keep the session open until the round ends (the requests sender lives in the task).
    let _requests = sender.await??;
    Ok(())
}

/// What a subject round measured besides its time.
struct Subject {
    elapsed: Duration,
    rss_mib: u64,
    /// CPU spent from the first connect to the canaries: (etcd, apiserver, this process).
    cpu: (Duration, Duration, Duration),
    apiserver: Apiserver,
}

/// The subject: every agent publishing at once, first connect to canaries written.
async fn subject_round(
    binary: &Path,
    etcd: &EtcdServer,
    dir: &Path,
    args: &Args,
) -> anyhow::Result<Subject> {
    let apiserver = start_apiserver(binary, etcd, dir)?;
    ensure!(
        !readyz(apiserver.health).await,
        "ready before anyone published"
    );
    let cpu = || {
        (
            cpu_time(etcd.pid().unwrap_or(0)),
            cpu_time(apiserver.process.pid()),
            cpu_time(std::process::id()),
        )
    };
    let before = cpu();
    let started = Instant::now();
    let agents: Vec<_> = (0..args.agents)
        .map(|k| tokio::spawn(publish_agent(apiserver.grpc, k, args.endpoints)))
        .collect();
    for agent in agents {
        agent.await??;
    }
    while !readyz(apiserver.health).await {
        ensure!(
            started.elapsed() < Duration::from_secs(300),
            "no canaries after 5 min"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = started.elapsed();
    let after = cpu();
    Ok(Subject {
        elapsed,
        rss_mib: peak_rss_mib(Some(apiserver.process.pid())),
        cpu: (after.0 - before.0, after.1 - before.1, after.2 - before.2),
        apiserver,
    })
}

/// One agent adds `changes` endpoints at 1,000 per second; each one's latency from its send
/// to its ipcache key seen by a watch.
async fn latency(
    apiserver: &Apiserver,
    backend: &EtcdBackend,
    changes: u32,
) -> anyhow::Result<Vec<Duration>> {
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", apiserver.grpc))?
            .connect()
            .await?;
    let (requests, rx) = mpsc::channel(1024);
    let send = |request| pb::PublishRequest {
        request: Some(request),
    };
    requests.send(send(Publish::Node(latency_node()))).await?;
    let mut answers = ExportClient::new(channel)
        .publish(ReceiverStream::new(rx))
        .await?
        .into_inner();
    tokio::spawn(async move { while let Ok(Some(_)) = answers.message().await {} });
    timed(backend, changes, latency_ip, async |i| {
        requests
            .send(send(Publish::Endpoint(latency_endpoint(i))))
            .await?;
        Ok(())
    })
    .await
}

/// The floor of [`latency`]: the same number of ipcache keys put straight to etcd under one
/// lease at 1,000 per second, timed by the same watch.
async fn raw_latency(backend: &EtcdBackend, changes: u32) -> anyhow::Result<Vec<Duration>> {
    let lease = backend.lease_grant(900).await?;
    let ip = |i: u32| format!("10.201.{}.{}", i / 250, i % 250 + 1);
    timed(backend, changes, ip, async |i| {
        let key = format!("cilium/state/ip/v1/default/{}", ip(i));
        backend
            .put_with_lease(&key, format!("{{\"IP\":\"{}\"}}", ip(i)), lease)
            .await?;
        Ok(())
    })
    .await
}

/// Calls `change(i)` for `i` in `0..changes`, one per millisecond, and times each from the
/// call to its ipcache key (`cilium/state/ip/v1/default/<ip(i)>`) seen by a watch; sorted.
async fn timed(
    backend: &EtcdBackend,
    changes: u32,
    ip: impl Fn(u32) -> String,
    mut change: impl AsyncFnMut(u32) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<Duration>> {
    let revision = backend.revision("cilium/").await?;
    let mut watch = backend
        .watch("cilium/state/ip/v1/default/", revision + 1)
        .await?;
    let mut sent = std::collections::HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    let sending = async {
        for i in 0..changes {
            tick.tick().await;
            sent.insert(
                format!("cilium/state/ip/v1/default/{}", ip(i)),
                Instant::now(),
            );
            change(i).await?;
        }
        anyhow::Ok(())
    };
    let mut seen = std::collections::HashMap::new();
    let watching = async {
        while seen.len() < changes as usize {
            let Some(batch) = watch.next().await? else {
                bail!("the watch ended")
            };
            let at = Instant::now();
            for event in batch {
                if let WatchEvent::Put { key, .. } = event {
                    seen.insert(String::from_utf8(key)?, at);
                }
            }
        }
        anyhow::Ok(())
    };
    let (sending, watching) = tokio::join!(
        sending,
        tokio::time::timeout(Duration::from_secs(60), watching)
    );
    sending?;
    watching.context("not every change reached etcd within 60 s")??;
    let mut latencies: Vec<Duration> = sent
        .iter()
        .filter_map(|(key, at)| Some(seen.get(key)?.saturating_duration_since(*at)))
        .collect();
    latencies.sort();
    ensure!(
        latencies.len() == changes as usize,
        "{} of {changes} changes timed",
        latencies.len()
    );
    Ok(latencies)
}

/// Figures of one round.
struct Figures {
    floor: Duration,
    subject: Duration,
}

/// Runs the benchmark.
pub async fn run(args: Args, binary: &Path) -> anyhow::Result<()> {
    let (nodes, keys) = fleet_keys(&args)?;
    println!(
        "bench apiserver: {} agents × {} endpoints ({} keys besides the nodes), {} rounds",
        args.agents,
        args.endpoints,
        keys.len(),
        args.rounds
    );
    let dir = tempfile::tempdir()?;
    let mut rounds = Rounds::default();
    let mut rss_mib = 0;
    let mut last = None;
    for round in 0..args.rounds {
        // Each side on its own fresh etcd, seeded with the nodes.
        let (floor_etcd, floor_backend) = seeded_etcd(&nodes).await?;
        let (subject_etcd, subject_backend) = seeded_etcd(&nodes).await?;
        let ((floor, floor_cpu), run) = back_to_back(
            round,
            || floor_round(&floor_etcd, &floor_backend, &keys),
            || subject_round(binary, &subject_etcd, dir.path(), &args),
        )
        .await?;
        drop((floor_etcd, floor_backend));
        let subject = run.elapsed;
        let ratio = subject.as_secs_f64() / floor.as_secs_f64();
        rss_mib = rss_mib.max(run.rss_mib);
        let (etcd_cpu, apiserver_cpu, clients_cpu) = run.cpu;
        println!(
            "round {}: floor {:.0} ms (etcd CPU {:.0} ms), apiserver {:.0} ms (CPU: etcd {:.0} ms, \
             apiserver {:.0} ms, agents' clients {:.0} ms), ratio {ratio:.2}, apiserver peak RSS {} MiB",
            round + 1,
            ms(floor),
            ms(floor_cpu),
            ms(subject),
            ms(etcd_cpu),
            ms(apiserver_cpu),
            ms(clients_cpu),
            run.rss_mib
        );
        rounds.push(ratio, Figures { floor, subject });
        last = Some((run.apiserver, subject_etcd, subject_backend));
    }
    let (apiserver, _etcd, backend) = last.context("no round ran")?;
    let latencies = latency(&apiserver, &backend, args.latency_changes).await?;
    let raw = raw_latency(&backend, args.latency_changes).await?;
    let p50 = ms(quantile(&latencies, 0.50));
    let p99 = ms(quantile(&latencies, 0.99));
    println!(
        "raw put → watch at 1,000/s on the same etcd: p50 {:.2} ms, p99 {:.2} ms",
        ms(quantile(&raw, 0.50)),
        ms(quantile(&raw, 0.99))
    );
    let (ratio, figures) = rounds.median().context("no round ran")?;
    println!("per-round ratios: {}", rounds.ratios_line());
    println!(
        "median round: floor {:.0} ms, apiserver {:.0} ms; endpoint → ipcache key in etcd at 1,000/s: p50 {p50:.2} ms, p99 {p99:.2} ms",
        ms(figures.floor),
        ms(figures.subject)
    );
    println!("goals: ratio ≤ {GOAL_RATIO:.2}, p99 ≤ {GOAL_P99_MS:.0} ms");
    println!("ratio={ratio:.2} p99_ms={p99:.2} rss_mib={rss_mib}");
    Ok(())
}
