//! The cache writer: the one task that writes the local etcd's `cilium/cache/…`, the cached
//! canaries and cluster configs, in the order the stores sent them.
//!
//! Keys go through the kvstore layer's lease [`Writer`], which adopts what a previous
//! kvstoremesh wrote: a restart that re-lists unchanged remotes writes nothing, and each
//! store's first list-done deletes what the cache holds under its prefix that the remote no
//! longer has (Cilium leaves those until their old lease expires). A canary is written only
//! once every write before it has landed: the list-dones of everything that arrived together
//! wait for one write of it all, and their canaries then go in one write (a list-done
//! writing on its own cost two round trips of the one writer each, and 250 remotes bring
//! 1,000). A failed write is retried every second; nothing after it is written meanwhile,
//! so the order holds.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meshwork_kvstore::follow::follow_prefix;
use meshwork_kvstore::keys::{
    CACHE_PREFIX, CLUSTER_CONFIG_PREFIX, HAS_CLUSTER_CONFIG_KEY, HEARTBEAT_KEY,
};
use meshwork_kvstore::lease_writer::{KeyChange, Writer};
use meshwork_kvstore::{EtcdBackend, KvstoreError};
use meshwork_types::{ClusterConfig, Resource};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::keys::{self, CacheOp};
use crate::metrics::CacheMetrics;
use crate::readiness::ReadinessEvent;

/// Changes gathered before they are written (a list page is 1,000 keys).
const MAX_PENDING: usize = 8192;
/// Delay between attempts of a failed write.
const RETRY_DELAY: Duration = Duration::from_secs(1);
/// How often the cached configs are read back even without a watch event (Cilium's 5 min).
const CONFIG_CHECK_INTERVAL: Duration = Duration::from_secs(5 * 60);
/// How often the local etcd's heartbeat is written unless told otherwise (Cilium: a minute).
const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(60);

/// The writer task's state.
pub struct CacheWriter {
    writer: Writer,
    /// Every key in the cache (adopted or written), ordered for prefix ranges.
    cached: BTreeSet<String>,
    /// Cached remotes no longer configured at adoption.
    orphans: BTreeSet<Arc<str>>,
    /// The cached config of each connected remote, put back when anyone else changes it.
    configs: HashMap<String, Vec<u8>>,
    pending: Vec<KeyChange>,
    /// Stores whose first list is in `pending`: their canaries follow once it landed.
    listed: Vec<(Arc<str>, Resource)>,
    readiness: mpsc::UnboundedSender<ReadinessEvent>,
    metrics: CacheMetrics,
    lease_ttl: Duration,
    heartbeat_interval: Duration,
}

impl CacheWriter {
    /// A writer that adopts the cache in `backend` (all of `cilium/cache/`, and the
    /// canaries and cached configs of `remotes` and of any other remote the cache holds),
    /// with leases of `lease_ttl`.
    pub async fn adopt(
        backend: EtcdBackend,
        remotes: &[Arc<str>],
        lease_ttl: Duration,
        readiness: mpsc::UnboundedSender<ReadinessEvent>,
        metrics: CacheMetrics,
    ) -> Result<Self, KvstoreError> {
        // An agent that connects before a remote's config is cached must wait for it, not
        // read the local cluster's own (empty) `cilium/state/` prefixes as that remote's.
        backend
            .create_if_absent(HAS_CLUSTER_CONFIG_KEY, "true")
            .await?;
        let (mut writer, entries) =
            Writer::adopt(backend, &[format!("{CACHE_PREFIX}/")], &[], lease_ttl).await?;
        // Remotes cached but no longer configured were removed while no kvstoremesh ran.
        let orphans: BTreeSet<Arc<str>> = entries
            .keys()
            .filter_map(|key| keys::cached_cluster(key))
            .filter(|cluster| !remotes.iter().any(|r| **r == **cluster))
            .map(Arc::from)
            .collect();
        let clusters: Vec<&Arc<str>> = remotes.iter().chain(&orphans).collect();
        let prefixes: Vec<String> = clusters
            .iter()
            .map(|r| keys::cache_canaries_prefix(r))
            .collect();
        let configs: Vec<String> = clusters.iter().map(|r| ClusterConfig::key(r)).collect();
        let rest = writer.take_over(&prefixes, &configs).await?;
        tracing::info!(
            keys = entries.len() + rest.len(),
            removed_meanwhile = ?orphans,
            "adopted the cache a previous kvstoremesh wrote"
        );
        let cached: BTreeSet<String> = entries.into_keys().chain(rest.into_keys()).collect();
        metrics.cached_keys.set(cached.len() as i64);
        Ok(Self {
            writer,
            cached,
            orphans,
            configs: HashMap::new(),
            pending: Vec::new(),
            listed: Vec::new(),
            readiness,
            metrics,
            lease_ttl,
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
        })
    }

