//! The timeline as meshctl reads it: the agent's `TimelineResponse` turned into typed steps
//! with their offsets, and how each reads in the table (step, cluster, kind, detail).

use std::time::Duration;

use meshwork_proto::agent::v1 as pb;

/// A remote store, in the order rows and tables show them.
pub const RESOURCES: [pb::TimelineResource; 4] = [
    pb::TimelineResource::Nodes,
    pb::TimelineResource::Services,
    pb::TimelineResource::Identities,
    pb::TimelineResource::Ipcache,
];

/// The steps of the agent's current start.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    /// When the agent started (RFC 3339).
    pub started_at: String,
    /// In time order.
    pub steps: Vec<Step>,
    /// Steps the agent left out (its timeline was full).
    pub dropped: u64,
}

/// One step and its offset from the start.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Since the start.
    pub offset: Duration,
    /// What happened.
    pub what: What,
}

/// What happened at a step.
#[derive(Debug, Clone, PartialEq)]
pub enum What {
    /// The agent started.
    Started,
    /// A remote connected (its cluster config read and valid).
    Connected {
        /// The remote.
        cluster: String,
    },
    /// A remote's first list of a store synced.
    ListDone {
        /// The remote.
        cluster: String,
        /// Which store.
        resource: pb::TimelineResource,
    },
    /// A wait on the barrier returned.
    WaitReturned {
        /// Who waited.
        waiter: pb::Waiter,
        /// What for.
        kind: pb::TimelineSyncKind,
        /// How it ended.
        end: pb::WaitEnd,
        /// The clusters pending when the breaker fired.
        pending: Vec<String>,
        /// Why it failed.
        error: Option<String>,
    },
    /// An endpoint regenerated.
    Regenerated {
        /// The endpoint.
        endpoint: u64,
        /// Why it failed; `None` when it succeeded.
        error: Option<String>,
    },
    /// WireGuard's garbage collection ran.
    WireguardGc {
        /// The wait it followed.
        kind: pb::TimelineSyncKind,
        /// Restored peers removed.
        removed: u64,
    },
    /// The datapath pruned restored map entries.
    Pruned {
        /// The wait it followed.
        kind: pb::TimelineSyncKind,
        /// Entries deleted.
        removed: u64,
    },
    /// A step type this meshctl does not know (a newer agent's).
    Unknown(i32),
}

impl Timeline {
    /// The agent's answer, typed.
    pub fn from_proto(response: &pb::TimelineResponse) -> Self {
        Self {
            started_at: response.started_at.clone(),
            steps: response.steps.iter().map(Step::from_proto).collect(),
            dropped: response.dropped,
        }
    }
}

impl Step {
    fn from_proto(step: &pb::TimelineStep) -> Self {
        let what = match step.r#type() {
            pb::StepType::Started => What::Started,
            pb::StepType::Connected => What::Connected {
                cluster: step.cluster.clone(),
            },
            pb::StepType::ListDone => What::ListDone {
                cluster: step.cluster.clone(),
                resource: step.resource(),
            },
            pb::StepType::WaitReturned => What::WaitReturned {
                waiter: step.waiter(),
                kind: step.sync_kind(),
                end: step.wait_end(),
                pending: step.pending.clone(),
                error: step.error.clone(),
            },
            pb::StepType::EndpointRegenerated => What::Regenerated {
                endpoint: step.endpoint_id,
                error: step.error.clone(),
            },
            pb::StepType::WireguardGc => What::WireguardGc {
                kind: step.sync_kind(),
                removed: step.removed,
            },
            pb::StepType::Pruned => What::Pruned {
                kind: step.sync_kind(),
                removed: step.removed,
            },
            pb::StepType::Unspecified => What::Unknown(step.r#type),
        };
        Self {
            offset: Duration::from_micros(step.offset_us),
            what,
        }
    }

