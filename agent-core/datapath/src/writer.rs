//! Everything the agent writes into the datapath, as one plain state machine: the ipcache
//! (remote entries by cluster, local endpoints' entries by endpoint) and the maps kept from
//! remote services and nodes. The agent's `DatapathWriter` actor is its shell; it applies a
//! batch, then flushes, then acknowledges the batch's list-dones. A batch without a list-done
//! is written behind the next one's bookkeeping, on a flush thread ([`crate::flush_thread`]);
//! one with a list-done, and every local endpoint change, is in the map before the call
//! returns.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use meshwork_types::{ClusterService, RemoteEvent, SyncKind};

use super::flush_thread::{FlushThread, OnFlushed};
use super::ipcache_writer::{FlushError, IpCacheWriter, Owner, WriteOutcome, WriterStats};
use super::maps::IpCacheMap;
use super::remote_maps::{RemoteMapStats, RemoteMaps};

/// What the writer has done, for status and metrics.
#[derive(Debug, Clone, Default)]
pub struct WriterReport {
    /// Entries the ipcache map holds.
    pub entries: usize,
    /// Bytes of the writer's desired ipcache state ([`IpCacheWriter::table_bytes`]).
    pub desired_bytes: usize,
    /// Counters.
    pub stats: WriterStats,
    /// The last write error, if any.
    pub last_error: Option<String>,
    /// Rejections by reason, sorted.
    pub rejected: BTreeMap<&'static str, u64>,
    /// The service and tunnel maps, when programmed.
    pub remote_maps: Option<RemoteMapStats>,
}

/// The datapath's maps and their desired content.
pub struct MapWriter {
    ipcache: IpCacheWriter,
    /// The ipcache map; `None` while the flush thread writes it.
    map: Option<IpCacheMap>,
    /// Started with the first batch written behind.
    flush_thread: Option<FlushThread>,
    /// A flush thread failed to start: write in line.
    no_flush_thread: bool,
    on_flushed: Option<OnFlushed>,
    remote_maps: Option<RemoteMaps>,
    last_error: Option<String>,
}

impl MapWriter {
    /// A writer of `map` (freshly recreated at start) for the node whose IP is `local_node`.
    pub fn new(map: IpCacheMap, local_node: Option<IpAddr>) -> Self {
        Self {
            ipcache: IpCacheWriter::new(local_node),
            map: Some(map),
            flush_thread: None,
            no_flush_thread: false,
            on_flushed: None,
            remote_maps: None,
            last_error: None,
        }
    }

    /// Calls `notify` (on the flush thread) each time a batch written behind is done, so the
    /// caller can [`Self::collect_flushed`] its outcome without waiting for the next batch.
    pub fn on_flushed(&mut self, notify: impl Fn() + Send + Sync + 'static) {
        self.on_flushed = Some(Arc::new(notify));
    }

    /// Takes in the outcome of the batch written behind if it is done (never waits).
    pub fn collect_flushed(&mut self) {
        if self.map.is_some() {
            return;
        }
        if let Some((map, outcome)) = self.flush_thread.as_ref().and_then(FlushThread::try_wait) {
            self.map = Some(map);
            self.finished(outcome);
        }
    }

    /// Also programs global services and the tunnel map.
    pub fn with_remote_maps(mut self, maps: RemoteMaps) -> Self {
        self.remote_maps = Some(maps);
        self
    }

    /// Applies one remote cluster's batch and writes what changed.
    pub fn apply_remote(&mut self, cluster: &Arc<str>, events: &[RemoteEvent]) {
        if let Some(maps) = &mut self.remote_maps {
            maps.apply(cluster, events);
        }
        self.ipcache.reserve(events.len());
        let mut list_done = false;
        for event in events {
            match event {
                RemoteEvent::IpCache { change, .. } => {
                    if let Err(err) = self.ipcache.apply_remote(cluster, change) {
                        tracing::warn!(cluster = %cluster, %err, "ipcache entry rejected");
                    }
                }
                RemoteEvent::ListDone(_) => list_done = true,
                _ => {}
            }
        }
        // A list-done is acknowledged once its entries are in the map.
        if list_done {
            self.flush();
        } else {
            self.flush_behind();
        }
    }

