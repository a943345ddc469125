//! `cargo xtask bench ipam`: 20 nodes × 30 pods added through the CNI plugin, each node a
//! real `meshwork-agent` (`--ipam eni`, BPF datapath on) against the real operator and the
//! patched moto.
//!
//! Two figures per round, each round from scratch (moto reset, a fresh etcd):
//! - allocation p50/p99 on the agent when the pool has room: the agents'
//!   `meshwork_ipam_allocation_duration_seconds` histograms merged, read as Prometheus's
//!   `histogram_quantile` reads them (a failed allocation — the pool empty until the
//!   operator attaches more — hands out nothing and is not in it);
//! - node registration → first pod IP, every node at once: from the first CiliumNode the
//!   operator stores to the last node's first ADD, against the floor of the EC2 calls that
//!   needed — the mutating calls the operator made meanwhile, those past the token bucket's
//!   burst at its rate — plus one DescribeNetworkInterfaces timed in the same round. Its
//!   other describes (resyncs) take tokens too: they count against it, not in the floor.
//!
//! `first_ip_ratio=` is the median of the per-round ratios; `alloc_p99_ms=` the median of the
//! per-round p99s (each round's own histogram), printed beside them.
//!
//! The agents' state dirs (the fsynced checkpoint) are on tmpfs, as `--state-dir`'s default
//! `/var/run/meshwork` is on a node (Cilium's `/var/run/cilium` and the VPC CNI's
//! `/var/run/aws-node` likewise); `--state-on-disk` puts them on this VM's disk instead,
//! where the allocation is the disk's fsync under 20 agents and etcd.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt as _;
use meshwork_kvstore::etcd::WatchEvent;
use meshwork_lab::agent::{AgentOptions, AgentProcess, EniIpam};
use meshwork_lab::bpffs::BpfRoot;
use meshwork_lab::eni_scene::EniScene;
use meshwork_lab::etcd::{EtcdOptions, EtcdServer};
use meshwork_lab::moto::MotoServer;
use meshwork_lab::net::{LabNet, Netns};
use meshwork_lab::operator::{OperatorOptions, OperatorProcess};
use meshwork_lab::wait::{Wait, free_port};
use meshwork_operator::node_store::KEY_PREFIX;
use meshwork_proto::standard::client::{HealthStatus, watch_health};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;

use crate::bench_eni::{MUTATING, count};
use crate::binaries::beside;
use crate::measure::{Rounds, ms, odd_rounds, quantile};

/// Goals of the issue.
const GOAL_ALLOC_P99_MS: f64 = 2.0;
const GOAL_FIRST_IP_RATIO: f64 = 1.5;
/// Room for 30 pods, the router and the watermark from device index 1 on (7 ENIs × 29).
const INSTANCE_TYPE: &str = "m5.4xlarge";
/// The scene's subnet: a lab range, room for every node's ENIs.
const SUBNET: &str = "10.213.0.0/20";
/// The agents' allocation histogram.
const HISTOGRAM: &str = "meshwork_ipam_allocation_duration_seconds";
/// The machine's tmpfs, for the agents' state dirs (as a node's `/var/run`).
const TMPFS: &str = "/dev/shm";

/// Options of the IPAM benchmark.
#[derive(clap::Args)]
pub struct Args {
    /// Nodes (instances, each with its agent).
    #[arg(long, default_value_t = 20)]
    nodes: usize,
    /// Pods added through the plugin on each node.
    #[arg(long, default_value_t = 30)]
    pods: usize,
    /// Addresses each node pre-allocates (`--ipam-pre-allocate`).
    #[arg(long, default_value_t = 8)]
    pre_allocate: u32,
    /// The operator's token bucket rate (`--limit-ipam-api-qps`).
    #[arg(long, default_value_t = 20.0)]
    qps: f64,
    /// The operator's token bucket burst (`--limit-ipam-api-burst`).
    #[arg(long, default_value_t = 4)]
    burst: u32,
    /// Give up on a wait after this many seconds.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
    /// Rounds (odd), each from scratch.
    #[arg(long, default_value_t = 3, value_parser = odd_rounds)]
    rounds: usize,
    /// Keep the agents' state dirs on disk (a temp dir) instead of tmpfs (`/dev/shm`, as a
    /// node's `/var/run`): the allocation then pays the disk's fsync.
    #[arg(long)]
    state_on_disk: bool,
}

