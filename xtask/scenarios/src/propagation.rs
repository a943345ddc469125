//! The propagation figure of `cargo xtask bench sync`: a put in a remote etcd → the event
//! at the ipcache consumer, against the floor of a raw etcd watch on the same prefix
//! receiving the same puts in the same run.
//!
//! The load generator and the raw watch each run on their own thread and runtime, so the
//! in-process mesh being measured can neither stall the pacing (which would send bursts
//! that queue in etcd) nor delay the floor's timestamps. The consumer stamps each entry
//! itself when it applies it.

use std::collections::HashMap;
use std::sync::Arc;
use std::thread::JoinHandle;
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
use meshwork_agent_core::kvstore::{EtcdConfig, KvstoreMetrics, WatchEvent, keys};
use meshwork_agent_core::types::IpCacheEntry;
use meshwork_lab::cilium::Cluster;
use meshwork_lab::etcd::EtcdServer;
use tokio::sync::mpsc;

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
    /// Put issued → the entry applied by the in-process ipcache consumer.
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

/// Puts `puts` new ipcache entries into `server` at `rate` per second and times each to
/// the consumer of a real in-process mesh and to a raw watch.
pub async fn measure(
    server: &EtcdServer,
    cluster: &Cluster,
    rate: u32,
    puts: u32,
) -> anyhow::Result<Figures> {
    let (tap_tx, mut tap_rx) = mpsc::unbounded_channel::<(Arc<IpCacheEntry>, Instant)>();
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
    mesh.send(ClusterConfigEvent::Upsert {
        name: cluster.name.clone(),
        config: RemoteClusterConfig {
            name: cluster.name.clone(),
            etcd: EtcdConfig::new([server.endpoint()]),
            hash: 0,
        },
    })
    .await?;
    let wait = barrier.send(GetMeshWait(SyncKind::IpIdentities)).await?;
    if wait.wait(None).await? != WaitOutcome::Synced {
        bail!("the in-process mesh did not sync");
    }
    // The initial list's events are in the tap too; drain them before timing.
    while tap_rx.try_recv().is_ok() {}

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
    let generator = on_own_thread("load generator", move || generate(endpoint, keys, rate))?;

    let mut consumed = HashMap::new();
    let deadline = tokio::time::Instant::now() + RECEIVE_DEADLINE;
    while consumed.len() < puts as usize {
        match tokio::time::timeout_at(deadline, tap_rx.recv()).await {
            Ok(Some((entry, at))) => {
                consumed.entry(entry.key_name()).or_insert(at);
            }
            _ => break,
        }
    }
    // The in-process mesh stops here, before its etcd does.
    mesh.send(ShutdownMesh).await?;
    let sent = join(generator)?;
    let watched = join(raw)?;
    if consumed.len() < sent.len() {
        bail!(
            "only {} of {} puts reached the consumer",
            consumed.len(),
            sent.len()
        );
    }
    let relative = |key: &str| key.strip_prefix(&prefix).unwrap_or(key).to_owned();
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
