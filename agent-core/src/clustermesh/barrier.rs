//! The sync barrier: per-cluster latches and the mesh-level waits (contract §4).
//!
//! Each remote cluster gets its latches once, when its config file appears; reconnects never
//! reset them. `nodes`, `ipcache` and `identities` complete when the store's first list is
//! done; `services` completes when the list is done AND the consumer has acknowledged
//! programming every service event emitted before it; `stopped` fires when the cluster is
//! removed or the agent stops.
//!
//! A mesh-level wait snapshots the clusters known at call time and waits for each; a cluster
//! that stops first is ignored (no deadlock when it goes away before syncing); zero clusters
//! return at once. The circuit breaker bounds every wait: when it fires, the wait logs once
//! per process "expect possible disruption of cross-cluster connections" and succeeds. The
//! wait fails only when its caller gives up first.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::kinds::{Resource, SyncKind};

/// Cilium's default `--clustermesh-sync-timeout`.
pub const DEFAULT_SYNC_TIMEOUT: Duration = Duration::from_secs(60);

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

struct Latches {
    nodes: watch::Sender<bool>,
    services: watch::Sender<bool>,
    identities: watch::Sender<bool>,
    ipcache: watch::Sender<bool>,
    stopped: watch::Sender<bool>,
    services_list_done: Option<u64>,
    services_acked: u64,
}

impl Latches {
    fn new() -> Self {
        Self {
            nodes: watch::Sender::new(false),
            services: watch::Sender::new(false),
            identities: watch::Sender::new(false),
            ipcache: watch::Sender::new(false),
            stopped: watch::Sender::new(false),
            services_list_done: None,
            services_acked: 0,
        }
    }

    fn latch(&self, resource: Resource) -> &watch::Sender<bool> {
        match resource {
            Resource::Nodes => &self.nodes,
            Resource::Services => &self.services,
            Resource::Identities => &self.identities,
            Resource::IpCache => &self.ipcache,
        }
    }

    fn wait(&self, name: &str, kind: SyncKind) -> ClusterWait {
        ClusterWait {
            name: name.to_owned(),
            latches: kind
                .resources()
                .iter()
                .map(|&r| self.latch(r).subscribe())
                .collect(),
            stopped: self.stopped.subscribe(),
        }
    }

    fn settle_services(&self) {
        if self
            .services_list_done
            .is_some_and(|marker| self.services_acked >= marker)
        {
            self.services.send_replace(true);
        }
    }
}

/// The barrier's state: latches per remote cluster. A plain state machine; the actor in
/// [`super::barrier_actor`] is its shell.
pub struct SyncBarrier {
    clusters: HashMap<String, Latches>,
    breaker: Duration,
    warned: Arc<AtomicBool>,
}

impl SyncBarrier {
    /// A barrier whose mesh-level waits are bounded by `breaker`
    /// (`--clustermesh-sync-timeout`).
    pub fn new(breaker: Duration) -> Self {
        Self {
            clusters: HashMap::new(),
            breaker,
            warned: Arc::new(AtomicBool::new(false)),
        }
    }

    /// A cluster's config file appeared: create its latches (kept if it already has them).
    pub fn add_cluster(&mut self, cluster: &str) {
        self.clusters
            .entry(cluster.to_owned())
            .or_insert_with(Latches::new);
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

    /// The first list of `resource` completed for `cluster` (later ones change nothing).
    /// Services use [`SyncBarrier::services_list_done`] instead.
    pub fn synced(&mut self, cluster: &str, resource: Resource) {
        if resource == Resource::Services {
            return;
        }
        if let Some(latches) = self.clusters.get(cluster) {
            latches.latch(resource).send_replace(true);
        }
    }

    /// The services store finished its first list after emitting events up to `last_seq`.
    pub fn services_list_done(&mut self, cluster: &str, last_seq: u64) {
        if let Some(latches) = self.clusters.get_mut(cluster)
            && latches.services_list_done.is_none()
        {
            latches.services_list_done = Some(last_seq);
            latches.settle_services();
        }
    }

    /// The consumer programmed every service event of `cluster` up to `seq`.
    pub fn services_programmed(&mut self, cluster: &str, seq: u64) {
        if let Some(latches) = self.clusters.get_mut(cluster) {
            latches.services_acked = latches.services_acked.max(seq);
            latches.settle_services();
        }
    }

    /// Whether `cluster`'s latch for `resource` is done.
    pub fn is_synced(&self, cluster: &str, resource: Resource) -> bool {
        self.clusters
            .get(cluster)
            .is_some_and(|l| *l.latch(resource).borrow())
    }

    /// A wait for `kind` over the clusters known now.
    pub fn mesh_wait(&self, kind: SyncKind) -> MeshWait {
        let clusters = self
            .clusters
            .iter()
            .map(|(name, latches)| latches.wait(name, kind))
            .collect();
        MeshWait {
            kind,
            clusters,
            breaker: self.breaker,
            warned: Arc::clone(&self.warned),
        }
    }

    /// A wait for `kind` on one cluster; `None` when the cluster is unknown.
    pub fn cluster_wait(&self, cluster: &str, kind: SyncKind) -> Option<ClusterWait> {
        Some(self.clusters.get(cluster)?.wait(cluster, kind))
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

impl SyncBarrier {
    /// Whether the breaker's once-per-process warning has been logged.
    pub fn breaker_warned(&self) -> bool {
        self.warned.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
#[path = "barrier_tests.rs"]
mod tests;
