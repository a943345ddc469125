//! The propagation figure of `cargo xtask bench sync`: a put in a remote etcd → the event
//! at the ipcache consumer, against the floor of a raw etcd watch on the same prefix
//! receiving the same puts in the same run.
//!
//! The agent is the real one, in process: [`AgentBuilder`] wires its actors exactly as the
//! binary does (without the BPF datapath or metrics), with a [`Stamper`] observing its remote
//! events. The load generator and the raw watch each run on their own thread and runtime, so
//! the in-process agent being measured can neither stall the pacing (which would send bursts
//! that queue in etcd) nor delay the floor's timestamps. The observer stamps each entry
//! itself when it handles it.

use std::collections::{HashMap, HashSet};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use actix::{Actor, Context, Handler, Message};
use anyhow::{Context as _, bail};
use clap::Parser as _;
use meshwork_agent::{AgentBuilder, Args};
use meshwork_clustermesh::events::RemoteEvents;
use meshwork_clustermesh::{SyncKind, WaitOutcome};
use meshwork_kvstore::{WatchEvent, keys};
use meshwork_lab::cilium::Cluster;
use meshwork_lab::etcd::EtcdServer;
use meshwork_types::{Change, RemoteEvent};
use tokio::sync::mpsc;

use meshwork_lab::agent::write_cluster_config;

use crate::load::connect;
use crate::measure::{ms, quantile};

/// How long the receivers wait for the last put before giving up.
const RECEIVE_DEADLINE: Duration = Duration::from_secs(60);

/// Percentiles of one latency distribution, in milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl Percentiles {
    fn of(mut values: Vec<f64>) -> Self {
        values.sort_by(f64::total_cmp);
        Self {
            p50: quantile(&values, 0.50),
            p99: quantile(&values, 0.99),
        }
    }
}

/// The propagation figures.
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    /// Put issued → the entry handled by an observer of the in-process agent's consumers.
    pub consumer: Percentiles,
    /// Put issued → the event on a raw etcd watch of the same prefix (the floor).
    pub raw_watch: Percentiles,
    /// Put issued → etcd's acknowledgement.
    pub ack: Percentiles,
}

/// One put as the load generator saw it.
struct Sent {
    key: String,
    issued: Instant,
    acked_after: Duration,
}

/// An observer of the agent's remote events: stamps every ipcache upsert when it handles it
/// and hands `(key below the ipcache prefix, stamp)` on.
struct Stamper {
    stamps: mpsc::UnboundedSender<(String, Instant)>,
}

impl Actor for Stamper {
    type Context = Context<Self>;
}

impl Handler<RemoteEvents> for Stamper {
    type Result = ();

    fn handle(&mut self, batch: RemoteEvents, _: &mut Context<Self>) {
        let at = Instant::now();
        for event in batch.events.iter() {
            if let RemoteEvent::IpCache {
                change: Change::Upsert(entry),
                ..
            } = event
            {
                let _ = self.stamps.send((entry.key_name(), at));
            }
        }
    }
}

/// Answered once every batch queued before it was handled.
#[derive(Message)]
#[rtype(result = "()")]
struct Handled;

impl Handler<Handled> for Stamper {
    type Result = ();

    fn handle(&mut self, _: Handled, _: &mut Context<Self>) {}
}