/// Where the agents' state dirs go in a round.
fn state_parent(on_disk: bool) -> std::io::Result<tempfile::TempDir> {
    let mut dir = tempfile::Builder::new();
    dir.prefix("meshwork-bench-ipam-");
    if on_disk {
        dir.tempdir()
    } else {
        dir.tempdir_in(TMPFS)
    }
}

/// The processes a round runs.
struct Binaries {
    agent: PathBuf,
    operator: PathBuf,
    cni: PathBuf,
}

/// One node: its namespace (the plugin's `host-netns`), its agent and its pods' namespaces.
struct Node {
    index: usize,
    name: String,
    agent: AgentProcess,
    metrics_port: u16,
    netns: Netns,
    pods: Vec<Netns>,
    _bpf: BpfRoot,
}

/// What one round measured.
struct Round {
    /// First registration → every node's first pod IP.
    wall: Duration,
    /// The token bucket's floor for the round's mutating calls plus one describe.
    floor: Duration,
    /// EC2 calls in the window, by action.
    calls: serde_json::Map<String, Value>,
    /// Of them, the mutating ones.
    mutating: u64,
    /// One DescribeNetworkInterfaces of the VPC.
    describe: Duration,
    /// Per node, registration → first pod IP, sorted.
    per_node: Vec<Duration>,
    /// The merged allocation histogram: (upper bound in seconds, cumulative count).
    buckets: Vec<(f64, u64)>,
    /// Successful ADDs, as the runtime waits for them, sorted.
    adds: Vec<Duration>,
}

impl Round {
    fn ratio(&self) -> f64 {
        self.wall.as_secs_f64() / self.floor.as_secs_f64()
    }
}

/// The floor of `calls` through a bucket of `burst` refilled at `qps`, plus `describe`.
fn floor(calls: u64, qps: f64, burst: u32, describe: Duration) -> Duration {
    let paced = calls.saturating_sub(u64::from(burst));
    Duration::from_secs_f64(paced as f64 / qps) + describe
}

/// The network configuration a runtime passes for `node`.
fn netconf(node: &Node) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "meshwork",
        "type": "meshwork-cni",
        "agent-socket": node.agent.socket(),
        "host-netns": node.netns.path(),
        "identity": 2000,
    })
}

/// What one ADD came to: how long the runtime waited, and `Ok` or the plugin's error JSON.
type Added = (Duration, Result<(), Value>);

/// One ADD of pod `index` on `node`, run as a runtime runs the plugin (environment, stdin,
/// from the node's namespace).
async fn add(cni: &Path, node: &Node, index: usize) -> anyhow::Result<Added> {
    let pod = &node.pods[index];
    let mut command = tokio::process::Command::from(node.netns.command(cni));
    command
        .env_clear()
        .env("CNI_COMMAND", "ADD")
        .env(
            "CNI_CONTAINERID",
            format!("{:032x}{index:032x}", node.index),
        )
        .env("CNI_NETNS", pod.path())
        .env("CNI_IFNAME", "eth0")
        .env(
            "CNI_ARGS",
            format!("K8S_POD_NAMESPACE=default;K8S_POD_NAME={}", pod.name()),
        )
        .env("CNI_PATH", cni.parent().unwrap_or(Path::new("/")))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = command.spawn().context("running meshwork-cni")?;
    let mut stdin = child.stdin.take().context("the plugin's stdin")?;
    stdin
        .write_all(netconf(node).to_string().as_bytes())
        .await?;
    drop(stdin);
    let out = child.wait_with_output().await?;
    let took = started.elapsed();
    if out.status.success() {
        return Ok((took, Ok(())));
    }
    let error: Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "meshwork-cni failed without error JSON: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    Ok((took, Err(error)))
}

