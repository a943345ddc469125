//! The stores of one remote cluster. Nodes, services and ipcache stores live as long as the
//! cluster keeps its ID (reconnects restart them, so stale keys get deletes); the identity
//! store is made fresh for every connection (see [`crate::identity_cache`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};

use futures::FutureExt;
use meshwork_kvstore::store_table::{ByValue, StoreTable};
use meshwork_kvstore::{
    Decoder, EtcdBackend, KvstoreMetrics, Observer, StoreStatus, WatchStore, WatchStoreManager,
    WatchStoreOptions,
};
use meshwork_types::{
    IdentityDecoder, IpCacheDecoder, IpCacheEntry, IpCacheEntryDecoder, NodeDecoder, ServiceDecoder,
};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::prefixes::{ClusterPrefixes, StorePrefix};
use super::runner::MeshSettings;
use super::{DrainReason, StoreSet};
use crate::events::{
    ClusterRef, Forwarder, IdentityEvent, IdentityEvents, IdentityForwarder, IpCacheRoute,
    NodeRoute, ServiceRoute, Sinks,
};
use crate::status::{EntryCounts, ListedFlags};

type Shared<T> = Arc<Mutex<T>>;
type IpCacheStore = WatchStore<IpCacheEntryDecoder, Forwarder<IpCacheRoute>, ByValue<IpCacheEntry>>;

/// Identity store generations, unique in the process: a cluster's next incarnation, or its
/// stores after an ID change, never reuse one of its earlier connections' numbers.
static GENERATIONS: AtomicU64 = AtomicU64::new(0);

/// The stores of one cluster for one cluster ID.
pub struct ClusterStores {
    cluster: ClusterRef,
    cluster_id: u32,
    max_connected_clusters: u32,
    metrics: KvstoreMetrics,
    sinks: Sinks,
    nodes: Shared<WatchStore<NodeDecoder, Forwarder<NodeRoute>>>,
    services: Shared<WatchStore<ServiceDecoder, Forwarder<ServiceRoute>>>,
    // Entries without their keys: the bulk of a mesh (see `ByValue`).
    ipcache: Shared<IpCacheStore>,
    statuses: Arc<StoreStatuses>,
}

/// The live status of a cluster's four stores, readable while they watch.
#[derive(Debug, Default)]
pub struct StoreStatuses {
    nodes: Arc<StoreStatus>,
    services: Arc<StoreStatus>,
    ipcache: Arc<StoreStatus>,
    /// Replaced by every connection's fresh identity store.
    identities: StdMutex<Arc<StoreStatus>>,
}

impl StoreStatuses {
    /// The statuses of four stores; `identities` may be replaced by [`Self::set_identities`].
    pub fn new(
        nodes: Arc<StoreStatus>,
        services: Arc<StoreStatus>,
        identities: Arc<StoreStatus>,
        ipcache: Arc<StoreStatus>,
    ) -> Self {
        Self {
            nodes,
            services,
            ipcache,
            identities: StdMutex::new(identities),
        }
    }

    /// A connection's fresh identity store replaces the last one.
    pub fn set_identities(&self, status: Arc<StoreStatus>) {
        *self
            .identities
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = status;
    }

