//! `cargo xtask bench eni`: 100 nodes (moto instances, CiliumNode keys in etcd) from zero to
//! pre-allocate 8 through the operator's actors in this process, the EC2 calls counted by
//! the patched moto. The floor is the token bucket itself: every call the run made, at the
//! configured rate (calls ÷ qps), so each round's floor comes from that round's own run.
//! Rounds start from scratch (moto reset, a fresh etcd); `ratio=` is the median of the
//! per-round ratios, and the calls per node are the median round's.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Arbiter;
use anyhow::{Context, bail};
use meshwork_kvstore::etcd::DEFAULT_PAGE_SIZE;
use meshwork_kvstore::{EtcdBackend, WatchStoreOptions};
use meshwork_lab::eni_scene::{EniScene, INSTANCE_TYPE, REGION, ZONE};
use meshwork_lab::etcd::{EtcdOptions, EtcdServer};
use meshwork_lab::moto::MotoServer;
use meshwork_lab::wait::Wait;
use meshwork_operator::cilium_node::{CiliumNode, CiliumNodeSpec};
use meshwork_operator::ec2::{Ec2, Ec2Config, Ec2Metrics};
use meshwork_operator::instances::shared;
use meshwork_operator::manager::{
    self, InstancesConfig, LimitsCache, ManagerConfig, PassDeps, ReleaseConfig, watch,
};
use meshwork_operator::node_store::etcd::{decode, key};
use meshwork_operator::node_store::{EtcdStore, KEY_PREFIX};
use prometheus_client::registry::Registry;
use tokio::sync::oneshot;

use crate::measure::{Rounds, odd_rounds};

/// Goals of the issue: mutating calls per node, and wall time over the floor.
const GOAL_MUTATING: f64 = 3.0;
const GOAL_RATIO: f64 = 1.20;
/// EC2 actions that change something.
pub(crate) const MUTATING: &[&str] = &[
    "CreateNetworkInterface",
    "AttachNetworkInterface",
    "ModifyNetworkInterfaceAttribute",
    "AssignPrivateIpAddresses",
    "UnassignPrivateIpAddresses",
    "DetachNetworkInterface",
    "DeleteNetworkInterface",
];

/// Options of the ENI benchmark.
#[derive(clap::Args)]
pub struct Args {
    /// Nodes (instances).
    #[arg(long, default_value_t = 100)]
    nodes: usize,
    /// Addresses each node pre-allocates.
    #[arg(long, default_value_t = 8)]
    pre_allocate: i64,
    /// The token bucket's rate (`--limit-ipam-api-qps`).
    #[arg(long, default_value_t = 20.0)]
    qps: f64,
    /// The token bucket's burst (`--limit-ipam-api-burst`).
    #[arg(long, default_value_t = 4)]
    burst: u32,
    /// Give up on a round after this many seconds.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    /// Rounds (odd), each from scratch; `ratio=` is the median of the per-round ratios.
    #[arg(long, default_value_t = 3, value_parser = odd_rounds)]
    rounds: usize,
}

fn node(name: &str, instance: &str, scene: &EniScene, pre: i64) -> CiliumNode {
    let mut spec = CiliumNodeSpec::default();
    spec.eni.instance_id = instance.to_owned();
    spec.eni.instance_type = INSTANCE_TYPE.to_owned();
    // Device 0 is the instance's own; every node gets a new ENI, as a fresh node in Cilium.
    spec.eni.first_interface_index = Some(1);
    spec.eni.vpc_id.clone_from(&scene.vpc);
    spec.eni.availability_zone = ZONE.to_owned();
    spec.ipam.pre_allocate = pre;
    CiliumNode::new(name, spec)
}

/// Nodes whose published pool holds at least `pre` addresses, every one naming an ENI in
/// the published status.
async fn nodes_done(backend: &EtcdBackend, pre: usize) -> anyhow::Result<usize> {
    let mut pages = backend.list(KEY_PREFIX, DEFAULT_PAGE_SIZE);
    let mut done = 0;
    while let Some(page) = pages.recv().await {
        for kv in page?.kvs() {
            let node = decode(kv.key_str()?, kv.value(), kv.mod_revision())?;
            anyhow::ensure!(
                node.pool_ips_without_eni().is_empty(),
                "published a pool IP without its ENI"
            );
            if node.spec.ipam.pool.len() >= pre {
                done += 1;
            }
        }
    }
    Ok(done)
}

/// The calls of `actions` among `calls` (by action, as moto counts them).
pub(crate) fn count(calls: &serde_json::Map<String, serde_json::Value>, actions: &[&str]) -> u64 {
    actions
        .iter()
        .filter_map(|action| calls.get(*action).and_then(serde_json::Value::as_u64))
        .sum()
}

/// What one round measured.
struct Round {
    /// The operator's start → every node done.
    wall: Duration,
    /// Every call of the run at the token bucket's rate.
    floor: Duration,
    /// Calls by EC2 action.
    calls: serde_json::Map<String, serde_json::Value>,
}

impl Round {
    /// A round that took `wall` and made `calls` through a bucket of `qps`.
    fn new(wall: Duration, calls: serde_json::Map<String, serde_json::Value>, qps: f64) -> Self {
        let mut round = Self {
            wall,
            floor: Duration::ZERO,
            calls,
        };
        round.floor = Duration::from_secs_f64(round.total() as f64 / qps);
        round
    }

    fn total(&self) -> u64 {
        self.calls
            .values()
            .filter_map(serde_json::Value::as_u64)
            .sum()
    }

