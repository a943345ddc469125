//! The agent's IPAM (`--ipam eni | cluster-pool`): the pool of `meshwork-ipam` behind one
//! shared handle ([`Ipam`]), the operator session that feeds it in ENI mode
//! ([`client`]), and the `meshwork.agent.v1.Ipam` service on the API socket ([`service`]).
//!
//! - Start ([`open`]): the checkpoint (`<state-dir>/ipam.json`) is restored first — a
//!   corrupt one fails the start naming the file. Cluster-pool allocates the router IP (the
//!   CIDR's first host) at once. ENI mode starts the operator session (learning the instance
//!   ID from the metadata service first, [`imds`], when `--eni-instance-id` is not given):
//!   RegisterNode, then
//!   WatchNode; each snapshot goes to the plain [`EniPool`], and once the pool is ready the
//!   router IP is allocated (owner `router`) from it.
//! - Readiness ([`Ipam::wait_ready`]): the agent's gRPC health turns SERVING only once the
//!   router IP is allocated, which in ENI mode waits for the pool to hold `required` IPs; a
//!   progress line is logged meanwhile. The socket, `Ipam.Status` included, is served before.
//! - Calls: allocations and releases run where they may block — in place on a worker of the
//!   multi-thread runtime, else on tokio's blocking pool (the checkpoint is fsynced before an
//!   IP is returned); each allocation's snapshot generation is logged at debug and
//!   returned in `AllocateResponse.generation`.

pub mod args;
pub mod client;
pub mod convert;
pub mod imds;
pub mod metrics;
pub mod service;

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use meshwork_ipam::{
    AllocateError, Allocated, Allocation, Checkpoint, CheckpointError, ClusterPool,
    ClusterPoolError, EniPool, Mode, Offer, ROUTER_OWNER, ReleaseError, Report,
};
use meshwork_proto::agent::v1 as agent_pb;
use meshwork_proto::ipam::v1 as pb;
use prometheus_client::registry::Registry;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use self::args::IpamMode;
use self::metrics::{Gauges, IpamMetrics};
use crate::args::{Args, ArgsError};

/// How the IPAM's background work is paced (tests shorten it).
#[derive(Debug, Clone)]
pub struct IpamSettings {
    /// The first reconnect delay to the operator.
    pub min_retry_delay: Duration,
    /// The longest reconnect delay.
    pub max_retry_delay: Duration,
    /// How long a connect to the operator may take.
    pub connect_timeout: Duration,
    /// How long a `ReportUsage` call may take before the session is given up.
    pub report_timeout: Duration,
    /// How often the readiness wait logs its progress.
    pub progress_interval: Duration,
}

impl Default for IpamSettings {
    fn default() -> Self {
        Self {
            min_retry_delay: Duration::from_millis(200),
            max_retry_delay: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            report_timeout: Duration::from_secs(10),
            progress_interval: Duration::from_secs(5),
        }
    }
}

/// Why the IPAM could not start.
#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    /// A flag is unusable.
    #[error(transparent)]
    Args(#[from] ArgsError),
    /// The checkpoint could not be read.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The cluster pool could not be set up.
    #[error(transparent)]
    ClusterPool(#[from] ClusterPoolError),
    /// Cluster-pool: the router IP could not be allocated.
    #[error("allocating the router IP: {0}")]
    Router(AllocateError),
}

/// The agent stops: the call did not run.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the agent is shutting down")]
pub struct ShuttingDown;

/// Where the IPAM stands, for the readiness wait and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// The pool held `required` IPs once (always, in cluster-pool).
    pub pool_ready: bool,
    /// The router IP, once allocated.
    pub router_ip: Option<Ipv4Addr>,
    /// ENI mode: the held generation.
    pub generation: Option<String>,
    /// IPs the pool may hand out.
    pub available: usize,
    /// Cilium's `required`, once known.
    pub required: Option<u32>,
}

impl Progress {
    /// The agent's IPAM is ready: the pool held `required` IPs in this run (a restored
    /// router IP does not make a restarted agent ready before that) and the router IP is
    /// allocated.
    pub fn ready(&self) -> bool {
        self.pool_ready && self.router_ip.is_some()
    }
}

enum Pool {
    Eni(EniPool),
    Cluster(ClusterPool),
}

struct Shared {
    mode: Mode,
    pool: Mutex<Pool>,
    /// Wakes the operator session: an allocation or release to report.
    changed: Notify,
    progress: watch::Sender<Progress>,
    connected: AtomicBool,
    metrics: IpamMetrics,
    client: Mutex<Option<JoinHandle<()>>>,
}

/// The agent's IPAM; clones share it.
#[derive(Clone)]
pub struct Ipam {
    shared: Arc<Shared>,
}

