//! The maps kept from remote services and nodes: the service (lb4) maps from global
//! services (and the local cluster's services, when the agent has a local source), the
//! tunnel map from remote nodes' pod CIDRs. Desired content from remote events, written at
//! the end of each batch; the previous agent's entries are pruned only after `ServicesSynced`
//! (services, backends) and `NodesSynced` (tunnel).
//!
//! Services are pruned in Cilium's two passes (§10). Once the local state is known (the first
//! set of local services arrived), restored entries that only local state decides go: the
//! stale slots of a local service that is not shared, and restored backends of the local
//! cluster that nothing uses any more. Everything else restored — remote and global
//! frontends, remote backends, rev-NAT entries — waits for `ServicesSynced` and the local
//! state both.

use std::collections::HashSet;
use std::sync::Arc;

use meshwork_types::{Change, ClusterService, RemoteEvent, SyncKind};

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
    local: LocalState,
}

/// What the maps know of the local cluster's services.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LocalState {
    /// No local source: nothing local to wait for.
    None,
    /// A source exists; its first set has not arrived.
    Expected,
    /// The local services of cluster ID `.0` are known.
    Known(u16),
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
            local: LocalState::None,
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

    /// The agent has a source of local services ([`Self::apply_local`]): restored services
    /// wait for its first set, whatever the remote clusters do.
    pub fn expect_local_services(&mut self) {
        if self.local == LocalState::None {
            self.local = LocalState::Expected;
        }
    }

    /// The local cluster's services, whole (each set replaces the one before): the local
    /// cluster `cluster` with ID `cluster_id`. The first set makes the local state known and
    /// runs the first prune pass.
    pub fn apply_local(
        &mut self,
        cluster: &Arc<str>,
        cluster_id: u32,
        services: Vec<Arc<ClusterService>>,
    ) {
        self.table.replace_local(cluster, services);
        self.local = LocalState::Known(u16::try_from(cluster_id).unwrap_or(u16::MAX));
        self.program_services();
    }

    fn program_services(&mut self) {
        let desired = self.table.desired();
        // The second pass: everything, once the remote clusters and the local state are known.
        let all = self.services_synced && self.local != LocalState::Expected;
        // The first pass: what local state alone decides.
        let (standalone, local_id) = match self.local {
            LocalState::Known(id) => (self.table.standalone_frontends(), Some(id)),
            _ => (HashSet::new(), None),
        };
        // Cilium's order (§10): backends, the slots naming them, the rev-NAT entries, then the
        // masters counting the slots; stale slots go after their master shrank (a removed
        // frontend's master before its slots), stale backends and rev-NAT entries last.
        let [slots, masters] = desired.slots_and_masters();
        self.backends.write(&desired.backends);
        self.services.write(&slots);
        self.rev_nat.write(&desired.rev_nat);
        self.services.write(&masters);
        self.services.delete_stale_in_order(
            &desired.services,
            |k, _| all || standalone.contains(&(k.address, k.dport, k.proto)),
            |k| u8::from(k.backend_slot != 0),
        );
        // A backend another entry still names (a restored slot) stays with it.
        let named: HashSet<u32> = self
            .services
            .entries()
            .filter(|(k, _)| k.backend_slot != 0)
            .map(|(_, v)| v.backend_id)
            .collect();
        self.backends.delete_stale_in_order(
            &desired.backends,
            |id, backend| all || (local_id == Some(backend.cluster_id) && !named.contains(id)),
            |_| 0,
        );
        self.rev_nat.delete_stale(&desired.rev_nat, all);
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
