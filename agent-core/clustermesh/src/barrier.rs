//! The sync barrier: per-cluster latches and the mesh-level waits (contract §4).
//!
//! Each remote cluster object gets its latches once, when its config file appears; reconnects
//! never reset them. A store's first list travels in-band, after its entries, to every
//! consumer ([`meshwork_types::RemoteEvent::ListDone`]). Two kinds of latch complete from it:
//!
//! - *delivered* (one per resource): the store handed the list-done to every consumer's
//!   mailbox;
//! - *applied* (one per resource and registered [`Consumer`]): that consumer has applied the
//!   list (written the map, configured the device) and says so itself.
//!
//! A wait on a resource needs its delivered latch and the applied latch of every registered
//! consumer it asks for; a resource nobody consumes completes on delivery alone. So the
//! services latch is done only once the datapath has programmed every service listed before
//! it, and a wait that does not ask for WireGuard is never held up by the WireGuard device.
//! `stopped` fires when the cluster is removed or the agent stops.
//!
//! A mesh-level wait snapshots the clusters known at call time and waits for each; a cluster
//! that stops first is ignored (no deadlock when it goes away before syncing); zero clusters
//! return at once. The circuit breaker bounds every wait: when it fires, the wait logs once
//! per process "expect possible disruption of cross-cluster connections" and succeeds. The
//! wait fails only when its caller gives up first.
//!
//! Latches belong to one incarnation of a cluster: a cluster removed and configured again is
//! a new incarnation with fresh latches, and a late acknowledgement from the old one is
//! ignored.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use meshwork_types::{Resource, SyncKind};
use tokio::sync::watch;
use tokio::time::Instant;

/// Cilium's default `--clustermesh-sync-timeout`.
pub const DEFAULT_SYNC_TIMEOUT: Duration = Duration::from_secs(60);

/// A consumer of remote state that acknowledges applying each cluster's first list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Consumer {
    /// The BPF datapath: ipcache, service and tunnel maps.
    Datapath,
    /// The WireGuard device's peers.
    WireGuard,
    /// The identity cache.
    Identities,
}

impl Consumer {
    /// Every consumer.
    pub const ALL: [Self; 3] = [Self::Datapath, Self::WireGuard, Self::Identities];

    /// The resources this consumer applies.
    pub fn resources(self) -> &'static [Resource] {
        match self {
            Self::Datapath => &[Resource::Nodes, Resource::Services, Resource::IpCache],
            Self::WireGuard => &[Resource::Nodes, Resource::IpCache],
            Self::Identities => &[Resource::Identities],
        }
    }
}

impl fmt::Display for Consumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Datapath => "datapath",
            Self::WireGuard => "wireguard",
            Self::Identities => "identities",
        })
    }
}

/// How a wait ended successfully.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitOutcome {
    /// Every cluster of the snapshot synced (or went away).
    Synced,
    /// The circuit breaker fired; these clusters had not synced.
    BreakerFired {
        /// The clusters still pending.
        pending: Vec<String>,
    },
}

/// Why a wait failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WaitError {
    /// The caller's own deadline passed before the wait ended.
    #[error("waiting for {kind} sync: the caller gave up after {waited:?}")]
    CallerDeadline {
        /// What was awaited.
        kind: SyncKind,
        /// How long it waited.
        waited: Duration,
    },
    /// A per-cluster wait saw the cluster stop first.
    #[error("remote cluster {0} disconnected")]
    Disconnected(String),
}

/// Who completes a latch: the store's delivery, or one consumer's acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Acker {
    Delivery,
    Consumer(Consumer),
}

struct Latches {
    incarnation: u64,
    latches: BTreeMap<(Resource, Acker), watch::Sender<bool>>,
    stopped: watch::Sender<bool>,
}

impl Latches {
    fn new(incarnation: u64, consumers: &[Consumer]) -> Self {
        let mut latches = BTreeMap::new();
        for resource in Resource::ALL {
            latches.insert((resource, Acker::Delivery), watch::Sender::new(false));
        }
        for &consumer in consumers {
            for &resource in consumer.resources() {
                latches.insert(
                    (resource, Acker::Consumer(consumer)),
                    watch::Sender::new(false),
                );
            }
        }
        Self {
            incarnation,
            latches,
            stopped: watch::Sender::new(false),
        }
    }

    fn complete(&self, resource: Resource, acker: Acker) {
        if let Some(latch) = self.latches.get(&(resource, acker)) {
            latch.send_if_modified(|done| !std::mem::replace(done, true));
        }
    }