/// Puts `puts` new ipcache entries into `server` at `rate` per second and times each to
/// an observer of a real in-process agent's consumers and to a raw watch.
pub async fn measure(
    server: &EtcdServer,
    cluster: &Cluster,
    rate: u32,
    puts: u32,
) -> anyhow::Result<Figures> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("clustermesh");
    std::fs::create_dir(&config).with_context(|| format!("creating {}", config.display()))?;
    write_cluster_config(&config, &cluster.name, &server.endpoint())?;
    let args = Args::try_parse_from([
        "meshwork-agent".to_owned(),
        "--cluster-name=bench-local".to_owned(),
        "--cluster-id=200".to_owned(),
        "--enable-bpf-datapath=false".to_owned(),
        "--prometheus-serve-addr=".to_owned(),
        "--clustermesh-sync-timeout=10m".to_owned(),
        format!("--clustermesh-config={}", config.display()),
        format!("--state-dir={}", dir.path().join("state").display()),
    ])?;
    let (stamps_tx, mut stamps) = mpsc::unbounded_channel();
    let stamper = Stamper { stamps: stamps_tx }.start();
    let agent = AgentBuilder::new(args)
        .observer(stamper.clone().recipient())
        .start()
        .await?;
    if agent.wait(SyncKind::IpIdentities, None).await? != WaitOutcome::Synced {
        bail!("the in-process agent did not sync");
    }
    // The initial list's events are stamped too: let the observer handle every batch queued
    // so far, then drop their stamps before timing (only the puts' keys count anyway).
    stamper.send(Handled).await?;
    while stamps.try_recv().is_ok() {}

    let endpoint = server.endpoint();
    let prefix = format!("{}/", keys::IPCACHE_DEFAULT_PREFIX);
    let from_revision = connect(&endpoint).await?.revision(&prefix).await? + 1;
    let raw = on_own_thread("raw watch", {
        let (endpoint, prefix) = (endpoint.clone(), prefix.clone());
        move || raw_watch(endpoint, prefix, from_revision, puts as usize)
    })?;
    let keys: Vec<(String, Vec<u8>)> = (0..puts)
        .map(|n| cluster.ipcache(cluster.sizes.ipcache + 1000 + n))
        .collect();
    let relative = |key: &str| key.strip_prefix(&prefix).unwrap_or(key).to_owned();
    let expected: HashSet<String> = keys.iter().map(|(key, _)| relative(key)).collect();
    let generator = on_own_thread("load generator", move || generate(endpoint, keys, rate))?;

    let mut consumed = HashMap::new();
    let deadline = tokio::time::Instant::now() + RECEIVE_DEADLINE;
    while consumed.len() < expected.len() {
        match tokio::time::timeout_at(deadline, stamps.recv()).await {
            Ok(Some((key, at))) if expected.contains(&key) => {
                consumed.entry(key).or_insert(at);
            }
            Ok(Some(_)) => {}
            _ => break,
        }
    }
    // The in-process agent stops here, before its etcd does.
    agent.shutdown().await;
    let sent = join(generator)?;
    let watched = join(raw)?;
    if consumed.len() < sent.len() {
        bail!(
            "only {} of {} puts reached the consumer",
            consumed.len(),
            sent.len()
        );
    }
    let after = |seen: &HashMap<String, Instant>, s: &Sent| {
        seen.get(&relative(&s.key))
            .map_or(f64::MAX, |at| ms(at.saturating_duration_since(s.issued)))
    };
    Ok(Figures {
        consumer: Percentiles::of(sent.iter().map(|s| after(&consumed, s)).collect()),
        raw_watch: Percentiles::of(sent.iter().map(|s| after(&watched, s)).collect()),
        ack: Percentiles::of(sent.iter().map(|s| ms(s.acked_after)).collect()),
    })
}

/// Runs `work` on a new thread with its own single-threaded runtime.
fn on_own_thread<T, F>(
    name: &str,
    work: impl FnOnce() -> F + Send + 'static,
) -> anyhow::Result<JoinHandle<anyhow::Result<T>>>
where
    T: Send + 'static,
    F: Future<Output = anyhow::Result<T>>,
{
    let thread = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(work())
        })
        .with_context(|| format!("starting the {name} thread"))?;
    Ok(thread)
}

fn join<T>(thread: JoinHandle<anyhow::Result<T>>) -> anyhow::Result<T> {
    thread
        .join()
        .map_err(|_| anyhow::anyhow!("a propagation thread panicked"))?
}

/// Issues the puts paced against the clock, each on its own task so a slow one never holds
/// back the next.
async fn generate(
    endpoint: String,
    keys: Vec<(String, Vec<u8>)>,
    rate: u32,
) -> anyhow::Result<Vec<Sent>> {
    let backend = connect(&endpoint).await?;
    let interval = Duration::from_secs(1) / rate.max(1);
    let started = Instant::now();
    let mut inflight = Vec::with_capacity(keys.len());
    for (n, (key, value)) in (0u32..).zip(keys) {
        let due = started + interval * n;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            tokio::time::sleep(wait).await;
        }
        let backend = backend.clone();
        inflight.push(tokio::spawn(async move {
            let issued = Instant::now();
            backend.put(&key, value).await?;
            anyhow::Ok(Sent {
                key,
                issued,
                acked_after: issued.elapsed(),
            })
        }));
    }
    let mut sent = Vec::with_capacity(inflight.len());
    for put in inflight {
        sent.push(put.await??);
    }
    Ok(sent)
}

/// Watches `prefix` from `from_revision` and stamps the first event of each key, until
/// `count` keys were seen or the deadline passes.
async fn raw_watch(
    endpoint: String,
    prefix: String,
    from_revision: i64,
    count: usize,
) -> anyhow::Result<HashMap<String, Instant>> {
    let backend = connect(&endpoint).await?;
    let mut watch = backend.watch(&prefix, from_revision).await?;
    let mut seen = HashMap::with_capacity(count);
    let deadline = tokio::time::Instant::now() + RECEIVE_DEADLINE;
    while seen.len() < count {
        let Ok(batch) = tokio::time::timeout_at(deadline, watch.next()).await else {
            break;
        };
        let Some(events) = batch? else { break };
        let at = Instant::now();
        for event in events {
            if let WatchEvent::Put { key, .. } = event {
                let key = String::from_utf8_lossy(&key);
                let relative = key.strip_prefix(&prefix).unwrap_or(&key).to_owned();
                seen.entry(relative).or_insert(at);
            }
        }
    }
    Ok(seen)
}