/// Opens the IPAM `args` ask for (`None` without `--ipam`): the checkpoint restored, the
/// router IP allocated (cluster-pool) or the operator session started (ENI; call inside a
/// tokio runtime). Its metrics go into `registry`.
pub fn open(
    args: &Args,
    registry: &mut Registry,
    settings: &IpamSettings,
) -> Result<Option<Ipam>, IpamError> {
    let Some(mode) = args.ipam.ipam else {
        return Ok(None);
    };
    let checkpoint = Checkpoint::in_dir(&args.state_dir);
    let node = args.node_name();
    let pool = match mode {
        IpamMode::ClusterPool => {
            let cidr = args.ipv4_alloc_cidr.as_deref().unwrap_or_default();
            let cidr = args.ipam.cluster_cidr(cidr)?;
            Pool::Cluster(ClusterPool::restore(cidr, checkpoint)?)
        }
        IpamMode::Eni => Pool::Eni(EniPool::restore(checkpoint)?),
    };
    let mode = Mode::from(mode);
    let ipam = Ipam {
        shared: Arc::new(Shared {
            mode,
            pool: Mutex::new(pool),
            changed: Notify::new(),
            progress: watch::Sender::new(Progress::default()),
            connected: AtomicBool::new(false),
            metrics: IpamMetrics::register(registry, mode),
            client: Mutex::new(None),
        }),
    };
    ipam.log_restored();
    ipam.update_progress();
    match mode {
        Mode::ClusterPool => {
            // Synchronous at start: nothing waits on an operator.
            let allocated = ipam
                .pool()
                .allocate_blocking(ROUTER_OWNER, "")
                .map_err(IpamError::Router)?;
            tracing::info!(router_ip = %allocated.allocation.ip, existing = allocated.existing, "IPAM cluster-pool: router IP");
            ipam.update_progress();
        }
        Mode::Eni => {
            let client = client::ClientSettings {
                addr: args.ipam.operator_addr.clone().unwrap_or_default(),
                tls: args.ipam.operator_tls()?,
                register: args.ipam.register_request(&node),
                metadata_endpoint: args.ipam.eni_metadata_endpoint.clone(),
                settings: settings.clone(),
            };
            *lock(&ipam.shared.client) = Some(client::start(ipam.clone(), client));
        }
    }
    Ok(Some(ipam))
}

