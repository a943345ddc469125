//! The four stores of one remote, each mirroring into the cache: kvstoremesh's
//! [`StoreSet`], run by the agent's own remote-cluster loop.

use std::sync::Arc;
use std::time::Duration;

use meshwork_clustermesh::events::ClusterRef;
use meshwork_clustermesh::remote_cluster::prefixes::ClusterPrefixes;
use meshwork_clustermesh::remote_cluster::runner::MeshSettings;
use meshwork_clustermesh::remote_cluster::stores::{StoreStatuses, register_store};
use meshwork_clustermesh::remote_cluster::{DrainReason, StoreSet};
use meshwork_kvstore::{
    Decoder, EtcdBackend, KvstoreMetrics, WatchStore, WatchStoreManager, WatchStoreOptions,
};
use meshwork_types::{
    ClusterConfig, IdentityDecoder, IpCacheDecoder, IpCacheEntryDecoder, NodeDecoder, Resource,
    ServiceDecoder,
};
use tokio::sync::{Mutex, mpsc, oneshot};

use crate::keys::{self, CacheOp};
use crate::mirror::{CacheMirror, OpSender, Validated};
use crate::readiness::ReadinessEvent;

type Store<D> = Arc<Mutex<WatchStore<Validated<D>, CacheMirror>>>;

/// What every remote's stores send to.
#[derive(Clone)]
pub struct CacheSinks {
    /// The cache writer.
    pub ops: OpSender,
    /// Readiness (connections and removals).
    pub readiness: mpsc::UnboundedSender<ReadinessEvent>,
    /// How long a removed remote's entries stay after its config was deleted, so that the
    /// agents reading it disconnect first (`--cache-removal-grace`).
    pub removal_grace: Duration,
}

/// The stores of one remote for one cluster ID.
pub struct CacheStores {
    cluster: ClusterRef,
    cluster_id: u32,
    sinks: CacheSinks,
    nodes: Store<NodeDecoder>,
    services: Store<ServiceDecoder>,
    identities: Store<IdentityDecoder>,
    // The agent's own ipcache decoder (its one-pass shortcut, then Go's full reader), so
    // kvstoremesh accepts exactly what an agent would.
    ipcache: Store<IpCacheEntryDecoder>,
    statuses: Arc<StoreStatuses>,
}

impl StoreSet for CacheStores {
    type Sinks = CacheSinks;

    fn new(
        cluster: ClusterRef,
        cluster_id: u32,
        settings: &MeshSettings,
        metrics: &KvstoreMetrics,
        sinks: &CacheSinks,
    ) -> Self {
        let name = &*cluster.name;
        let id = (cluster_id != 0).then_some(cluster_id);
        let max = settings.max_connected_clusters;
        let nodes = mirror_store(
            NodeDecoder::new(name, id).with_max_connected_clusters(max),
            Resource::Nodes,
            &cluster.name,
            metrics,
            sinks,
        );
        let services = mirror_store(
            ServiceDecoder::new(name, id).with_max_connected_clusters(max),
            Resource::Services,
            &cluster.name,
            metrics,
            sinks,
        );
        let identities = mirror_store(
            IdentityDecoder::new(name, id).with_max_connected_clusters(max),
            Resource::Identities,
            &cluster.name,
            metrics,
            sinks,
        );
        let ipcache = mirror_store(
            IpCacheEntryDecoder(IpCacheDecoder::new(id).with_max_connected_clusters(max)),
            Resource::IpCache,
            &cluster.name,
            metrics,
            sinks,
        );
        let statuses = Arc::new(StoreStatuses::new(
            nodes.status(),
            services.status(),
            identities.status(),
            ipcache.status(),
        ));
        Self {
            cluster,
            cluster_id,
            sinks: sinks.clone(),
            nodes: Arc::new(Mutex::new(nodes)),
            services: Arc::new(Mutex::new(services)),
            identities: Arc::new(Mutex::new(identities)),
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

    async fn connected(&self, config: &ClusterConfig) {
        let cluster = Arc::clone(&self.cluster.name);
        let _ = self.sinks.ops.send(vec![CacheOp::Config {
            cluster: Arc::clone(&cluster),
            value: keys::cached_config(config),
        }]);
        let _ = self
            .sinks
            .readiness
            .send(ReadinessEvent::Connected(cluster));
    }

    fn register(
        &self,
        manager: &mut WatchStoreManager,
        backend: &EtcdBackend,
        prefixes: &ClusterPrefixes,
    ) {
        register_store(manager, backend, &prefixes.nodes, &self.nodes);
        register_store(manager, backend, &prefixes.services, &self.services);
        register_store(manager, backend, &prefixes.identities, &self.identities);
        register_store(manager, backend, &prefixes.ipcache, &self.ipcache);
    }

    /// A removed remote goes in Cilium's order: its cached config (agents disconnect), the
    /// grace, its canaries, its entries. An ID change drains nothing here: the new stores'
    /// first lists delete what the new ID no longer has.
    async fn drain(&self, reason: DrainReason) {
        if reason == DrainReason::IdChanged {
            return;
        }
        drain_removed(Arc::clone(&self.cluster.name), &self.sinks).await;
    }
}

/// Drains a removed remote in Cilium's order: its cached config (agents disconnect), the
/// grace, its canaries, its entries; then tells readiness.
pub async fn drain_removed(cluster: Arc<str>, sinks: &CacheSinks) {
    tracing::info!(%cluster, grace = ?sinks.removal_grace,
        "remote removed: deleting its cached config, then its canaries and entries after the grace");
    let step = |op: fn(Arc<str>, oneshot::Sender<()>) -> CacheOp| {
        let (done, landed) = oneshot::channel();
        let sent = sinks.ops.send(vec![op(Arc::clone(&cluster), done)]);
        async move { sent.is_ok() && landed.await.is_ok() }
    };
    if !step(|cluster, done| CacheOp::RemoveConfig { cluster, done }).await {
        return;
    }
    tokio::time::sleep(sinks.removal_grace).await;
    if step(|cluster, done| CacheOp::RemoveCluster { cluster, done }).await {
        tracing::info!(%cluster, "removed remote drained from the cache");
    }
    let _ = sinks
        .readiness
        .send(ReadinessEvent::Removed(Arc::clone(&cluster)));
}

/// A store of `cluster`'s `kind` that validates with `decoder` and mirrors into the cache.
fn mirror_store<D: Decoder>(
    decoder: D,
    kind: Resource,
    cluster: &Arc<str>,
    metrics: &KvstoreMetrics,
    sinks: &CacheSinks,
) -> WatchStore<Validated<D>, CacheMirror> {
    let mirror = CacheMirror::new(
        Arc::clone(cluster),
        kind,
        keys::cache_prefix(cluster, kind),
        sinks.ops.clone(),
    );
    let options = WatchStoreOptions {
        metrics: metrics.clone(),
        ..WatchStoreOptions::new(&**cluster)
    };
    WatchStore::new(Validated(decoder), mirror, options)
}
