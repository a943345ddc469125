//! Everything the agent writes into the datapath, as one plain state machine: the ipcache
//! (remote entries by cluster, local endpoints' entries by endpoint) and the maps kept from
//! remote services and nodes. The agent's `DatapathWriter` actor is its shell; it applies a
//! batch, then flushes, then acknowledges the batch's list-dones.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use meshwork_types::{ClusterService, RemoteEvent, SyncKind};

use super::ipcache_writer::{FlushError, IpCacheWriter, Owner, WriterStats};
use super::maps::IpCacheMap;
use super::remote_maps::{RemoteMapStats, RemoteMaps};

/// What the writer has done, for status and metrics.
#[derive(Debug, Clone, Default)]
pub struct WriterReport {
    /// Entries the ipcache map holds.
    pub entries: usize,
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
    map: IpCacheMap,
    remote_maps: Option<RemoteMaps>,
    last_error: Option<String>,
}

impl MapWriter {
    /// A writer of `map` (freshly recreated at start) for the node whose IP is `local_node`.
    pub fn new(map: IpCacheMap, local_node: Option<IpAddr>) -> Self {
        Self {
            ipcache: IpCacheWriter::new(local_node),
            map,
            remote_maps: None,
            last_error: None,
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
        for event in events {
            if let RemoteEvent::IpCache { change, .. } = event
                && let Err(err) = self.ipcache.apply_remote(cluster, change)
            {
                tracing::warn!(cluster = %cluster, %err, "ipcache entry rejected");
            }
        }
        self.flush();
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

    fn flush(&mut self) {
        match self.ipcache.flush(&mut self.map) {
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

    /// What the writer has done.
    pub fn report(&self) -> WriterReport {
        let stats = self.ipcache.stats().clone();
        WriterReport {
            entries: self.ipcache.len(),
            rejected: stats.rejected.iter().map(|(k, v)| (*k, *v)).collect(),
            stats,
            last_error: self.last_error.clone(),
            remote_maps: self.remote_maps.as_ref().map(RemoteMaps::stats),
        }
    }
}
