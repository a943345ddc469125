//! `cargo xtask bench wireguard`: 5,000 remote-node peers reconciled through the agent's
//! `WireGuard` actor (events → peer table → one UAPI request) vs one raw UAPI `set` of the
//! same peers (the floor), on fresh wireguard-go devices in a lab namespace, back to back in
//! each round (alternating which goes first); `ratio=` is the median of the per-round ratios.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Actor as _;
use anyhow::Context as _;
use meshwork_agent::wireguard::actor::{FlushAndCount, Stop, WireGuard};
use meshwork_clustermesh::Consumer;
use meshwork_clustermesh::barrier::SyncBarrier;
use meshwork_clustermesh::barrier_actor::SyncBarrierActor;
use meshwork_clustermesh::events::{ClusterRef, RemoteEvents};
use meshwork_lab::net::{LabNet, Netns};
use meshwork_lab::wireguard::{WireguardGo, uapi_errno, uapi_request, unique_device_name};
use meshwork_types::{Address, AddressType, Change, IpPrefix, Node, RemoteEvent, Resource};
use meshwork_wireguard::device::Device;
use meshwork_wireguard::key::{Key, PrivateKey};
use meshwork_wireguard::local_node::LocalNode;
use meshwork_wireguard::metrics::WireguardMetrics;
use meshwork_wireguard::uapi::UapiBackend;

use crate::measure::{Rounds, back_to_back, ms, odd_rounds};

const GOAL: f64 = 1.5;

/// Options of the WireGuard benchmark.
#[derive(clap::Args)]
pub struct Args {
    /// Remote nodes (peers).
    #[arg(long, default_value_t = 5000)]
    peers: u32,
    /// Rounds (odd), each the raw set and the actor back to back; `ratio=` is the median of
    /// the per-round ratios.
    #[arg(long, default_value_t = 5, value_parser = odd_rounds)]
    rounds: usize,
}

struct Peer {
    key: Key,
    ip: String,
    pod_cidr: String,
}

fn peers(count: u32) -> Vec<Peer> {
    (0..count)
        .map(|i| Peer {
            key: PrivateKey::generate().public_key(),
            ip: format!("10.213.{}.{}", i >> 8, i & 0xff),
            pod_cidr: format!("10.214.{}.{}/32", i >> 8, i & 0xff),
        })
        .collect()
}

fn events(peers: &[Peer]) -> anyhow::Result<RemoteEvents> {
    let mut events = peers
        .iter()
        .enumerate()
        .map(|(i, peer)| {
            let node = Node {
                name: format!("node-{i}"),
                cluster: "bench".to_owned(),
                ip_addresses: vec![Address {
                    address_type: AddressType::InternalIp,
                    ip: Some(peer.ip.parse()?),
                }],
                ipv4_alloc_cidr: Some(peer.pod_cidr.parse::<IpPrefix>()?),
                wireguard_pub_key: peer.key.to_base64(),
                ..Node::default()
            };
            Ok(RemoteEvent::Node {
                change: Change::Upsert(Arc::new(node)),
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    // The end of a first list, as a store sends it: the actor acknowledges it once applied.
    events.push(RemoteEvent::ListDone(Resource::Nodes));
    Ok(RemoteEvents::new(ClusterRef::new("bench", 0), events))
}

/// The floor's request, formatted here independently of the agent's code.
fn raw_set(peers: &[Peer]) -> String {
    let mut text = String::from("set=1\n");
    for peer in peers {
        let _ = write!(
            text,
            "public_key={}\nendpoint={}:51871\nreplace_allowed_ips=true\nallowed_ip={}\n",
            peer.key.to_hex(),
            peer.ip,
            peer.pod_cidr
        );
    }
    text.push('\n');
    text
}

fn peer_count(wg: &WireguardGo) -> anyhow::Result<usize> {
    Ok(wg.uapi_get()?.matches("public_key=").count())
}

/// The floor: one raw UAPI `set` of every peer on a fresh device.
fn floor_round(netns: &Netns, request: &str, peers: usize) -> anyhow::Result<Duration> {
    let device = WireguardGo::start(netns, &unique_device_name())?;
    let started = Instant::now();
    let answer = uapi_request(&device.uapi_socket(), request)?;
    let elapsed = started.elapsed();
    anyhow::ensure!(uapi_errno(&answer) == Some(0), "raw set failed: {answer}");
    anyhow::ensure!(peer_count(&device)? == peers, "floor peers missing");
    Ok(elapsed)
}

/// The subject: the peers' nodes as one batch of remote events through the agent's actor on
/// a fresh device, opened by the device supervisor as the agent opens it.
async fn actor_round(netns: &Netns, peers: &[Peer]) -> anyhow::Result<Duration> {
    let device = WireguardGo::start(netns, &unique_device_name())?;
    let (opened, restored) = Device::open(
        Box::new(UapiBackend::new(device.device())),
        PrivateKey::generate(),
        None,
    )
    .context("opening the device")?;
    // A real barrier takes the actor's acknowledgements, as in the agent.
    let barrier = SyncBarrierActor::new(
        SyncBarrier::new(Duration::from_secs(600)).with_consumer(Consumer::WireGuard),
    )
    .start();
    let actor = WireGuard::new(
        opened,
        &restored,
        false,
        WireguardMetrics::default(),
        LocalNode::default(),
        barrier.recipient(),
    )
    .start_own_arbiter();
    let batch = events(peers)?;
    let started = Instant::now();
    actor.do_send(batch);
    let applied = actor.send(FlushAndCount).await?;
    let elapsed = started.elapsed();
    // Its arbiter ends with it; the device goes when `device` drops.
    actor.send(Stop).await?;
    anyhow::ensure!(applied == peers.len(), "the actor applied {applied} peers");
    anyhow::ensure!(peer_count(&device)? == peers.len(), "actor peers missing");
    Ok(elapsed)
}

/// Runs the benchmark and prints its table and the closing `ratio=` line.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let lab = LabNet::new()?;
    let netns = lab.netns("wgbench")?;
    let peers = peers(args.peers);
    let request = raw_set(&peers);
    println!(
        "WireGuard benchmark: {} remote-node peers, {} rounds",
        args.peers, args.rounds
    );
    let mut rounds = Rounds::default();
    for round in 0..args.rounds {
        let (floor, actor) = back_to_back(
            round,
            || async { floor_round(&netns, &request, peers.len()) },
            || actor_round(&netns, &peers),
        )
        .await?;
        let ratio = actor.as_secs_f64() / floor.max(Duration::from_micros(1)).as_secs_f64();
        println!(
            "  round {}: raw UAPI set {:>7.1} ms   WireGuard actor {:>7.1} ms   ratio {ratio:.2}",
            round + 1,
            ms(floor),
            ms(actor)
        );
        rounds.push(ratio, (floor, actor));
    }
    let (ratio, &(floor, actor)) = rounds.median().context("no rounds")?;
    println!("  per-round ratios: {}", rounds.ratios_line());
    println!("  median round:");
    println!(
        "    raw UAPI set of {} peers (floor)   {:>8.1} ms",
        args.peers,
        ms(floor)
    );
    println!(
        "    WireGuard actor reconcile            {:>8.1} ms",
        ms(actor)
    );
    println!("  goal ratio <= {GOAL:.2}");
    println!("ratio={ratio:.2} peers={}", args.peers);
    Ok(())
}