/// ADD of pod `index`, retried while the plugin says "try again later" (11: the pool is
/// empty until the operator attaches more), as a kubelet retries a sandbox; the successful
/// ADD's duration.
async fn add_retrying(
    cni: &Path,
    node: &Node,
    index: usize,
    timeout: Duration,
) -> anyhow::Result<Duration> {
    let result = Wait::new(format!("ADD of pod {index} on {}", node.name))
        .timeout(timeout)
        .every(Duration::from_millis(10))
        .until_async(
            || add(cni, node, index),
            |added| !matches!(added, Ok((_, Err(error))) if error["code"] == 11),
        )
        .await
        .map_err(|err| anyhow::anyhow!("{err}"))?;
    match result? {
        (took, Ok(())) => Ok(took),
        (_, Err(error)) => bail!("ADD of pod {index} on {} failed: {error}", node.name),
    }
}

/// Waits, up to `timeout`, until the server behind `channel` reports SERVING on Health/Watch.
async fn serving(channel: tonic::transport::Channel, timeout: Duration) -> anyhow::Result<()> {
    let mut health = watch_health(channel, "").await?;
    tokio::time::timeout(timeout, async {
        while let Some(status) = health.next().await {
            if status? == HealthStatus::Serving {
                return Ok(());
            }
        }
        bail!("the health stream ended before SERVING")
    })
    .await
    .context("timed out")?
}

/// Waits until `node`'s agent is SERVING (its pool holds what Cilium requires), then adds
/// its first pod; the instant it has its IP.
async fn first_pod(cni: &Path, node: &Node, timeout: Duration) -> anyhow::Result<Instant> {
    // Spawned, not waited for: the socket appears once the agent serves.
    let socket = node.agent.socket();
    let channel = Wait::new(format!("{}'s agent socket", node.name))
        .timeout(timeout)
        .every(Duration::from_millis(5))
        .some_async(|| async { meshwork_proto::connect_unix(socket).await.ok() })
        .await
        .map_err(|err| anyhow::anyhow!("{err}; log:\n{}", node.agent.log_tail()))?;
    serving(channel, timeout)
        .await
        .with_context(|| format!("{}'s agent to be ready", node.name))?;
    add_retrying(cni, node, 0, timeout).await?;
    Ok(Instant::now())
}

/// The rest of `node`'s pods, one after the other; each ADD's duration.
async fn other_pods(
    cni: &Path,
    node: &Node,
    pods: usize,
    timeout: Duration,
) -> anyhow::Result<Vec<Duration>> {
    let mut adds = Vec::with_capacity(pods);
    for index in 1..pods {
        adds.push(add_retrying(cni, node, index, timeout).await?);
    }
    Ok(adds)
}

/// The first instant each node's CiliumNode was stored, once all `nodes` were.
async fn registrations(
    mut watch: meshwork_kvstore::etcd::Watch,
    nodes: usize,
) -> anyhow::Result<BTreeMap<String, Instant>> {
    let mut seen = BTreeMap::new();
    while seen.len() < nodes {
        let events = watch.next().await?.context("the node watch ended")?;
        let now = Instant::now();
        for event in events {
            if let WatchEvent::Put { key, .. } = event {
                let name = String::from_utf8_lossy(&key)
                    .trim_start_matches(KEY_PREFIX)
                    .to_owned();
                seen.entry(name).or_insert(now);
            }
        }
    }
    Ok(seen)
}

/// The cumulative buckets of `HISTOGRAM` in a scrape: (upper bound, count).
fn buckets(metrics: &str) -> Vec<(f64, u64)> {
    let prefix = format!("{HISTOGRAM}_bucket{{le=\"");
    metrics
        .lines()
        .filter_map(|line| {
            let (le, count) = line.strip_prefix(&prefix)?.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.trim().parse().ok()?))
        })
        .collect()
}

/// Adds `more` into `sum`, bucket by bucket (every agent has the same bounds).
fn merge(sum: &mut Vec<(f64, u64)>, more: &[(f64, u64)]) {
    if sum.is_empty() {
        sum.extend_from_slice(more);
        return;
    }
    for (total, (_, count)) in sum.iter_mut().zip(more) {
        total.1 += count;
    }
}

