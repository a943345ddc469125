//! What a remote cluster syncs, and what callers wait for.

use std::fmt;

/// One of the four kinds of state a remote cluster syncs, each with its own store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    /// `cilium/state/nodes/v1/<cluster>`.
    Nodes,
    /// `cilium/state/services/v1/<cluster>`.
    Services,
    /// `cilium/state/identities/v1/id`.
    Identities,
    /// `cilium/state/ip/v1/default` ("endpoints" in Cilium's status).
    IpCache,
}

impl Resource {
    /// Every resource, in status order.
    pub const ALL: [Self; 4] = [Self::Nodes, Self::Services, Self::Identities, Self::IpCache];

    /// The position of `self` in [`Resource::ALL`] (for per-resource arrays).
    pub fn index(self) -> usize {
        match self {
            Self::Nodes => 0,
            Self::Services => 1,
            Self::Identities => 2,
            Self::IpCache => 3,
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Nodes => "nodes",
            Self::Services => "services",
            Self::Identities => "identities",
            Self::IpCache => "endpoints",
        })
    }
}

/// A mesh-level wait (Cilium's `NodesSynced`, `ServicesSynced`, `IPIdentitiesSynced`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SyncKind {
    /// Every remote's nodes.
    Nodes,
    /// Every remote's services, programmed.
    Services,
    /// Every remote's ipcache, then identities, then nodes: what endpoint regeneration needs.
    IpIdentities,
}

impl SyncKind {
    /// The latches this wait needs, in the order Cilium checks them.
    pub fn resources(self) -> &'static [Resource] {
        match self {
            Self::Nodes => &[Resource::Nodes],
            Self::Services => &[Resource::Services],
            Self::IpIdentities => &[Resource::IpCache, Resource::Identities, Resource::Nodes],
        }
    }

    /// Cilium's name of the wait (`NodesSynced`, `ServicesSynced`, `IPIdentitiesSynced`).
    pub fn cilium_name(self) -> &'static str {
        match self {
            Self::Nodes => "NodesSynced",
            Self::Services => "ServicesSynced",
            Self::IpIdentities => "IPIdentitiesSynced",
        }
    }
}

impl fmt::Display for SyncKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Nodes => "nodes",
            Self::Services => "services",
            Self::IpIdentities => "ip-identities",
        })
    }
}
