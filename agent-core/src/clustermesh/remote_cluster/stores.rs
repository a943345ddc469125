//! The stores of one remote cluster. Nodes, services and ipcache stores live as long as the
//! cluster keeps its ID (reconnects restart them, so stale keys get deletes); the identity
//! store is made fresh for every connection (see [`crate::clustermesh::identity_cache`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};

use actix::Recipient;
use futures::FutureExt;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::prefixes::ClusterPrefixes;
use crate::clustermesh::barrier_actor::BarrierUpdate;
use crate::clustermesh::events::{
    IdentityEvent, IdentityEvents, IdentityForwarder, IpCacheForwarder, NodeForwarder,
    RemoteEvents, ServiceForwarder,
};
use crate::clustermesh::kinds::Resource;
use crate::clustermesh::status::{EntryCounts, SyncFlags};
use crate::kvstore::{
    EtcdBackend, KvstoreMetrics, StoreStatus, WatchStore, WatchStoreManager, WatchStoreOptions,
};
use crate::types::{
    IdentityDecoder, IpCacheDecoder, IpCacheEntryDecoder, NodeDecoder, ServiceDecoder,
};

type Shared<T> = Arc<Mutex<T>>;

/// Where a cluster's stores send what they see.
#[derive(Clone)]
pub struct Sinks {
    /// The sync barrier.
    pub barrier: Recipient<BarrierUpdate>,
    /// Nodes, services, ipcache.
    pub state: Recipient<RemoteEvents>,
    /// Identities.
    pub identities: Recipient<IdentityEvents>,
}

/// The stores of one cluster for one cluster ID.
pub struct ClusterStores {
    cluster: Arc<str>,
    cluster_id: u32,
    max_connected_clusters: u32,
    metrics: KvstoreMetrics,
    sinks: Sinks,
    nodes: Shared<WatchStore<NodeDecoder, NodeForwarder>>,
    services: Shared<WatchStore<ServiceDecoder, ServiceForwarder>>,
    ipcache: Shared<WatchStore<IpCacheEntryDecoder, IpCacheForwarder>>,
    statuses: [Arc<StoreStatus>; 3],
    identities: Arc<StdMutex<Arc<StoreStatus>>>,
    generation: AtomicU64,
}

impl ClusterStores {
    /// Stores for `cluster` with ID `cluster_id`; their first lists complete its latches.
    pub fn new(
        cluster: &str,
        cluster_id: u32,
        max_connected_clusters: u32,
        metrics: &KvstoreMetrics,
        sinks: Sinks,
    ) -> Self {
        let name: Arc<str> = cluster.into();
        let id = (cluster_id != 0).then_some(cluster_id);
        let options = || WatchStoreOptions {
            metrics: metrics.clone(),
            ..WatchStoreOptions::new(cluster)
        };
        let mut nodes = WatchStore::new(
            NodeDecoder::new(cluster, id).with_max_connected_clusters(max_connected_clusters),
            NodeForwarder::new(Arc::clone(&name), sinks.state.clone()),
            options(),
        );
        nodes.on_sync(synced(&sinks.barrier, cluster, Resource::Nodes));
        let last_seq = Arc::new(AtomicU64::new(0));
        let mut services = WatchStore::new(
            ServiceDecoder::new(cluster, id).with_max_connected_clusters(max_connected_clusters),
            ServiceForwarder::new(
                Arc::clone(&name),
                sinks.state.clone(),
                Arc::clone(&last_seq),
            ),
            options(),
        );
        let barrier = sinks.barrier.clone();
        let owner = cluster.to_owned();
        services.on_sync(move || {
            barrier.do_send(BarrierUpdate::ServicesListDone {
                cluster: owner,
                last_seq: last_seq.load(Ordering::Acquire),
            });
        });
        let mut ipcache = WatchStore::new(
            IpCacheEntryDecoder(
                IpCacheDecoder::new(id).with_max_connected_clusters(max_connected_clusters),
            ),
            IpCacheForwarder::new(Arc::clone(&name), sinks.state.clone()),
            options(),
        );
        ipcache.on_sync(synced(&sinks.barrier, cluster, Resource::IpCache));
        let statuses = [nodes.status(), services.status(), ipcache.status()];
        Self {
            cluster: name,
            cluster_id,
            max_connected_clusters,
            metrics: metrics.clone(),
            sinks,
            nodes: Arc::new(Mutex::new(nodes)),
            services: Arc::new(Mutex::new(services)),
            ipcache: Arc::new(Mutex::new(ipcache)),
            statuses,
            identities: Arc::new(StdMutex::new(Arc::new(StoreStatus::default()))),
            generation: AtomicU64::new(0),
        }
    }

    /// The cluster ID the stores validate against.
    pub fn cluster_id(&self) -> u32 {
        self.cluster_id
    }

