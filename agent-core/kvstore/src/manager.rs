//! The watch store manager: starts per-prefix work once the prefix is known to be complete.
//!
//! With the `syncedCanaries` capability a remote cluster writes `cilium/synced/<cluster>/
//! <prefix>` once everything under `<prefix>` is written; the [`WatchStoreManager::sync`]
//! variant watches those canaries and starts the function registered for a prefix when its
//! canary appears. Without the capability, [`WatchStoreManager::immediate`] starts every
//! registered function at once. Functions for prefixes whose canary never appears never start.

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::keys::synced_prefix;
use super::watch_store::{Observer, WatchStore, WatchStoreOptions};
use super::{EtcdBackend, KvstoreMetrics, ListPage, RawDecoder};

/// Work started for a prefix; it should run until the token is cancelled.
pub type PrefixFn = Box<dyn FnOnce(CancellationToken) -> BoxFuture<'static, ()> + Send>;

enum Mode {
    Sync {
        backend: Box<EtcdBackend>,
        /// The canaries, when the caller read them already.
        listed: Option<ListPage>,
    },
    Immediate,
}

/// Starts registered per-prefix functions, gated by sync canaries or at once.
pub struct WatchStoreManager {
    mode: Mode,
    cluster: String,
    metrics: KvstoreMetrics,
    functions: HashMap<String, PrefixFn>,
}

impl WatchStoreManager {
    /// Starts each function when the canary of its prefix appears in `backend`.
    pub fn sync(backend: EtcdBackend, cluster: impl Into<String>, metrics: KvstoreMetrics) -> Self {
        Self::new(
            Mode::Sync {
                backend: Box::new(backend),
                listed: None,
            },
            cluster.into(),
            metrics,
        )
    }

    /// The canaries are `page` (every key under `cilium/synced/<cluster>/`, read with
    /// [`EtcdBackend::get_all_and_list`] along with the cluster config): the first list of
    /// the canary store costs no request of its own. No effect on an immediate manager.
    #[must_use]
    pub fn with_listed_canaries(mut self, page: ListPage) -> Self {
        if let Mode::Sync { listed, .. } = &mut self.mode {
            *listed = Some(page);
        }
        self
    }

    /// Starts every function as soon as [`WatchStoreManager::run`] is called.
    pub fn immediate(cluster: impl Into<String>) -> Self {
        Self::new(Mode::Immediate, cluster.into(), KvstoreMetrics::default())
    }

    fn new(mode: Mode, cluster: String, metrics: KvstoreMetrics) -> Self {
        Self {
            mode,
            cluster,
            metrics,
            functions: HashMap::new(),
        }
    }

    /// Registers `function` for `prefix` (e.g. `cilium/state/nodes/v1`). A later
    /// registration for the same prefix replaces the earlier one.
    pub fn register<F>(&mut self, prefix: impl Into<String>, function: F)
    where
        F: FnOnce(CancellationToken) -> BoxFuture<'static, ()> + Send + 'static,
    {
        self.functions.insert(prefix.into(), Box::new(function));
    }

    /// Runs until `cancel` fires and every started function has returned. Consuming `self`
    /// makes registering after the start impossible.
    pub async fn run(self, cancel: CancellationToken) {
        let mut started = JoinSet::new();
        let Self {
            mode,
            cluster,
            metrics,
            mut functions,
        } = self;
        tracing::info!(cluster, mode = mode.name(), "starting watch store manager");
        match mode {
            Mode::Immediate => {
                for (prefix, function) in functions.drain() {
                    start(&mut started, &cluster, &prefix, function, &cancel);
                }
                cancel.cancelled().await;
            }
            Mode::Sync { backend, listed } => {
                let (ready_tx, mut ready_rx) = mpsc::unbounded_channel();
                let mut canaries = WatchStore::new(
                    RawDecoder,
                    CanaryObserver { ready: ready_tx },
                    WatchStoreOptions {
                        metrics,
                        ..WatchStoreOptions::new(cluster.clone())
                    },
                );
                if let Some(page) = listed {
                    canaries.list_ahead(page);
                }
                let prefix = synced_prefix(&cluster);
                let watch = canaries.watch(&backend, &prefix, &cancel);
                tokio::pin!(watch);
                loop {
                    tokio::select! {
                        () = &mut watch => break,
                        Some(prefix) = ready_rx.recv() => match functions.remove(&prefix) {
                            Some(function) => start(&mut started, &cluster, &prefix, function, &cancel),
                            None => tracing::debug!(cluster, prefix, "canary for an unregistered or started prefix"),
                        },
                    }
                }
            }
        }
        while started.join_next().await.is_some() {}
        tracing::info!(cluster, "stopped watch store manager");
    }
}

impl Mode {
    fn name(&self) -> &'static str {
        match self {
            Self::Sync { .. } => "sync",
            Self::Immediate => "immediate",
        }
    }
}

fn start(
    started: &mut JoinSet<()>,
    cluster: &str,
    prefix: &str,
    function: PrefixFn,
    cancel: &CancellationToken,
) {
    tracing::debug!(cluster, prefix, "starting function for kvstore prefix");
    started.spawn(function(cancel.child_token()));
}

struct CanaryObserver {
    ready: mpsc::UnboundedSender<String>,
}

impl Observer<Vec<u8>> for CanaryObserver {
    fn on_upsert(&mut self, key: &str, _value: &Arc<Vec<u8>>) {
        let _ = self.ready.send(key.to_owned());
    }

    fn on_delete(&mut self, _key: &str, _value: &Arc<Vec<u8>>) {}
}