    fn identities(&self) -> Arc<StoreStatus> {
        Arc::clone(
            &self
                .identities
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Whether each store has listed in the current connection.
    pub fn listed(&self) -> ListedFlags {
        ListedFlags {
            nodes: self.nodes.listed(),
            services: self.services.listed(),
            identities: self.identities().listed(),
            ipcache: self.ipcache.listed(),
        }
    }

    /// Entries held by each store.
    pub fn entries(&self) -> EntryCounts {
        EntryCounts {
            nodes: self.nodes.entries(),
            services: self.services.entries(),
            identities: self.identities().entries(),
            ipcache: self.ipcache.entries(),
        }
    }
}

impl StoreSet for ClusterStores {
    type Sinks = Sinks;

    fn new(
        cluster: ClusterRef,
        cluster_id: u32,
        settings: &MeshSettings,
        metrics: &KvstoreMetrics,
        sinks: &Sinks,
    ) -> Self {
        let max_connected_clusters = settings.max_connected_clusters;
        let sinks = sinks.clone();
        let name = &*cluster.name;
        let id = (cluster_id != 0).then_some(cluster_id);
        let options = || WatchStoreOptions {
            metrics: metrics.clone(),
            ..WatchStoreOptions::new(name)
        };
        let nodes = WatchStore::new(
            NodeDecoder::new(name, id).with_max_connected_clusters(max_connected_clusters),
            Forwarder::new(cluster.clone(), sinks.clone(), NodeRoute),
            options(),
        );
        let services = WatchStore::new(
            ServiceDecoder::new(name, id).with_max_connected_clusters(max_connected_clusters),
            Forwarder::new(cluster.clone(), sinks.clone(), ServiceRoute::default()),
            options(),
        );
        let ipcache = WatchStore::keyed_by_value(
            IpCacheEntryDecoder(
                IpCacheDecoder::new(id).with_max_connected_clusters(max_connected_clusters),
            ),
            Forwarder::new(cluster.clone(), sinks.clone(), IpCacheRoute),
            options(),
        );
        let statuses = Arc::new(StoreStatuses {
            nodes: nodes.status(),
            services: services.status(),
            ipcache: ipcache.status(),
            identities: StdMutex::default(),
        });
        Self {
            cluster,
            cluster_id,
            max_connected_clusters,
            metrics: metrics.clone(),
            sinks,
            nodes: Arc::new(Mutex::new(nodes)),
            services: Arc::new(Mutex::new(services)),
            ipcache: Arc::new(Mutex::new(ipcache)),
            statuses,
        }
    }

    fn cluster_id(&self) -> u32 {
        self.cluster_id
    }

    fn statuses(&self) -> Arc<StoreStatuses> {
        Arc::clone(&self.statuses)
    }

    fn register(
        &self,
        manager: &mut WatchStoreManager,
        backend: &EtcdBackend,
        prefixes: &ClusterPrefixes,
    ) {
        register_store(manager, backend, &prefixes.nodes, &self.nodes);
        register_store(manager, backend, &prefixes.services, &self.services);
        register_store(manager, backend, &prefixes.ipcache, &self.ipcache);
        self.register_identities(
            manager,
            backend,
            &prefixes.identities.canary,
            &prefixes.identities.watch,
        );
    }

    /// Emits a delete for everything the stores hold (the cluster is removed or its ID
    /// changed).
    async fn drain(&self, _reason: DrainReason) {
        self.nodes.lock().await.drain();
        self.services.lock().await.drain();
        self.ipcache.lock().await.drain();
        self.sinks.identities.do_send(IdentityEvents::one(
            self.cluster.clone(),
            IdentityEvent::RemoveCluster,
        ));
    }
}

impl ClusterStores {
    fn register_identities(
        &self,
        manager: &mut WatchStoreManager,
        backend: &EtcdBackend,
        canary: &str,
        watch: &str,
    ) {
        let generation = GENERATIONS.fetch_add(1, Ordering::Relaxed) + 1;
        let cluster = self.cluster.clone();
        let id = (self.cluster_id != 0).then_some(self.cluster_id);
        let decoder = IdentityDecoder::new(&*cluster.name, id)
            .with_max_connected_clusters(self.max_connected_clusters);
        let sinks = self.sinks.clone();
        let statuses = Arc::clone(&self.statuses);
        let options = WatchStoreOptions {
            metrics: self.metrics.clone(),
            ..WatchStoreOptions::new(&*cluster.name)
        };
        let backend = backend.clone();
        let watch = watch.to_owned();
        manager.register(canary, move |cancel: CancellationToken| {
            async move {
                let send = |event| {
                    sinks
                        .identities
                        .do_send(IdentityEvents::one(cluster.clone(), event));
                };
                send(IdentityEvent::Start { generation });
                let forwarder = IdentityForwarder::new(cluster.clone(), generation, sinks.clone());
                let mut store = WatchStore::new(decoder, forwarder, options);
                statuses.set_identities(store.status());
                store.watch(&backend, &watch, &cancel).await;
                send(IdentityEvent::Stop { generation });
            }
            .boxed()
        });
    }
}

/// Registers `store` with `manager`, to watch `prefix.watch` through `backend` once the
/// canary `prefix.canary` is there (or at once, as the manager decides).
pub fn register_store<D, O, T>(
    manager: &mut WatchStoreManager,
    backend: &EtcdBackend,
    prefix: &StorePrefix,
    store: &Shared<WatchStore<D, O, T>>,
) where
    D: Decoder,
    O: Observer<D::Value> + 'static,
    T: StoreTable<D::Value> + 'static,
{
    let store = Arc::clone(store);
    let backend = backend.clone();
    let watch = prefix.watch.clone();
    manager.register(prefix.canary.clone(), move |cancel: CancellationToken| {
        async move {
            // Held for the whole run: a drain can only happen after the watch stopped.
            let mut store = store.lock().await;
            store.watch(&backend, &watch, &cancel).await;
        }
        .boxed()
    });
}