    /// The latches a wait for `kind` by `scope` needs.
    fn needed<'a>(
        &'a self,
        kind: SyncKind,
        scope: Scope<'a>,
    ) -> impl Iterator<Item = &'a watch::Sender<bool>> + 'a {
        self.latches
            .iter()
            .filter(move |((resource, acker), _)| {
                kind.resources().contains(resource)
                    && match acker {
                        Acker::Delivery => true,
                        Acker::Consumer(consumer) => scope.includes(*consumer),
                    }
            })
            .map(|(_, latch)| latch)
    }

    fn wait(&self, name: &str, kind: SyncKind, scope: Scope<'_>) -> ClusterWait {
        ClusterWait {
            name: name.to_owned(),
            latches: self
                .needed(kind, scope)
                .map(watch::Sender::subscribe)
                .collect(),
            stopped: self.stopped.subscribe(),
        }
    }

    fn is_done(&self, kind: SyncKind, scope: Scope<'_>) -> bool {
        self.needed(kind, scope).all(|latch| *latch.borrow())
    }

    fn resource_done(&self, resource: Resource) -> bool {
        self.latches
            .iter()
            .filter(|((r, _), _)| *r == resource)
            .all(|(_, latch)| *latch.borrow())
    }
}

/// Whose acknowledgements a wait counts.
#[derive(Debug, Clone, Copy)]
pub enum Scope<'a> {
    /// Every registered consumer's.
    All,
    /// Only these consumers' (resources none of them applies complete on delivery).
    Only(&'a [Consumer]),
}

impl Scope<'_> {
    fn includes(self, consumer: Consumer) -> bool {
        match self {
            Self::All => true,
            Self::Only(consumers) => consumers.contains(&consumer),
        }
    }
}

/// The barrier's state: latches per remote cluster. A plain state machine; the actor in
/// [`super::barrier_actor`] is its shell.
pub struct SyncBarrier {
    clusters: HashMap<String, Latches>,
    consumers: Vec<Consumer>,
    breaker: Duration,
    warned: Arc<AtomicBool>,
}

