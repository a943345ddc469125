//! `cargo xtask bench wireguard`: 5,000 remote-node peers reconciled through the `WireGuard`
//! actor (events → peer table → one UAPI request) vs one raw UAPI `set` of the same peers
//! (the floor), on two wireguard-go devices in a lab namespace, same run, medians of rounds.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meshwork_agent_core::clustermesh::events::{Change, RemoteEvent, RemoteEvents};
use meshwork_agent_core::types::{Address, AddressType, IpPrefix, Node};
use meshwork_agent_core::wireguard::actor::{FlushNow, Stop, WireGuard, WireGuardConfig};
use meshwork_agent_core::wireguard::key::{Key, PrivateKey};
use meshwork_agent_core::wireguard::local_node::LocalNode;
use meshwork_agent_core::wireguard::metrics::WireguardMetrics;
use meshwork_agent_core::wireguard::uapi::UapiBackend;
use meshwork_lab::net::LabNet;
use meshwork_lab::wireguard::{WireguardGo, uapi_errno, uapi_request, unique_device_name};

use crate::measure::{median, ms};

const GOAL: f64 = 1.5;

/// Options of the WireGuard benchmark.
#[derive(clap::Args)]
pub struct Args {
    /// Remote nodes (peers).
    #[arg(long, default_value_t = 5000)]
    peers: u32,
    /// Rounds; the medians are reported.
    #[arg(long, default_value_t = 3)]
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
    let events = peers
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
        .collect::<anyhow::Result<_>>()?;
    Ok(RemoteEvents {
        cluster: Arc::from("bench"),
        events,
    })
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

/// Runs the benchmark and prints its table and the closing `ratio=` line.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let lab = LabNet::new()?;
    let netns = lab.netns("wgbench")?;
    let peers = peers(args.peers);
    let request = raw_set(&peers);
    let mut floor_times = Vec::new();
    let mut actor_times = Vec::new();
    for round in 0..args.rounds {
        let floor_dev = WireguardGo::start(&netns, &unique_device_name())?;
        let started = Instant::now();
        let answer = uapi_request(&floor_dev.uapi_socket(), &request)?;
        floor_times.push(started.elapsed());
        anyhow::ensure!(uapi_errno(&answer) == Some(0), "raw set failed: {answer}");
        anyhow::ensure!(
            peer_count(&floor_dev)? == peers.len(),
            "floor peers missing"
        );

        let actor_dev = WireguardGo::start(&netns, &unique_device_name())?;
        let actor = WireGuard::new(WireGuardConfig {
            backend: Box::new(UapiBackend::new(actor_dev.device())),
            private_key: PrivateKey::generate(),
            encrypt_node: false,
            userspace: None,
            metrics: WireguardMetrics::default(),
            local_node: LocalNode::default(),
        })?
        .start_own_arbiter();
        let batch = events(&peers)?;
        let started = Instant::now();
        actor.do_send(batch);
        let applied = actor.send(FlushNow).await?;
        actor_times.push(started.elapsed());
        // Its arbiter ends with it; the device goes when `actor_dev` drops.
        actor.send(Stop).await?;
        anyhow::ensure!(applied == peers.len(), "the actor applied {applied} peers");
        anyhow::ensure!(
            peer_count(&actor_dev)? == peers.len(),
            "actor peers missing"
        );
        eprintln!(
            "round {round}: floor {:.1} ms, actor {:.1} ms",
            ms(floor_times[round]),
            ms(actor_times[round])
        );
    }
    let floor = median(&mut floor_times).max(Duration::from_micros(1));
    let through_actor = median(&mut actor_times);
    let ratio = through_actor.as_secs_f64() / floor.as_secs_f64();
    println!("what                                   median");
    println!(
        "raw UAPI set of {} peers (floor)   {:>8.1} ms",
        args.peers,
        ms(floor)
    );
    println!(
        "WireGuard actor reconcile            {:>8.1} ms",
        ms(through_actor)
    );
    println!("goal ratio <= {GOAL:.2}");
    println!("ratio={ratio:.2} peers={}", args.peers);
    Ok(())
}