    /// Registers the four stores with `manager`, to watch through `backend` at `prefixes`.
    pub fn register(
        &self,
        manager: &mut WatchStoreManager,
        backend: &EtcdBackend,
        prefixes: &ClusterPrefixes,
    ) {
        register_store(
            manager,
            backend,
            &prefixes.nodes.canary,
            &prefixes.nodes.watch,
            &self.nodes,
        );
        register_store(
            manager,
            backend,
            &prefixes.services.canary,
            &prefixes.services.watch,
            &self.services,
        );
        register_store(
            manager,
            backend,
            &prefixes.ipcache.canary,
            &prefixes.ipcache.watch,
            &self.ipcache,
        );
        self.register_identities(
            manager,
            backend,
            &prefixes.identities.canary,
            &prefixes.identities.watch,
        );
    }

    fn register_identities(
        &self,
        manager: &mut WatchStoreManager,
        backend: &EtcdBackend,
        canary: &str,
        watch: &str,
    ) {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let cluster = Arc::clone(&self.cluster);
        let id = (self.cluster_id != 0).then_some(self.cluster_id);
        let decoder = IdentityDecoder::new(&*cluster, id)
            .with_max_connected_clusters(self.max_connected_clusters);
        let sinks = self.sinks.clone();
        let status_slot = Arc::clone(&self.identities);
        let options = WatchStoreOptions {
            metrics: self.metrics.clone(),
            ..WatchStoreOptions::new(&*cluster)
        };
        let backend = backend.clone();
        let watch = watch.to_owned();
        manager.register(canary, move |cancel: CancellationToken| {
            async move {
                sinks.identities.do_send(IdentityEvents::one(
                    Arc::clone(&cluster),
                    IdentityEvent::Start { generation },
                ));
                let forwarder = IdentityForwarder::new(
                    Arc::clone(&cluster),
                    generation,
                    sinks.identities.clone(),
                );
                let mut store = WatchStore::new(decoder, forwarder, options);
                *status_slot
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = store.status();
                let (identities, barrier, name) = (
                    sinks.identities.clone(),
                    sinks.barrier.clone(),
                    Arc::clone(&cluster),
                );
                store.on_sync(move || {
                    identities.do_send(IdentityEvents::one(
                        Arc::clone(&name),
                        IdentityEvent::ListDone { generation },
                    ));
                    barrier.do_send(BarrierUpdate::Synced {
                        cluster: name.to_string(),
                        resource: Resource::Identities,
                    });
                });
                store.watch(&backend, &watch, &cancel).await;
                sinks.identities.do_send(IdentityEvents::one(
                    cluster,
                    IdentityEvent::Stop { generation },
                ));
            }
            .boxed()
        });
    }

    /// Emits a delete for everything the stores hold (the cluster is removed or its ID
    /// changed). Call only when no watch runs.
    pub async fn drain(&self) {
        self.nodes.lock().await.drain();
        self.services.lock().await.drain();
        self.ipcache.lock().await.drain();
        self.sinks.identities.do_send(IdentityEvents::one(
            Arc::clone(&self.cluster),
            IdentityEvent::RemoveCluster,
        ));
    }

    fn identity_status(&self) -> Arc<StoreStatus> {
        Arc::clone(
            &self
                .identities
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Whether each store has listed in the current connection.
    pub fn synced(&self) -> SyncFlags {
        let [nodes, services, ipcache] = &self.statuses;
        SyncFlags {
            nodes: nodes.synced(),
            services: services.synced(),
            identities: self.identity_status().synced(),
            endpoints: ipcache.synced(),
        }
    }

    /// Entries held by each store.
    pub fn entries(&self) -> EntryCounts {
        let [nodes, services, ipcache] = &self.statuses;
        EntryCounts {
            nodes: nodes.entries(),
            services: services.entries(),
            identities: self.identity_status().entries(),
            endpoints: ipcache.entries(),
        }
    }
}

fn synced(
    barrier: &Recipient<BarrierUpdate>,
    cluster: &str,
    resource: Resource,
) -> impl FnOnce() + Send + 'static {
    let barrier = barrier.clone();
    let cluster = cluster.to_owned();
    move || barrier.do_send(BarrierUpdate::Synced { cluster, resource })
}

fn register_store<D, O>(
    manager: &mut WatchStoreManager,
    backend: &EtcdBackend,
    canary: &str,
    watch: &str,
    store: &Shared<WatchStore<D, O>>,
) where
    D: crate::kvstore::Decoder,
    O: crate::kvstore::Observer<D::Value> + 'static,
{
    let store = Arc::clone(store);
    let backend = backend.clone();
    let watch = watch.to_owned();
    manager.register(canary, move |cancel: CancellationToken| {
        async move {
            // Held for the whole run: a drain can only happen after the watch stopped.
            let mut store = store.lock().await;
            store.watch(&backend, &watch, &cancel).await;
        }
        .boxed()
    });
}