/// The `q` quantile of cumulative `buckets`, interpolated inside its bucket as Prometheus's
/// `histogram_quantile` does; `None` without observations.
fn histogram_quantile(buckets: &[(f64, u64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let (mut lower, mut below) = (0.0, 0);
    for &(upper, count) in buckets {
        if count as f64 >= rank {
            if upper.is_infinite() {
                return Some(lower);
            }
            let inside = (count - below) as f64;
            return Some(lower + (upper - lower) * (rank - below as f64) / inside);
        }
        (lower, below) = (upper, count);
    }
    Some(lower)
}

/// One round from scratch: the scene, the operator, every node's agent at once; then every
/// node's first pod, then the rest of its pods.
async fn round(moto: &MotoServer, binaries: &Binaries, args: &Args) -> anyhow::Result<Round> {
    let timeout = Duration::from_secs(args.timeout);
    moto.reset()?;
    let etcd = EtcdServer::start_with(EtcdOptions {
        data_in_memory: true,
        ..EtcdOptions::default()
    })?;
    let scene = EniScene::create(moto, SUBNET, INSTANCE_TYPE, args.nodes).await?;
    let dir = tempfile::tempdir()?;
    let states = state_parent(args.state_on_disk)?;
    let operator_options = OperatorOptions::new(
        &binaries.operator,
        &moto.endpoint(),
        &etcd.endpoint(),
        dir.path(),
    )?
    .flags([
        "--limit-ipam-api-qps".to_owned(),
        args.qps.to_string(),
        "--limit-ipam-api-burst".to_owned(),
        args.burst.to_string(),
    ]);
    let operator = OperatorProcess::start(&operator_options, 1)?;
    // Namespaces first: making 600 of them is not what the figures measure.
    let net = LabNet::new()?;
    let mut spaces = Vec::with_capacity(args.nodes);
    for n in 0..args.nodes {
        let node = net.netns(&format!("ipam-n{n}"))?;
        let pods = (0..args.pods)
            .map(|p| net.netns(&format!("ipam-n{n}p{p}")))
            .collect::<Result<Vec<_>, _>>()?;
        spaces.push((node, pods));
    }
    let backend = crate::load::connect(&etcd.endpoint()).await?;
    let registered = tokio::spawn(registrations(
        backend.watch(KEY_PREFIX, 0).await?,
        args.nodes,
    ));
    // SERVING once its describe cache is synced and its nodes listed: the start-up calls
    // are behind it (and the bucket refills while the namespaces were made); count from here.
    let grpc = tonic::transport::Endpoint::from_shared(operator_options.grpc_url())?
        .connect()
        .await?;
    serving(grpc, timeout)
        .await
        .context("the operator to serve")?;
    moto.clear_calls()?;
    // Every agent spawned at once from this thread (agents die with the thread that started
    // them); each node's clock runs from its own registration.
    let mut nodes = Vec::with_capacity(args.nodes);
    for (index, (netns, pods)) in spaces.into_iter().enumerate() {
        let name = format!("node-{index:02}");
        let bpf = BpfRoot::new()?;
        let metrics_port = free_port()?;
        let eni = EniIpam {
            node_name: Some(name.clone()),
            instance_type: Some(INSTANCE_TYPE.to_owned()),
            first_interface_index: Some(1),
            pre_allocate: Some(args.pre_allocate),
            ..EniIpam::new(&operator_options.grpc_url(), &scene.instances[index])
        };
        let options = AgentOptions::new(&binaries.agent, "c1", 1, &states.path().join(&name))
            .bpf_root(bpf.path())
            .metrics_port(metrics_port)
            .ipam_eni(&eni);
        nodes.push(Node {
            index,
            name,
            agent: AgentProcess::spawn(&options)?,
            metrics_port,
            netns,
            pods,
            _bpf: bpf,
        });
    }
    let firsts = futures::future::join_all(
        nodes
            .iter()
            .map(|node| first_pod(&binaries.cni, node, timeout)),
    )
    .await
    .into_iter()
    .collect::<anyhow::Result<Vec<Instant>>>()?;
    let calls = moto.call_counts()?;
    let mutating = count(&calls, MUTATING);
    let registered = tokio::time::timeout(timeout, registered)
        .await
        .context("every node to be registered")???;
    let started = registered
        .values()
        .min()
        .copied()
        .context("no node registered")?;
    let last = firsts.iter().max().copied().context("no node")?;
    let mut per_node: Vec<Duration> = nodes
        .iter()
        .zip(&firsts)
        .map(|(node, first)| {
            registered
                .get(&node.name)
                .map_or(Duration::ZERO, |at| first.saturating_duration_since(*at))
        })
        .collect();
    per_node.sort_unstable();
    let described = Instant::now();
    scene
        .sdk
        .describe_network_interfaces()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("vpc-id")
                .values(&scene.vpc)
                .build(),
        )
        .send()
        .await
        .context("DescribeNetworkInterfaces")?;
    let describe = described.elapsed();

    // The rest of the pods, every node at once, each node's in order.
    let adds = futures::future::join_all(
        nodes
            .iter()
            .map(|node| other_pods(&binaries.cni, node, args.pods, timeout)),
    )
    .await
    .into_iter()
    .collect::<anyhow::Result<Vec<Vec<Duration>>>>()?;
    let mut adds: Vec<Duration> = adds.into_iter().flatten().collect();
    adds.sort_unstable();
    let mut merged = Vec::new();
    for node in &nodes {
        let metrics = meshwork_lab::prometheus::scrape(node.metrics_port)
            .with_context(|| format!("scraping {}'s metrics", node.name))?;
        merge(&mut merged, &buckets(&metrics));
    }
    let observed = merged.last().map_or(0, |b| b.1);
    // Every pod and every router: nothing went unrecorded.
    let expected = u64::try_from(args.nodes * (args.pods + 1))?;
    if observed < expected {
        bail!("{observed} allocations in the agents' histograms, {expected} made");
    }
    // Agents and the operator stop before their namespaces, bpffs and etcd go.
    drop(nodes);
    drop(operator);
    drop(net);
    drop(etcd);
    Ok(Round {
        wall: last.saturating_duration_since(started),
        floor: floor(mutating, args.qps, args.burst, describe),
        calls,
        mutating,
        describe,
        per_node,
        buckets: merged,
        adds,
    })
}

/// Runs the benchmark and prints its table and the closing line.
pub async fn run(args: Args) -> anyhow::Result<()> {
    // Pod 0 is the first-IP figure; the rest are the allocation figures.
    anyhow::ensure!(
        args.nodes >= 1 && args.pods >= 2,
        "--nodes ≥ 1 and --pods ≥ 2"
    );
    let binaries = Binaries {
        agent: beside("meshwork-agent")?,
        operator: beside("meshwork-operator")?,
        cni: beside("meshwork-cni")?,
    };
    println!(
        "IPAM: {} nodes ({INSTANCE_TYPE}, first-interface-index 1, pre-allocate {}) × {} pods through meshwork-cni, {} rounds",
        args.nodes, args.pre_allocate, args.pods, args.rounds
    );
    println!(
        "operator token bucket: {} qps, burst {}; agents' state dirs on {}",
        args.qps,
        args.burst,
        if args.state_on_disk {
            "disk (--state-on-disk)"
        } else {
            "tmpfs (/dev/shm, as a node's /var/run)"
        }
    );
    let moto = MotoServer::start()?;
    let mut rounds = Rounds::default();
    let mut p99s = Vec::with_capacity(args.rounds);
    for n in 0..args.rounds {
        let round = Box::pin(round(&moto, &binaries, &args)).await?;
        let ratio = round.ratio();
        let p99 = histogram_quantile(&round.buckets, 0.99).unwrap_or(0.0) * 1e3;
        println!(
            "  round {}: first IPs {:.2} s, floor {:.2} s ({} mutating calls, describe {:.1} ms)   ratio {ratio:.2}   alloc p99 {p99:.2} ms",
            n + 1,
            round.wall.as_secs_f64(),
            round.floor.as_secs_f64(),
            round.mutating,
            ms(round.describe),
        );
        rounds.push(ratio, round);
        p99s.push(p99);
    }
    let (ratio, median) = rounds.median().context("no rounds")?;
    let p50 = histogram_quantile(&median.buckets, 0.50).unwrap_or(0.0) * 1e3;
    let median_p99 = histogram_quantile(&median.buckets, 0.99).unwrap_or(0.0) * 1e3;
    p99s.sort_by(f64::total_cmp);
    let p99 = p99s[p99s.len() / 2];
    println!("per-round ratios: {}", rounds.ratios_line());
    println!(
        "per-round allocation p99s: {} ms (median {p99:.2} ms; goal ≤ {GOAL_ALLOC_P99_MS} ms)",
        p99s.iter()
            .map(|p| format!("{p:.2}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!("median round (by first-IP ratio):");
    println!(
        "  allocation on the agent   p50 {p50:>7.2} ms   p99 {median_p99:>7.2} ms   ({} allocations)",
        median.buckets.last().map_or(0, |b| b.1)
    );
    println!(
        "  ADD through the plugin    p50 {:>7.2} ms   p99 {:>7.2} ms   (process, netlink, endpoint)",
        ms(quantile(&median.adds, 0.50)),
        ms(quantile(&median.adds, 0.99))
    );
    println!(
        "  registration → first IP  per node p50 {:.2} s, max {:.2} s",
        quantile(&median.per_node, 0.50).as_secs_f64(),
        quantile(&median.per_node, 1.0).as_secs_f64()
    );
    println!(
        "  every node's first IP     {:.2} s vs floor {:.2} s = ({} mutating calls − burst {}) ÷ {} qps + describe {:.1} ms",
        median.wall.as_secs_f64(),
        median.floor.as_secs_f64(),
        median.mutating,
        args.burst,
        args.qps,
        ms(median.describe)
    );
    println!("  ratio (median of rounds)  {ratio:.2}   (goal ≤ {GOAL_FIRST_IP_RATIO})");
    println!("  EC2 calls until then, by action:");
    for (action, n) in &median.calls {
        println!("    {action:<34} {n:>6}");
    }
    println!("alloc_p99_ms={p99:.2} first_ip_ratio={ratio:.2}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_inside_their_bucket() {
        // 10 observations ≤ 1 ms, 10 more ≤ 2 ms.
        let buckets = [(0.001, 10), (0.002, 20), (f64::INFINITY, 20)];
        assert_eq!(histogram_quantile(&buckets, 0.5), Some(0.001));
        let p75 = histogram_quantile(&buckets, 0.75).unwrap();
        assert!((p75 - 0.0015).abs() < 1e-12, "{p75}");
        assert_eq!(
            histogram_quantile(&[(0.001, 0), (f64::INFINITY, 0)], 0.5),
            None
        );
        // Past the last finite bound: that bound, as Prometheus answers.
        assert_eq!(
            histogram_quantile(&[(0.001, 1), (f64::INFINITY, 2)], 0.99),
            Some(0.001)
        );
    }

    #[test]
    fn the_floor_pays_only_for_calls_past_the_burst() {
        let describe = Duration::from_millis(10);
        assert_eq!(floor(3, 20.0, 4, describe), describe);
        assert_eq!(
            floor(24, 20.0, 4, describe),
            Duration::from_secs(1) + describe
        );
    }

    #[test]
    fn buckets_are_read_from_the_text_format() {
        let text = "# TYPE meshwork_ipam_allocation_duration_seconds histogram\n\
            meshwork_ipam_allocation_duration_seconds_sum 0.01\n\
            meshwork_ipam_allocation_duration_seconds_count 3\n\
            meshwork_ipam_allocation_duration_seconds_bucket{le=\"5e-5\"} 1\n\
            meshwork_ipam_allocation_duration_seconds_bucket{le=\"+Inf\"} 3\n";
        assert_eq!(buckets(text), vec![(5e-5, 1), (f64::INFINITY, 3)]);
    }
}