    /// Sets the ipcache entries of local endpoint `id` (replacing its earlier ones).
    pub fn set_local(&mut self, id: u64, ips: &[IpAddr], identity: u32) {
        for ip in self.ipcache.set_local(id, ips, identity) {
            tracing::warn!(endpoint = id, %ip, "local ipcache entry rejected");
        }
        self.flush();
    }

    /// Removes a deleted endpoint's entries.
    pub fn remove_local(&mut self, id: u64) {
        self.ipcache.remove_owner(&Owner::Endpoint(id));
        self.flush();
    }

    /// The agent has a source of local services: restored services wait for its first set
    /// ([`RemoteMaps::expect_local_services`]).
    pub fn expect_local_services(&mut self) {
        if let Some(maps) = &mut self.remote_maps {
            maps.expect_local_services();
        }
    }

    /// The local cluster's services, whole ([`RemoteMaps::apply_local`]).
    pub fn apply_local_services(
        &mut self,
        cluster: &Arc<str>,
        cluster_id: u32,
        services: Vec<Arc<ClusterService>>,
    ) {
        if let Some(maps) = &mut self.remote_maps {
            maps.apply_local(cluster, cluster_id, services);
        }
    }

    /// The mesh-wide wait `kind` is over: restored state it guards may be pruned.
    pub fn synced(&mut self, kind: SyncKind) {
        if let Some(maps) = &mut self.remote_maps {
            maps.synced(kind);
        }
    }

    /// Writes what is pending before returning (after the batch in flight, if any).
    fn flush(&mut self) {
        self.wait();
        let Some(pending) = self.ipcache.take_pending() else {
            return;
        };
        let map = self.map.as_mut().expect("the map is back after a wait");
        let outcome = pending.write(map);
        self.finished(outcome);
    }

    /// Hands what is pending to the flush thread and returns (after the batch in flight, if
    /// any, so at most one is).
    fn flush_behind(&mut self) {
        self.wait();
        let Some(pending) = self.ipcache.take_pending() else {
            return;
        };
        if self.flush_thread.is_none() && !self.no_flush_thread {
            self.flush_thread = FlushThread::start(self.on_flushed.clone());
            self.no_flush_thread = self.flush_thread.is_none();
        }
        let map = self.map.take().expect("the map is back after a wait");
        let (mut map, pending) = match &self.flush_thread {
            Some(thread) => match thread.send(map, pending) {
                None => return,
                Some(job) => job,
            },
            None => (map, pending),
        };
        let outcome = pending.write(&mut map);
        self.map = Some(map);
        self.finished(outcome);
    }

    /// Waits for the batch in flight, if any, and takes in its outcome.
    fn wait(&mut self) {
        if self.map.is_some() {
            return;
        }
        let thread = self.flush_thread.as_ref().expect("a batch in flight");
        let (map, outcome) = thread.wait();
        self.map = Some(map);
        self.finished(outcome);
    }

    fn finished(&mut self, outcome: WriteOutcome) {
        match self.ipcache.finish(outcome) {
            Ok(()) => {}
            Err(err @ FlushError::MapFull { .. }) => {
                // Reported, not retried: a full map needs an operator, not a busy loop.
                tracing::error!(%err, "ipcache map full; entries dropped until space frees up");
                self.last_error = Some(err.to_string());
            }
            Err(err) => {
                tracing::error!(%err, "ipcache write failed");
                self.last_error = Some(err.to_string());
            }
        }
    }

    /// What the writer has done (a batch still in flight is not counted yet).
    pub fn report(&self) -> WriterReport {
        let stats = self.ipcache.stats().clone();
        WriterReport {
            entries: self.ipcache.len(),
            desired_bytes: self.ipcache.table_bytes(),
            rejected: stats.rejected.iter().map(|(k, v)| (*k, *v)).collect(),
            stats,
            last_error: self.last_error.clone(),
            remote_maps: self.remote_maps.as_ref().map(RemoteMaps::stats),
        }
    }
}

impl Drop for MapWriter {
    fn drop(&mut self) {
        // What was accepted is written before the writer is gone.
        self.wait();
    }
}