    /// Writes the local etcd's heartbeat every `interval` (default: Cilium's minute). The
    /// agents reading the cache watch it as they watch a remote's, and no apiserver need
    /// run beside kvstoremesh.
    #[must_use]
    pub fn heartbeat_every(mut self, interval: Duration) -> Self {
        self.heartbeat_interval = interval;
        self
    }

    /// The connection the writer writes through.
    pub fn writer_backend(&self) -> &EtcdBackend {
        self.writer.backend()
    }

    /// Writes through `backend` (another connection to the same etcd) from now on.
    pub fn set_backend(&mut self, backend: EtcdBackend) {
        self.writer.set_backend(backend);
    }

    /// Remotes found in the cache that are not configured: removed while kvstoremesh was
    /// down, to be drained as a removal is.
    pub fn orphans(&self) -> impl Iterator<Item = &Arc<str>> {
        self.orphans.iter()
    }

    /// Writes what `ops` brings until every sender is gone or `stop` fires (then what has
    /// arrived is written first); refreshes the leases every third of their TTL.
    pub async fn run(
        mut self,
        mut ops: mpsc::UnboundedReceiver<Vec<CacheOp>>,
        stop: CancellationToken,
    ) {
        let mut keep_alive = tokio::time::interval(self.lease_ttl / 3);
        keep_alive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        keep_alive.tick().await;
        let mut heartbeat = tokio::time::interval(self.heartbeat_interval);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut config_check = tokio::time::interval(CONFIG_CHECK_INTERVAL);
        config_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        config_check.tick().await;
        let (touched_tx, mut touched) = mpsc::unbounded_channel();
        let following = tokio::spawn(follow_prefix(
            self.writer.backend().clone(),
            format!("{CLUSTER_CONFIG_PREFIX}/"),
            move |key| {
                let open = touched_tx.send(key).is_ok();
                async move { open }
            },
        ));
        loop {
            tokio::select! {
                Some(key) = touched.recv() => {
                    let key = String::from_utf8_lossy(&key).into_owned();
                    self.check_configs(Some(&key)).await;
                }
                _ = config_check.tick() => self.check_configs(None).await,
                _ = heartbeat.tick() => {
                    // Not a cached key: the cache's key count and its adoption leave it out.
                    self.pending.push((HEARTBEAT_KEY.to_owned(), Some(rfc3339(SystemTime::now()))));
                    self.flush().await;
                }
                () = stop.cancelled() => {
                    while let Ok(batch) = ops.try_recv() {
                        self.handle(batch).await;
                    }
                    break;
                }
                batch = ops.recv() => {
                    let Some(batch) = batch else { break };
                    self.handle(batch).await;
                    // What else has arrived goes in the same write.
                    while self.pending.len() < MAX_PENDING {
                        match ops.try_recv() {
                            Ok(batch) => self.handle(batch).await,
                            Err(_) => break,
                        }
                    }
                    self.flush().await;
                }
                _ = keep_alive.tick() => {
                    match self.writer.keep_alive().await {
                        Ok(0) => {}
                        Ok(n) => tracing::warn!(keys = n, "cache keys written again under new leases"),
                        Err(err) => tracing::warn!(%err, "refreshing the cache leases failed; retrying at the next tick"),
                    }
                }
            }
        }
        following.abort();
        self.flush().await;
    }