impl SyncBarrier {
    /// A barrier whose mesh-level waits are bounded by `breaker`
    /// (`--clustermesh-sync-timeout`), with no consumer registered yet.
    pub fn new(breaker: Duration) -> Self {
        Self {
            clusters: HashMap::new(),
            consumers: Vec::new(),
            breaker,
            warned: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Registers `consumer`: from now on a cluster's latches of the resources it applies
    /// wait for its acknowledgement. Register every consumer before the first cluster.
    pub fn with_consumer(mut self, consumer: Consumer) -> Self {
        if !self.consumers.contains(&consumer) {
            self.consumers.push(consumer);
        }
        self
    }

    /// The registered consumers.
    pub fn consumers(&self) -> &[Consumer] {
        &self.consumers
    }

    /// Incarnation `incarnation` of a cluster appeared: create its latches (kept if this
    /// incarnation already has them; a new incarnation replaces the old one's).
    pub fn add_cluster(&mut self, cluster: &str, incarnation: u64) {
        match self.clusters.get(cluster) {
            Some(latches) if latches.incarnation == incarnation => {}
            _ => {
                let latches = Latches::new(incarnation, &self.consumers);
                if let Some(old) = self.clusters.insert(cluster.to_owned(), latches) {
                    old.stopped.send_replace(true);
                }
            }
        }
    }

    /// A cluster was removed: its waits stop counting it.
    pub fn remove_cluster(&mut self, cluster: &str) {
        if let Some(latches) = self.clusters.remove(cluster) {
            latches.stopped.send_replace(true);
        }
    }

    /// The agent stops: every pending wait stops counting every cluster.
    pub fn stop_all(&mut self) {
        for (_, latches) in self.clusters.drain() {
            latches.stopped.send_replace(true);
        }
    }

    fn current(&self, cluster: &str, incarnation: u64) -> Option<&Latches> {
        self.clusters
            .get(cluster)
            .filter(|latches| latches.incarnation == incarnation)
    }

    /// `cluster`'s store handed the first list of `resource` to every consumer.
    pub fn delivered(&mut self, cluster: &str, incarnation: u64, resource: Resource) {
        if let Some(latches) = self.current(cluster, incarnation) {
            latches.complete(resource, Acker::Delivery);
        }
    }

    /// `consumer` applied `cluster`'s first list of `resource` (later ones change nothing).
    pub fn applied(
        &mut self,
        cluster: &str,
        incarnation: u64,
        resource: Resource,
        consumer: Consumer,
    ) {
        if let Some(latches) = self.current(cluster, incarnation) {
            latches.complete(resource, Acker::Consumer(consumer));
        }
    }

    /// Whether `cluster`'s latches for `kind` are done for every registered consumer.
    pub fn is_synced(&self, cluster: &str, kind: SyncKind) -> bool {
        self.clusters
            .get(cluster)
            .is_some_and(|latches| latches.is_done(kind, Scope::All))
    }

    /// Whether incarnation `incarnation` of `cluster` has its first list of `resource`
    /// delivered and applied by every registered consumer.
    pub fn resource_synced(&self, cluster: &str, incarnation: u64, resource: Resource) -> bool {
        self.current(cluster, incarnation)
            .is_some_and(|latches| latches.resource_done(resource))
    }

    /// A wait for `kind` over the clusters known now, counting every registered consumer.
    pub fn mesh_wait(&self, kind: SyncKind) -> MeshWait {
        self.mesh_wait_in(kind, Scope::All)
    }

    /// A wait for `kind` over the clusters known now, counting `scope`'s acknowledgements.
    pub fn mesh_wait_in(&self, kind: SyncKind, scope: Scope<'_>) -> MeshWait {
        let clusters = self
            .clusters
            .iter()
            .map(|(name, latches)| latches.wait(name, kind, scope))
            .collect();
        MeshWait {
            kind,
            clusters,
            breaker: self.breaker,
            warned: Arc::clone(&self.warned),
        }
    }

    /// A wait for `kind` on one cluster (every consumer); `None` when the cluster is unknown.
    pub fn cluster_wait(&self, cluster: &str, kind: SyncKind) -> Option<ClusterWait> {
        Some(self.clusters.get(cluster)?.wait(cluster, kind, Scope::All))
    }

    /// Whether the breaker's once-per-process warning has been logged.
    pub fn breaker_warned(&self) -> bool {
        self.warned.load(Ordering::Relaxed)
    }
}

/// A wait on one cluster's latches.
#[derive(Clone)]
pub struct ClusterWait {
    name: String,
    latches: Vec<watch::Receiver<bool>>,
    stopped: watch::Receiver<bool>,
}

impl ClusterWait {
    /// The cluster.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Resolves when every latch is done, or fails when the cluster stops first.
    pub async fn wait(mut self) -> Result<(), WaitError> {
        let name = self.name.clone();
        let mut stopped = self.stopped.clone();
        tokio::select! {
            biased;
            () = async {
                for latch in &mut self.latches {
                    // An error means the barrier dropped the latch: the cluster is gone.
                    if latch.wait_for(|done| *done).await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
            } => Ok(()),
            _ = stopped.wait_for(|stopped| *stopped) => Err(WaitError::Disconnected(name)),
        }
    }

    fn is_done(&self) -> bool {
        self.latches.iter().all(|l| *l.borrow()) || *self.stopped.borrow()
    }
}

/// A mesh-level wait over a snapshot of clusters; see the module docs.
pub struct MeshWait {
    kind: SyncKind,
    clusters: Vec<ClusterWait>,
    breaker: Duration,
    warned: Arc<AtomicBool>,
}

impl MeshWait {
    /// The clusters of the snapshot.
    pub fn clusters(&self) -> impl Iterator<Item = &str> {
        self.clusters.iter().map(ClusterWait::name)
    }

    /// Waits, bounded by the circuit breaker and by the caller's `deadline` (`None`: the
    /// caller never gives up).
    pub async fn wait(self, deadline: Option<Instant>) -> Result<WaitOutcome, WaitError> {
        let started = Instant::now();
        let kind = self.kind;
        // Kept to name the clusters still pending if the breaker fires.
        let probes = self.clusters.clone();
        let all = futures::future::join_all(self.clusters.into_iter().map(|cluster| async move {
            // A cluster that disconnects is ignored at mesh level.
            let _ = cluster.wait().await;
        }));
        let caller = async {
            match deadline {
                Some(deadline) => tokio::time::sleep_until(deadline).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = all => Ok(WaitOutcome::Synced),
            () = caller => Err(WaitError::CallerDeadline { kind, waited: started.elapsed() }),
            () = tokio::time::sleep(self.breaker) => {
                let pending: Vec<String> = probes
                    .iter()
                    .filter(|c| !c.is_done())
                    .map(|c| c.name.clone())
                    .collect();
                if self.warned.swap(true, Ordering::Relaxed) {
                    tracing::debug!(kind = %kind, ?pending, "sync circuit breaker fired again");
                } else {
                    tracing::warn!(kind = %kind, ?pending, timeout = ?self.breaker,
                        "remote clusters did not sync in time, expect possible disruption of cross-cluster connections");
                }
                Ok(WaitOutcome::BreakerFired { pending })
            }
        }
    }
}

#[cfg(test)]
#[path = "barrier_tests.rs"]
mod tests;
