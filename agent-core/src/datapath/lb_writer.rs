//! The service (lb4) and tunnel maps as the `DatapathWriter` keeps them: desired content from
//! remote events, written at the end of each batch; the previous agent's entries are pruned
//! only after `ServicesSynced` (services, backends) and `NodesSynced` (tunnel).

use actix::Recipient;

use super::maps::{MapsError, PinDir};
use super::pinned_sync::{PinnedSync, SyncStats};
use super::services::{Lb4Backend, Lb4Key, Lb4Service, ServiceTable};
use super::tunnel::{TunnelKey, TunnelTable, TunnelValue};
use crate::clustermesh::barrier_actor::BarrierUpdate;
use crate::clustermesh::events::{Change, RemoteEvent, RemoteEvents};

/// The map names, as pinned.
pub const SERVICES_MAP: &str = "cilium_lb4_services_v2";
/// See [`SERVICES_MAP`].
pub const BACKENDS_MAP: &str = "cilium_lb4_backends_v3";
/// See [`SERVICES_MAP`].
pub const TUNNEL_MAP: &str = "cilium_tunnel_map";

/// Services and tunnel maps with their desired state.
pub struct LbWriter {
    table: ServiceTable,
    services: PinnedSync<Lb4Key, Lb4Service>,
    backends: PinnedSync<u32, Lb4Backend>,
    tunnel_table: TunnelTable,
    tunnel: PinnedSync<TunnelKey, TunnelValue>,
    services_synced: bool,
    nodes_synced: bool,
    barrier: Recipient<BarrierUpdate>,
}

/// Counters for status.
#[derive(Debug, Default, Clone, Copy)]
pub struct LbStats {
    /// `cilium_lb4_services_v2`.
    pub services: SyncStats,
    /// `cilium_lb4_backends_v3`.
    pub backends: SyncStats,
    /// `cilium_tunnel_map`.
    pub tunnel: SyncStats,
}

impl LbWriter {
    /// Opens the pinned maps (created when the ipcache was recreated); what they hold is the
    /// restored state. Service events are acknowledged to `barrier` once programmed.
    pub fn open(pins: &PinDir, barrier: Recipient<BarrierUpdate>) -> Result<Self, MapsError> {
        let services = PinnedSync::open(&pins.map(SERVICES_MAP), SERVICES_MAP)?;
        let backends = PinnedSync::open(&pins.map(BACKENDS_MAP), BACKENDS_MAP)?;
        let tunnel = PinnedSync::open(&pins.map(TUNNEL_MAP), TUNNEL_MAP)?;
        let mut table = ServiceTable::default();
        table.seed_ids(backends.restored());
        Ok(Self {
            table,
            services,
            backends,
            tunnel_table: TunnelTable::default(),
            tunnel,
            services_synced: false,
            nodes_synced: false,
            barrier,
        })
    }

    /// Applies a batch: node and service events update the tables, then the maps are written
    /// and the cluster's last service event is acknowledged.
    pub fn apply(&mut self, batch: &RemoteEvents) {
        let cluster = &batch.cluster;
        let mut last_seq: Option<u64> = None;
        let mut nodes_changed = false;
        for event in &batch.events {
            match event {
                RemoteEvent::Service { seq, change } => {
                    match change {
                        Change::Upsert(s) => self.table.upsert(cluster, s.clone()),
                        Change::Delete(s) => self.table.delete(cluster, s),
                    }
                    last_seq = last_seq.max(Some(*seq));
                }
                RemoteEvent::Node { change } => {
                    match change {
                        Change::Upsert(n) => self.tunnel_table.upsert(cluster, n.clone()),
                        Change::Delete(n) => self.tunnel_table.delete(cluster, n),
                    }
                    nodes_changed = true;
                }
                RemoteEvent::IpCache { .. } => {}
            }
        }
        if let Some(seq) = last_seq {
            self.program_services();
            self.barrier.do_send(BarrierUpdate::ServicesProgrammed {
                cluster: cluster.to_string(),
                seq,
            });
        }
        if nodes_changed {
            self.program_tunnel();
        }
    }

    fn program_services(&mut self) {
        let desired = self.table.desired();
        // Backends before the slots naming them; stale slots before their backends go.
        self.backends.write(&desired.backends);
        self.services.apply(&desired.services, self.services_synced);
        self.backends
            .delete_stale(&desired.backends, self.services_synced);
    }

    fn program_tunnel(&mut self) {
        let desired = self.tunnel_table.desired();
        self.tunnel.apply(&desired, self.nodes_synced);
    }

    /// Every remote cluster's services are programmed: restored services may go now.
    pub fn services_synced(&mut self) {
        self.services_synced = true;
        self.program_services();
    }

    /// Every remote cluster's nodes are known: restored tunnel entries may go now.
    pub fn nodes_synced(&mut self) {
        self.nodes_synced = true;
        self.program_tunnel();
    }

    /// Counters.
    pub fn stats(&self) -> LbStats {
        LbStats {
            services: self.services.stats(),
            backends: self.backends.stats(),
            tunnel: self.tunnel.stats(),
        }
    }
}
