//! The four watch stores of one remote cluster behind its canary-gated manager — what an
//! agent runs per remote cluster.

use std::sync::Arc;

use futures::FutureExt;
use meshwork_kvstore::{
    Decoder, EtcdBackend, KvstoreMetrics, Observer, StoreStatus, WatchStore, WatchStoreManager,
    WatchStoreOptions, keys,
};
use meshwork_types::{IdentityDecoder, IpCacheDecoder, NodeDecoder, ServiceDecoder};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Drops every event: the scenarios only look at the stores' status.
pub struct Discard;

impl<V> Observer<V> for Discard {
    fn on_upsert(&mut self, _key: &str, _value: &Arc<V>) {}
    fn on_delete(&mut self, _key: &str, _value: &Arc<V>) {}
}

/// The running stores of one cluster.
pub struct ClusterStores {
    /// `(kind, status)` of each store: nodes, services, identities, ipcache.
    pub statuses: Vec<(&'static str, Arc<StoreStatus>)>,
    task: JoinHandle<()>,
}

impl ClusterStores {
    /// Starts the manager and its four stores for `cluster` with ID `id`.
    pub fn start(
        backend: &EtcdBackend,
        cluster: &str,
        id: u32,
        cancel: &CancellationToken,
    ) -> Self {
        let mut manager =
            WatchStoreManager::sync(backend.clone(), cluster, KvstoreMetrics::default());
        let nodes = format!("{}/{cluster}", keys::NODES_PREFIX);
        let services = format!("{}/{cluster}", keys::SERVICES_PREFIX);
        let identities = keys::IDENTITY_ID_PREFIX.to_owned();
        let ipcache = keys::IPCACHE_DEFAULT_PREFIX.to_owned();
        let statuses = vec![
            (
                "nodes",
                register(
                    &mut manager,
                    backend,
                    cluster,
                    keys::NODES_PREFIX,
                    nodes,
                    NodeDecoder::new(cluster, Some(id)),
                ),
            ),
            (
                "services",
                register(
                    &mut manager,
                    backend,
                    cluster,
                    keys::SERVICES_PREFIX,
                    services,
                    ServiceDecoder::new(cluster, Some(id)),
                ),
            ),
            (
                "identities",
                register(
                    &mut manager,
                    backend,
                    cluster,
                    keys::IDENTITIES_PREFIX,
                    identities,
                    IdentityDecoder::new(cluster, Some(id)),
                ),
            ),
            (
                "ipcache",
                register(
                    &mut manager,
                    backend,
                    cluster,
                    keys::IPCACHE_PREFIX,
                    ipcache,
                    IpCacheDecoder::new(Some(id)),
                ),
            ),
        ];
        let task = tokio::spawn(manager.run(cancel.clone()));
        Self { statuses, task }
    }

    /// Whether all four stores have listed their prefix.
    pub fn synced(&self) -> bool {
        self.statuses.iter().all(|(_, status)| status.listed())
    }

    /// Entries held by all four stores.
    pub fn entries(&self) -> u64 {
        self.statuses
            .iter()
            .map(|(_, status)| status.entries())
            .sum()
    }

    /// Entries dropped by validation in all four stores.
    pub fn decode_errors(&self) -> u64 {
        self.statuses
            .iter()
            .map(|(_, status)| status.decode_errors())
            .sum()
    }

    /// Waits for the manager (and so every store) to stop after cancellation.
    pub async fn stopped(self) {
        let _ = self.task.await;
    }
}

fn register<D: Decoder>(
    manager: &mut WatchStoreManager,
    backend: &EtcdBackend,
    cluster: &str,
    canary_prefix: &str,
    watch_prefix: String,
    decoder: D,
) -> Arc<StoreStatus> {
    let mut store = WatchStore::new(decoder, Discard, WatchStoreOptions::new(cluster));
    let status = store.status();
    let backend = backend.clone();
    manager.register(canary_prefix, move |cancel: CancellationToken| {
        async move { store.watch(&backend, &watch_prefix, &cancel).await }.boxed()
    });
    status
}