    fn ratio(&self) -> f64 {
        self.wall.as_secs_f64() / self.floor.as_secs_f64()
    }
}

/// One round from scratch: the instances in a reset moto, their CiliumNodes in a fresh etcd,
/// then the operator until every node is done.
async fn round(moto: &MotoServer, args: &Args) -> anyhow::Result<Round> {
    moto.reset()?;
    let etcd = EtcdServer::start_with(EtcdOptions {
        data_in_memory: true,
        ..EtcdOptions::default()
    })?;
    let backend = crate::load::connect(&etcd.endpoint()).await?;
    // A /20: room for every node's ENIs.
    let scene = EniScene::create(moto, "10.213.0.0/20", INSTANCE_TYPE, args.nodes).await?;
    for (index, instance) in scene.instances.iter().enumerate() {
        let name = format!("node-{index:03}");
        let object = node(&name, instance, &scene, args.pre_allocate);
        backend
            .put(&key(&name), serde_json::to_vec(&object)?)
            .await?;
    }
    drop(scene.sdk);
    moto.clear_calls()?;

    let mut registry = Registry::with_prefix("meshwork");
    let mut config = Ec2Config::new(REGION).with_endpoint(moto.endpoint());
    config.qps = args.qps;
    config.burst = args.burst;
    let ec2 = Ec2::connect(&config, Ec2Metrics::register(&mut registry)).await?;
    let deps = PassDeps {
        ec2,
        cache: shared(),
        limits: Arc::new(LimitsCache::default()),
        store: EtcdStore::new(backend.clone()),
        release: ReleaseConfig::default(),
    };
    // The round's operator runs on an arbiter of its own: stopping it at the end of the round
    // ends every actor it started, so no later round meets (or counts the calls of) it.
    let arbiter = Arbiter::new();
    let (started, operator) = oneshot::channel();
    let start = Instant::now();
    arbiter.spawn(async move {
        let operator = manager::start(deps, &ManagerConfig::default(), InstancesConfig::default());
        let _ = started.send(operator);
    });
    let operator = operator.await.context("starting the operator")?;
    let watching = tokio::spawn(watch::watch_etcd(
        backend.clone(),
        operator.nodes.clone().recipient(),
        WatchStoreOptions::new("bench"),
    ));
    let pre = usize::try_from(args.pre_allocate)?;
    // Polls the published objects every 20 ms (adds ≤ 20 ms to the wall time); an error
    // (a pool IP without its ENI) ends the wait at once.
    let done = Wait::new(format!("{} nodes pre-allocated", args.nodes))
        .timeout(Duration::from_secs(args.timeout))
        .every(Duration::from_millis(20))
        .until_async(
            || nodes_done(&backend, pre),
            |done| !matches!(done, Ok(n) if *n < args.nodes),
        )
        .await;
    let wall = start.elapsed();
    let calls = moto.call_counts();
    // Stop watching before etcd goes, and the operator before the next round.
    watching.abort();
    drop(operator);
    arbiter.stop();
    if arbiter.join().is_err() {
        bail!("the operator's arbiter panicked");
    }
    done??;
    Ok(Round::new(wall, calls?, args.qps))
}

/// Runs the benchmark and prints its table and the closing line.
pub async fn run(args: Args) -> anyhow::Result<()> {
    println!(
        "ENI allocation: {} nodes (m5.large, first-interface-index 1) from 0 to pre-allocate {}, {} rounds",
        args.nodes, args.pre_allocate, args.rounds
    );
    println!("token bucket: {} qps, burst {}", args.qps, args.burst);
    let nodes = args.nodes as f64;
    let moto = MotoServer::start()?;
    let mut rounds = Rounds::default();
    for n in 0..args.rounds {
        let round = round(&moto, &args).await?;
        let ratio = round.ratio();
        println!(
            "  round {}: {} EC2 calls ({:.2} mutating per node), wall {:.2} s, floor {:.2} s   ratio {ratio:.2}",
            n + 1,
            round.total(),
            count(&round.calls, MUTATING) as f64 / nodes,
            round.wall.as_secs_f64(),
            round.floor.as_secs_f64()
        );
        rounds.push(ratio, round);
    }
    let (ratio, median) = rounds.median().context("no rounds")?;
    let total = median.total();
    let mutating = count(&median.calls, MUTATING);
    let by_action: BTreeMap<&String, u64> = median
        .calls
        .iter()
        .filter_map(|(action, n)| Some((action, n.as_u64()?)))
        .collect();
    println!("per-round ratios: {}", rounds.ratios_line());
    println!("median round:");
    for (action, n) in &by_action {
        println!("  {action:<34} {n:>6}  ({:.2}/node)", *n as f64 / nodes);
    }
    println!(
        "mutating EC2 calls per node  {:>8.2}   (goal ≤ {GOAL_MUTATING})",
        mutating as f64 / nodes
    );
    println!("EC2 calls per node (total)   {:>8.2}", total as f64 / nodes);
    println!(
        "wall time                    {:>8.2} s",
        median.wall.as_secs_f64()
    );
    println!(
        "floor (calls ÷ qps)          {:>8.2} s",
        median.floor.as_secs_f64()
    );
    println!("ratio (median of rounds)     {ratio:>8.2}   (goal ≤ {GOAL_RATIO})");
    println!(
        "mutating_calls_per_node={:.1} ratio={ratio:.2}",
        mutating as f64 / nodes
    );
    Ok(())
}
