//! The maps kept from remote services and nodes: the service (lb4) maps from global
//! services, the tunnel map from remote nodes' pod CIDRs. Desired content from remote events,
//! written at the end of each batch; the previous agent's entries are pruned only after
//! `ServicesSynced` (services, backends) and `NodesSynced` (tunnel).

use std::sync::Arc;

use meshwork_types::{Change, RemoteEvent, SyncKind};

use super::maps::{MapsError, PinDir};
use super::pinned_sync::{PinnedSync, SyncStats};
use super::services::{Lb4Backend, Lb4Key, Lb4ReverseNat, Lb4Service, ServiceTable};
use super::tunnel::{TunnelKey, TunnelTable, TunnelValue};

/// The map names, as pinned.
pub const SERVICES_MAP: &str = "cilium_lb4_services_v2";
/// See [`SERVICES_MAP`].
pub const BACKENDS_MAP: &str = "cilium_lb4_backends_v3";
/// See [`SERVICES_MAP`].
pub const REV_NAT_MAP: &str = "cilium_lb4_reverse_nat";
/// The socket-LB programs' record of each socket's frontend (they write it; LRU).
pub const REVERSE_SK_MAP: &str = "cilium_lb4_reverse_sk";
/// See [`SERVICES_MAP`].
pub const TUNNEL_MAP: &str = "cilium_tunnel_map";

/// The service and tunnel maps with their desired state.
pub struct RemoteMaps {
    table: ServiceTable,
    services: PinnedSync<Lb4Key, Lb4Service>,
    backends: PinnedSync<u32, Lb4Backend>,
    rev_nat: PinnedSync<u16, Lb4ReverseNat>,
    tunnel_table: TunnelTable,
    tunnel: PinnedSync<TunnelKey, TunnelValue>,
    services_synced: bool,
    nodes_synced: bool,
}

/// Counters for status.
#[derive(Debug, Default, Clone, Copy)]
pub struct RemoteMapStats {
    /// `cilium_lb4_services_v2`.
    pub services: SyncStats,
    /// `cilium_lb4_backends_v3`.
    pub backends: SyncStats,
    /// `cilium_lb4_reverse_nat`.
    pub rev_nat: SyncStats,
    /// `cilium_tunnel_map`.
    pub tunnel: SyncStats,
}

impl RemoteMaps {
    /// Opens the pinned maps (created when the ipcache was recreated); what they hold is the
    /// restored state.
    pub fn open(pins: &PinDir) -> Result<Self, MapsError> {
        let services = PinnedSync::open(&pins.map(SERVICES_MAP), SERVICES_MAP)?;
        let backends = PinnedSync::open(&pins.map(BACKENDS_MAP), BACKENDS_MAP)?;
        let rev_nat = PinnedSync::open(&pins.map(REV_NAT_MAP), REV_NAT_MAP)?;
        let tunnel = PinnedSync::open(&pins.map(TUNNEL_MAP), TUNNEL_MAP)?;
        let mut table = ServiceTable::default();
        table.seed_ids(backends.restored());
        table.seed_rev_nat(services.restored());
        Ok(Self {
            table,
            services,
            backends,
            rev_nat,
            tunnel_table: TunnelTable::default(),
            tunnel,
            services_synced: false,
            nodes_synced: false,
        })
    }

    /// Applies one cluster's batch: node and service events update the tables, then the
    /// maps they changed are written.
    pub fn apply(&mut self, cluster: &Arc<str>, events: &[RemoteEvent]) {
        let mut services_changed = false;
        let mut nodes_changed = false;
        for event in events {
            match event {
                RemoteEvent::Service { change } => {
                    match change {
                        Change::Upsert(s) => self.table.upsert(cluster, Arc::clone(s)),
                        Change::Delete(s) => self.table.delete(cluster, s),
                    }
                    services_changed = true;
                }
                RemoteEvent::Node { change } => {
                    match change {
                        Change::Upsert(n) => self.tunnel_table.upsert(cluster, Arc::clone(n)),
                        Change::Delete(n) => self.tunnel_table.delete(cluster, n),
                    }
                    nodes_changed = true;
                }
                RemoteEvent::IpCache { .. } | RemoteEvent::ListDone(_) => {}
            }
        }
        if services_changed {
            self.program_services();
        }
        if nodes_changed {
            self.program_tunnel();
        }
    }

    fn program_services(&mut self) {
        let desired = self.table.desired();
        let synced = self.services_synced;
        // Cilium's order (§10): backends, the slots naming them, the rev-NAT entries, then the
        // masters counting the slots; stale slots go after their master shrank (a removed
        // frontend's master before its slots), stale backends and rev-NAT entries last.
        let [slots, masters] = desired.slots_and_masters();
        self.backends.write(&desired.backends);
        self.services.write(&slots);
        self.rev_nat.write(&desired.rev_nat);
        self.services.write(&masters);
        self.services
            .delete_stale_in_order(&desired.services, synced, |k| u8::from(k.backend_slot != 0));
        self.backends.delete_stale(&desired.backends, synced);
        self.rev_nat.delete_stale(&desired.rev_nat, synced);
    }

    fn program_tunnel(&mut self) {
        let desired = self.tunnel_table.desired();
        self.tunnel.apply(&desired, self.nodes_synced);
    }

    /// The mesh-wide wait `kind` is over: the restored entries it guards may go now
    /// (`ServicesSynced`: services and backends; `NodesSynced`: tunnel entries).
    pub fn synced(&mut self, kind: SyncKind) {
        match kind {
            SyncKind::Services => {
                self.services_synced = true;
                self.program_services();
            }
            SyncKind::Nodes => {
                self.nodes_synced = true;
                self.program_tunnel();
            }
            SyncKind::IpIdentities => {}
        }
    }

    /// Counters.
    pub fn stats(&self) -> RemoteMapStats {
        RemoteMapStats {
            services: self.services.stats(),
            backends: self.backends.stats(),
            rev_nat: self.rev_nat.stats(),
            tunnel: self.tunnel.stats(),
        }
    }
}
