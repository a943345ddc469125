//! etcd clients shared by every remote whose config names the same etcd (the same endpoints
//! and TLS files). Behind kvstoremesh every remote is read from the local etcd: one
//! connection carries them all, where Cilium's agent opens one per remote, and their first
//! reads, which start together, go together too (`EtcdBackend::with_batched_reads`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{EtcdBackend, EtcdConfig, KvstoreError};

/// What a remote cluster's stores watch, each root served by one etcd watch: a remote asks
/// for seven watches (four stores, its canaries, its config, the heartbeat), 1,750 for 250
/// remotes behind kvstoremesh. Narrower than `cilium/`, so that what else the etcd holds (a
/// remote's own kvstoremesh cache, the local cluster's state next to the cache) is not
/// streamed for nothing. The heartbeat is a single key: the only watch of it Cilium's roles
/// allow.
pub const SHARED_WATCH_ROOTS: [&str; 5] = [
    "cilium/state/",
    "cilium/cache/",
    "cilium/synced/",
    "cilium/cluster-config/",
    meshwork_types::keys::HEARTBEAT_KEY,
];

/// A connected client and the number that tells it from the one it replaced.
type Slot = Arc<tokio::sync::Mutex<Option<(u64, EtcdBackend)>>>;

/// The clients, one per config; cheap to clone (clones share them).
#[derive(Clone, Default)]
pub struct SharedBackends {
    slots: Arc<Mutex<HashMap<EtcdConfig, Slot>>>,
    connections: Arc<AtomicU64>,
}

impl std::fmt::Debug for SharedBackends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let configs = self.slots.lock().map_or(0, |slots| slots.len());
        f.debug_struct("SharedBackends")
            .field("configs", &configs)
            .finish()
    }
}

/// A client from [`SharedBackends::connect`], with the generation to [`SharedBackends::evict`].
#[derive(Clone, Debug)]
pub struct Shared {
    /// The client.
    pub backend: EtcdBackend,
    /// Which connection of its config it is.
    pub generation: u64,
}

impl SharedBackends {
    /// The client for `config`: the one already connected, or a new connection (checked as
    /// [`EtcdBackend::connect`] checks it). Callers asking at once for the same config wait
    /// for one connection instead of opening one each.
    pub async fn connect(
        &self,
        config: &EtcdConfig,
        timeout: Duration,
    ) -> Result<Shared, KvstoreError> {
        let slot = {
            let mut slots = self
                .slots
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            Arc::clone(slots.entry(config.clone()).or_default())
        };
        let mut slot = slot.lock().await;
        if let Some((generation, backend)) = slot.as_ref() {
            return Ok(Shared {
                backend: backend.clone(),
                generation: *generation,
            });
        }
        let backend = EtcdBackend::connect(config, timeout)
            .await?
            .with_shared_watches(&SHARED_WATCH_ROOTS)
            .with_batched_reads();
        let generation = self.connections.fetch_add(1, Ordering::Relaxed);
        *slot = Some((generation, backend.clone()));
        Ok(Shared {
            backend,
            generation,
        })
    }

    /// Drops the client of `config` if it is still connection `generation`, after a failure
    /// on it: the next [`Self::connect`] opens a new connection (re-reading the TLS files);
    /// callers still holding the old one keep it until they fail too.
    pub async fn evict(&self, config: &EtcdConfig, generation: u64) {
        let slot = {
            let slots = self
                .slots
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            slots.get(config).cloned()
        };
        if let Some(slot) = slot {
            let mut slot = slot.lock().await;
            if slot
                .as_ref()
                .is_some_and(|(current, _)| *current == generation)
            {
                *slot = None;
            }
        }
    }
}