    /// The step's name in the table and the JSON.
    pub fn name(&self) -> &'static str {
        match self.what {
            What::Started => "start",
            What::Connected { .. } => "connected",
            What::ListDone { .. } => "first-list",
            What::WaitReturned { .. } => "wait-returned",
            What::Regenerated { .. } => "regenerated",
            What::WireguardGc { .. } => "wireguard-gc",
            What::Pruned { .. } => "prune",
            What::Unknown(_) => "unknown",
        }
    }

    /// The remote the step is about.
    pub fn cluster(&self) -> Option<&str> {
        match &self.what {
            What::Connected { cluster } | What::ListDone { cluster, .. } => Some(cluster),
            _ => None,
        }
    }

    /// The store listed, or the wait the step is about.
    pub fn kind(&self) -> Option<&'static str> {
        match &self.what {
            What::ListDone { resource, .. } => Some(resource_name(*resource)),
            What::WaitReturned { kind, .. }
            | What::WireguardGc { kind, .. }
            | What::Pruned { kind, .. } => Some(sync_kind_name(*kind)),
            _ => None,
        }
    }

    /// What the step says beyond its name, cluster and kind.
    pub fn detail(&self, started_at: &str) -> String {
        match &self.what {
            What::Started => format!("agent started at {started_at}"),
            What::Connected { .. } => "etcd connected, cluster config valid".to_owned(),
            What::ListDone { .. } => "listed and applied by every consumer".to_owned(),
            What::WaitReturned {
                waiter,
                end,
                pending,
                error,
                ..
            } => {
                let how = match end {
                    pb::WaitEnd::Synced => "synced".to_owned(),
                    pb::WaitEnd::Breaker if pending.is_empty() => "breaker fired".to_owned(),
                    pb::WaitEnd::Breaker => {
                        format!("breaker fired, pending {}", pending.join(", "))
                    }
                    pb::WaitEnd::Timeout => "timed out".to_owned(),
                    pb::WaitEnd::Failed => {
                        format!("failed: {}", error.as_deref().unwrap_or("unknown error"))
                    }
                    pb::WaitEnd::Unspecified => "ended".to_owned(),
                };
                format!("{}: {how}", waiter_name(*waiter))
            }
            What::Regenerated {
                endpoint,
                error: None,
            } => format!("endpoint {endpoint}"),
            What::Regenerated {
                endpoint,
                error: Some(error),
            } => format!("endpoint {endpoint} failed: {error}"),
            What::WireguardGc {
                kind: pb::TimelineSyncKind::IpIdentities,
                ..
            } => "restored allowed IPs dropped".to_owned(),
            What::WireguardGc { removed, .. } => format!("{removed} restored peers removed"),
            What::Pruned { removed, .. } => format!("{removed} restored map entries deleted"),
            What::Unknown(code) => format!("step type {code} (a newer agent?)"),
        }
    }

    /// How the wait ended, for a wait (the JSON's `wait_end`).
    pub fn wait_end(&self) -> Option<&'static str> {
        match &self.what {
            What::WaitReturned { end, .. } => Some(match end {
                pb::WaitEnd::Synced => "synced",
                pb::WaitEnd::Breaker => "breaker",
                pb::WaitEnd::Timeout => "timeout",
                pb::WaitEnd::Failed => "failed",
                pb::WaitEnd::Unspecified => "unknown",
            }),
            _ => None,
        }
    }
}

/// A store's name, as `meshctl status` names it.
pub fn resource_name(resource: pb::TimelineResource) -> &'static str {
    match resource {
        pb::TimelineResource::Nodes => "nodes",
        pb::TimelineResource::Services => "services",
        pb::TimelineResource::Identities => "identities",
        pb::TimelineResource::Ipcache => "ipcache",
        pb::TimelineResource::Unspecified => "unknown",
    }
}

/// A wait's name, as Cilium names it.
pub fn sync_kind_name(kind: pb::TimelineSyncKind) -> &'static str {
    match kind {
        pb::TimelineSyncKind::Nodes => "NodesSynced",
        pb::TimelineSyncKind::Services => "ServicesSynced",
        pb::TimelineSyncKind::IpIdentities => "IPIdentitiesSynced",
        pb::TimelineSyncKind::Unspecified => "unknown",
    }
}

/// Who waited.
pub fn waiter_name(waiter: pb::Waiter) -> &'static str {
    match waiter {
        pb::Waiter::Readiness => "readiness",
        pb::Waiter::Regeneration => "regeneration",
        pb::Waiter::Prune => "prune",
        pb::Waiter::WireguardGc => "wireguard-gc",
        pb::Waiter::Unspecified => "unknown",
    }
}
