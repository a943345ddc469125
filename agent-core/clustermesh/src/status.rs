//! The status of a remote cluster, as `meshctl status` and the metrics show it.

use std::time::SystemTime;

use meshwork_types::Resource;

/// A snapshot of one remote cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterStatus {
    /// The cluster name (its config file's name).
    pub name: String,
    /// The etcd endpoints (client URLs), comma separated.
    pub etcd_endpoints: String,
    /// The etcd connection is up.
    pub connected: bool,
    /// The cluster ID from its config (0 until retrieved).
    pub cluster_id: u32,
    /// The remote announces a cluster config (`cilium/.has-cluster-config`).
    pub config_required: bool,
    /// The cluster config has been retrieved and validated.
    pub config_retrieved: bool,
    /// Connection failures so far.
    pub failures: u64,
    /// When the last failure happened.
    pub last_failure: Option<SystemTime>,
    /// The error that keeps the cluster from being ready now, if any.
    pub last_error: Option<String>,
    /// When the remote last wrote its heartbeat, as far as the agent has seen.
    pub last_heartbeat: Option<SystemTime>,
    /// Read from a kvstoremesh cache.
    pub cached: bool,
    /// Whether each store has listed its prefix in the current connection (Cilium's
    /// "synced" column).
    pub listed: ListedFlags,
    /// Entries each store holds.
    pub entries: EntryCounts,
}

impl ClusterStatus {
    /// Connected, configured, and every store listed.
    pub fn ready(&self) -> bool {
        self.connected && self.config_ok() && self.listed.all() && self.last_error.is_none()
    }

    fn config_ok(&self) -> bool {
        self.config_retrieved || !self.config_required
    }
}

/// Per-store flags: listed in the current connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListedFlags {
    /// Nodes listed.
    pub nodes: bool,
    /// Services listed.
    pub services: bool,
    /// Identities listed.
    pub identities: bool,
    /// ipcache entries listed.
    pub ipcache: bool,
}

impl ListedFlags {
    /// All four.
    pub fn all(&self) -> bool {
        self.nodes && self.services && self.identities && self.ipcache
    }

    /// The flag of `resource`.
    pub fn get(&self, resource: Resource) -> bool {
        match resource {
            Resource::Nodes => self.nodes,
            Resource::Services => self.services,
            Resource::Identities => self.identities,
            Resource::IpCache => self.ipcache,
        }
    }
}

/// Per-store entry counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EntryCounts {
    /// Nodes.
    pub nodes: u64,
    /// Services.
    pub services: u64,
    /// Identities.
    pub identities: u64,
    /// ipcache entries.
    pub ipcache: u64,
}
