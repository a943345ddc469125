//! The maps kept from remote services and nodes: the service (lb4) maps from global
//! services, the tunnel map from remote nodes' pod CIDRs. Desired content from remote events,
//! written at the end of each batch; the previous agent's entries are pruned only after
//! `ServicesSynced` (services, backends) and `NodesSynced` (tunnel).

use std::sync::Arc;

use meshwork_types::{Change, RemoteEvent, SyncKind};

use super::maps::{MapsError, PinDir};
use super::pinned_sync::{PinnedSync, SyncStats};
use super::services::{Lb4Backend, Lb4Key, Lb4Service, ServiceTable};
use super::tunnel::{TunnelKey, TunnelTable, TunnelValue};

/// The map names, as pinned.
pub const SERVICES_MAP: &str = "cilium_lb4_services_v2";
/// See [`SERVICES_MAP`].
pub const BACKENDS_MAP: &str = "cilium_lb4_backends_v3";
/// See [`SERVICES_MAP`].
pub const TUNNEL_MAP: &str = "cilium_tunnel_map";

/// The service and tunnel maps with their desired state.
pub struct RemoteMaps {
    table: ServiceTable,
    services: PinnedSync<Lb4Key, Lb4Service>,
    backends: PinnedSync<u32, Lb4Backend>,
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
    /// `cilium_tunnel_map`.
    pub tunnel: SyncStats,
}

impl RemoteMaps {
    /// Opens the pinned maps (created when the ipcache was recreated); what they hold is the
    /// restored state.
    pub fn open(pins: &PinDir) -> Result<Self, MapsError> {
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
            tunnel: self.tunnel.stats(),
        }
    }
}