/// Runs `call`, which writes and fsyncs the checkpoint, where it may block: in place on a
/// worker of the multi-thread runtime (tokio moves the worker's other tasks away), else on
/// the blocking pool. In place, no other thread has to wake and be scheduled first: on a node
/// whose cores are busy that wait was most of an allocation's tail. A panic in `call` goes on
/// in the caller; a runtime that shuts down answers [`ShuttingDown`].
async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ShuttingDown> {
    if tokio::runtime::Handle::current().runtime_flavor()
        == tokio::runtime::RuntimeFlavor::MultiThread
    {
        return Ok(tokio::task::block_in_place(call));
    }
    match tokio::task::spawn_blocking(call).await {
        Ok(result) => Ok(result),
        Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
        Err(_) => Err(ShuttingDown),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Pool {
    fn allocate_blocking(&mut self, owner: &str, pod: &str) -> Result<Allocated, AllocateError> {
        match self {
            Self::Eni(pool) => pool.allocate(owner, pod),
            Self::Cluster(pool) => pool.allocate(owner, pod),
        }
    }

    fn release_blocking(&mut self, owner: &str) -> Result<Option<Allocation>, ReleaseError> {
        match self {
            Self::Eni(pool) => pool.release(owner),
            Self::Cluster(pool) => pool.release(owner),
        }
    }
}

impl Ipam {
    fn pool(&self) -> MutexGuard<'_, Pool> {
        lock(&self.shared.pool)
    }

    /// `eni` or `cluster-pool`.
    pub fn mode(&self) -> Mode {
        self.shared.mode
    }

    /// Where the IPAM stands; changes are sent as they happen.
    pub fn progress(&self) -> watch::Receiver<Progress> {
        self.shared.progress.subscribe()
    }

    /// Hands out an IP to `owner` (see [`EniPool::allocate`], [`ClusterPool::allocate`]);
    /// the checkpoint is written, on tokio's blocking pool, before it returns.
    pub async fn allocate(
        &self,
        owner: &str,
        pod: &str,
    ) -> Result<Result<Allocated, AllocateError>, ShuttingDown> {
        let (this, owner, pod) = (self.clone(), owner.to_owned(), pod.to_owned());
        let asked = Instant::now();
        blocking(move || {
            let result = this.pool().allocate_blocking(&owner, &pod);
            this.allocated(&owner, &result, asked);
            result
        })
        .await
    }

    fn allocated(&self, owner: &str, result: &Result<Allocated, AllocateError>, asked: Instant) {
        match result {
            Ok(Allocated {
                allocation,
                existing: false,
            }) => {
                self.shared.metrics.allocated(asked.elapsed());
                tracing::debug!(
                    owner,
                    pod = %allocation.pod,
                    ip = %allocation.ip,
                    eni = allocation.eni.as_ref().map_or("", |e| e.id.as_str()),
                    generation = %allocation.generation,
                    "IPAM: allocated"
                );
                self.shared.changed.notify_one();
                if owner == ROUTER_OWNER {
                    self.update_progress();
                }
            }
            Ok(Allocated { existing: true, .. }) => {}
            Err(err) => {
                self.shared.metrics.failed(err);
                tracing::debug!(owner, %err, "IPAM: allocation failed");
            }
        }
    }

    /// Gives `owner`'s IP back (checkpoint written first, on the blocking pool).
    pub async fn release(
        &self,
        owner: &str,
    ) -> Result<Result<Option<Allocation>, ReleaseError>, ShuttingDown> {
        let (this, owner) = (self.clone(), owner.to_owned());
        blocking(move || {
            let result = this.pool().release_blocking(&owner);
            if let Ok(Some(allocation)) = &result {
                tracing::debug!(owner, ip = %allocation.ip, "IPAM: released");
                this.shared.changed.notify_one();
            }
            result
        })
        .await
    }

    /// Waits until the IPAM is ready (the router IP allocated; in ENI mode after the pool
    /// held `required` IPs), logging where it stands every `interval`.
    pub async fn wait_ready(&self, interval: Duration) {
        let mut progress = self.progress();
        let mut next_log = tokio::time::Instant::now();
        loop {
            let now = progress.borrow_and_update().clone();
            if now.ready() {
                return;
            }
            if tokio::time::Instant::now() >= next_log {
                tracing::info!(
                    available = now.available,
                    required = now
                        .required
                        .map_or_else(|| "unknown".to_owned(), |r| r.to_string()),
                    generation = now.generation.as_deref().unwrap_or("none"),
                    operator_connected = self.shared.connected.load(Ordering::Relaxed),
                    "waiting for IPs to become available in the ENI pool (the agent stays NOT_SERVING)"
                );
                next_log += interval;
            }
            let _ = tokio::time::timeout_at(next_log, progress.changed()).await;
        }
    }

    /// `Ipam.Status`.
    pub fn status(&self) -> agent_pb::IpamStatusResponse {
        let mut status = agent_pb::IpamStatusResponse {
            mode: self.shared.mode.as_str().to_owned(),
            operator_connected: self.shared.connected.load(Ordering::Relaxed),
            ..agent_pb::IpamStatusResponse::default()
        };
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        match &*self.pool() {
            Pool::Eni(pool) => {
                let s = pool.status(Instant::now());
                status.available = count(s.available);
                status.used = count(s.used);
                status.required = s.required.unwrap_or(0);
                status.ready = s.ready;
                status.generation = s.generation.unwrap_or_default();
                status.generation_age_ms = s
                    .age
                    .map_or(0, |age| u64::try_from(age.as_millis()).unwrap_or(u64::MAX));
                status.inconsistent_snapshots = s.inconsistent_snapshots;
                status.allocations = s.allocations.iter().map(convert::ip_allocation).collect();
                status.router_ip = s.router_ip.map(|ip| ip.to_string()).unwrap_or_default();
            }
            Pool::Cluster(pool) => {
                status.available = pool.capacity();
                status.used = count(pool.used());
                status.required = 1;
                status.ready = pool.has_router();
                status.allocations = pool.allocations().map(convert::ip_allocation).collect();
                status.router_ip = pool
                    .allocation(ROUTER_OWNER)
                    .map(|a| a.ip.to_string())
                    .unwrap_or_default();
                // Cluster-pool has no operator.
                status.operator_connected = false;
            }
        }
        status
    }

    /// Sets the metrics' gauges from the pool (before each scrape).
    pub fn refresh_metrics(&self) {
        let gauges = match &*self.pool() {
            Pool::Eni(pool) => {
                let s = pool.status(Instant::now());
                Gauges {
                    available: s.available as u64,
                    used: s.used as u64,
                    orphans: s.orphans.len() as u64,
                    snapshot_age_seconds: s.age.map_or(0.0, |age| age.as_secs_f64()),
                    connected: self.shared.connected.load(Ordering::Relaxed),
                }
            }
            Pool::Cluster(pool) => Gauges {
                available: u64::from(pool.capacity()),
                used: pool.used() as u64,
                orphans: pool.orphans().count() as u64,
                ..Gauges::default()
            },
        };
        self.shared.metrics.set(gauges);
    }

    /// Stops the operator session (allocations stay in the checkpoint).
    pub fn stop(&self) {
        if let Some(client) = lock(&self.shared.client).take() {
            client.abort();
        }
        self.shared.connected.store(false, Ordering::Relaxed);
    }

    fn log_restored(&self) {
        let pool = self.pool();
        let (checkpoint, count) = match &*pool {
            Pool::Eni(pool) => (pool.checkpoint(), pool.status(Instant::now()).used),
            Pool::Cluster(pool) => (pool.checkpoint(), pool.used()),
        };
        tracing::info!(mode = %self.shared.mode, restored = count, checkpoint = %checkpoint.path().display(), "IPAM: allocations restored");
        if let Pool::Cluster(pool) = &*pool {
            for orphan in pool.orphans() {
                tracing::warn!(owner = %orphan.owner, ip = %orphan.ip, cidr = %pool.cidr(), "IPAM: a restored IP is outside --ipv4-alloc-cidr; kept for its owner, never handed out again");
            }
        }
    }

    fn update_progress(&self) {
        let progress = match &*self.pool() {
            Pool::Eni(pool) => {
                let snapshot = pool.snapshot();
                Progress {
                    pool_ready: pool.is_ready(),
                    router_ip: pool.router_ip(),
                    generation: snapshot.map(|s| s.generation.clone()),
                    available: snapshot.map_or(0, meshwork_ipam::Snapshot::available),
                    required: pool.required(),
                }
            }
            Pool::Cluster(pool) => Progress {
                pool_ready: true,
                router_ip: pool.allocation(ROUTER_OWNER).map(|a| a.ip),
                generation: None,
                available: usize::try_from(pool.capacity()).unwrap_or(usize::MAX),
                required: Some(1),
            },
        };
        self.shared.progress.send_if_modified(|old| {
            let changed = *old != progress;
            *old = progress;
            changed
        });
    }

    // The operator session's side (ENI mode).

    /// Hands an operator snapshot to the pool; allocates the router IP once it is ready.
    async fn offer(&self, snapshot: pb::NodeSnapshot) {
        let snapshot = convert::snapshot(snapshot);
        let offer = match &mut *self.pool() {
            Pool::Eni(pool) => pool.offer(snapshot, Instant::now()),
            Pool::Cluster(_) => return,
        };
        match offer {
            Offer::Accepted {
                generation,
                first,
                became_ready,
                orphaned,
            } => {
                if first {
                    tracing::info!(%generation, "IPAM: first snapshot from the operator");
                } else {
                    tracing::debug!(%generation, "IPAM: snapshot");
                }
                for orphan in orphaned {
                    tracing::warn!(owner = %orphan.owner, ip = %orphan.ip, %generation, "IPAM: an allocated IP is not in the operator's pool; kept for its owner, not reported as used, never handed out again");
                }
                if became_ready {
                    tracing::info!(%generation, "IPAM: the ENI pool holds the required IPs");
                }
            }
            Offer::Unchanged => {}
            Offer::Inconsistent {
                generation,
                why,
                counted,
            } => {
                if counted {
                    self.shared.metrics.inconsistent();
                }
                tracing::warn!(%generation, %why, "IPAM: refusing an inconsistent snapshot; keeping the previous one and waiting for the next generation");
            }
        }
        self.update_progress();
        self.ensure_router().await;
    }

    /// Allocates the router IP once the pool is ready (ENI mode), if it is not yet.
    async fn ensure_router(&self) {
        let needed = matches!(&*self.pool(), Pool::Eni(pool) if pool.is_ready() && pool.router_ip().is_none());
        if !needed {
            return;
        }
        match self.allocate(ROUTER_OWNER, "").await {
            Ok(Ok(allocated)) => {
                tracing::info!(router_ip = %allocated.allocation.ip, generation = %allocated.allocation.generation, "IPAM: router IP allocated");
            }
            // Tried again with the next snapshot.
            Ok(Err(err)) => {
                tracing::warn!(%err, "IPAM: allocating the router IP failed; retrying with the next snapshot");
            }
            Err(ShuttingDown) => {}
        }
    }

    fn set_connected(&self, connected: bool) {
        self.shared.connected.store(connected, Ordering::Relaxed);
    }

    fn mark_report_due(&self) {
        if let Pool::Eni(pool) = &mut *self.pool() {
            pool.mark_report_due();
        }
    }

    /// The report due, unless the held generation is `refused` (the operator refused a
    /// report of it: the next snapshot is awaited).
    fn take_report(&self, refused: Option<&str>) -> Option<Report> {
        let Pool::Eni(pool) = &mut *self.pool() else {
            return None;
        };
        if refused.is_some() && pool.snapshot().map(|s| s.generation.as_str()) == refused {
            return None;
        }
        pool.take_report()
    }
}