    /// Reads the cached configs back (only `key`'s, when given) and puts back at once any
    /// that someone else changed or deleted (cilium-semantics §8, §9).
    async fn check_configs(&mut self, key: Option<&str>) {
        let wanted: Vec<(String, Vec<u8>)> = self
            .configs
            .iter()
            .filter(|(k, _)| key.is_none_or(|key| key == *k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (key, value) in wanted {
            match self.writer.backend().get(&key).await {
                Ok(Some((stored, _))) if stored == value => {}
                Ok(_) => {
                    tracing::warn!(%key, "a cached cluster config is missing or changed; writing it again");
                    self.writer.forget(&key);
                    self.put(key, value);
                }
                Err(err) => {
                    tracing::warn!(%err, %key, "reading a cached cluster config back failed");
                }
            }
        }
        self.flush().await;
    }

    async fn handle(&mut self, batch: Vec<CacheOp>) {
        for op in batch {
            match op {
                CacheOp::Put { key, value } => self.put(key, value),
                CacheOp::Delete { key } => self.delete(key),
                CacheOp::Config { cluster, value } => {
                    let key = ClusterConfig::key(&cluster);
                    self.configs.insert(key.clone(), value.clone());
                    self.put(key, value);
                }
                CacheOp::ListDone {
                    cluster,
                    kind,
                    prefix,
                    listed,
                } => {
                    let vanished: Vec<String> = self
                        .under(&prefix)
                        .filter(|key| !listed.contains(*key))
                        .map(str::to_owned)
                        .collect();
                    if !vanished.is_empty() {
                        tracing::info!(%cluster, %prefix, keys = vanished.len(),
                            "deleting cached keys the remote no longer has");
                    }
                    for key in vanished {
                        self.delete(key);
                    }
                    // The canary says "all of the list is in the cache": the next flush
                    // writes it once everything before it landed.
                    self.listed.push((cluster, kind));
                }
                CacheOp::RemoveConfig { cluster, done } => {
                    // What came before, canaries included, lands first: in order.
                    self.flush().await;
                    let key = ClusterConfig::key(&cluster);
                    self.configs.remove(&key);
                    self.delete(key);
                    self.flush().await;
                    let _ = done.send(());
                }
                CacheOp::RemoveCluster { cluster, done } => {
                    self.flush().await;
                    self.delete_under(&keys::cache_canaries_prefix(&cluster));
                    self.flush().await;
                    for prefix in keys::cluster_prefixes(&cluster) {
                        self.delete_under(&prefix);
                    }
                    self.flush().await;
                    let _ = done.send(());
                }
            }
        }
    }

    fn put(&mut self, key: String, value: Vec<u8>) {
        self.cached.insert(key.clone());
        self.pending.push((key, Some(value)));
    }

    fn delete(&mut self, key: String) {
        self.cached.remove(&key);
        self.pending.push((key, None));
    }

    fn delete_under(&mut self, prefix: &str) {
        let keys: Vec<String> = self.under(prefix).map(str::to_owned).collect();
        for key in keys {
            self.delete(key);
        }
    }

    /// The cached keys under `prefix`.
    fn under<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.cached
            .range::<str, _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(move |key| key.starts_with(prefix))
            .map(String::as_str)
    }

    /// Writes what is pending, retrying until it lands; then the canaries of the stores whose
    /// first list was in it, and tells readiness.
    async fn flush(&mut self) {
        self.write_pending().await;
        if self.listed.is_empty() {
            return;
        }
        let listed = std::mem::take(&mut self.listed);
        let now = rfc3339(SystemTime::now());
        for (cluster, kind) in &listed {
            self.put(keys::canary_key(cluster, *kind), now.clone());
        }
        self.write_pending().await;
        for (cluster, kind) in listed {
            let _ = self.readiness.send(ReadinessEvent::Synced(cluster, kind));
        }
    }

    async fn write_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let started = tokio::time::Instant::now();
        loop {
            match self.writer.apply(&self.pending).await {
                Ok(sent) => {
                    self.metrics.writes.inc_by(sent as u64);
                    break;
                }
                Err(err) => {
                    self.metrics.write_failures.inc();
                    tracing::warn!(%err, changes = self.pending.len(),
                        "writing the cache failed; retrying");
                    tokio::time::sleep(RETRY_DELAY).await;
                }
            }
        }
        tracing::debug!(changes = self.pending.len(), took = ?started.elapsed(), "cache written");
        self.pending.clear();
        self.metrics.cached_keys.set(self.cached.len() as i64);
    }
}

fn rfc3339(now: SystemTime) -> Vec<u8> {
    humantime::format_rfc3339_seconds(now)
        .to_string()
        .into_bytes()
}
