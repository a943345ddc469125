//! What meshctl shows of a status, in the field names and order of `status --json`; the
//! human view and the progress lines read it too, so absent proto messages are handled once.

use meshwork_proto::agent::v1 as pb;
use serde::Serialize;

/// `{"clustermesh": …}`: the top level of `status --json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StatusView {
    pub clustermesh: ClusterMeshView,
}

/// The cluster mesh: how many remote clusters are ready, and each one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClusterMeshView {
    pub ready: u32,
    pub total: u32,
    pub clusters: Vec<ClusterView>,
}

/// One remote cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClusterView {
    pub name: String,
    pub ready: bool,
    pub connected: bool,
    pub cluster_id: u32,
    pub config: ConfigView,
    pub synced: SyncedView,
    pub entries: EntriesView,
    pub failures: u64,
    /// RFC 3339.
    pub last_failure: Option<String>,
    pub last_error: Option<String>,
    /// The etcd endpoints (an extra field: the fixed shape ends before it).
    pub endpoints: Vec<String>,
    /// Read from the kvstoremesh cache at `endpoints`.
    pub cached: bool,
    /// How long ago the remote wrote its last heartbeat; null before one was read.
    pub heartbeat_age_ms: Option<u64>,
}

/// Whether the remote announces a cluster config, and whether it was retrieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ConfigView {
    pub required: bool,
    pub retrieved: bool,
}

/// Which kinds have synced; `endpoints` is the remote ipcache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SyncedView {
    pub nodes: bool,
    pub services: bool,
    pub identities: bool,
    pub endpoints: bool,
}

/// How many entries of each kind the agent holds from the remote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EntriesView {
    pub nodes: u64,
    pub services: u64,
    pub identities: u64,
    pub endpoints: u64,
}

impl ClusterMeshView {
    /// Zero clusters count as ready: there is nothing to wait for.
    pub fn all_ready(&self) -> bool {
        self.ready >= self.total
    }
}

impl From<&pb::ClusterMeshStatus> for StatusView {
    fn from(mesh: &pb::ClusterMeshStatus) -> Self {
        Self {
            clustermesh: ClusterMeshView {
                ready: mesh.ready,
                total: mesh.total,
                clusters: mesh.clusters.iter().map(ClusterView::from).collect(),
            },
        }
    }
}

impl From<&pb::RemoteClusterStatus> for ClusterView {
    fn from(c: &pb::RemoteClusterStatus) -> Self {
        let config = c.config.unwrap_or_default();
        let synced = c.synced.unwrap_or_default();
        let entries = c.entries.unwrap_or_default();
        Self {
            name: c.name.clone(),
            ready: c.ready,
            connected: c.connected,
            cluster_id: c.cluster_id,
            config: ConfigView {
                required: config.required,
                retrieved: config.retrieved,
            },
            synced: SyncedView {
                nodes: synced.nodes,
                services: synced.services,
                identities: synced.identities,
                endpoints: synced.endpoints,
            },
            entries: EntriesView {
                nodes: entries.nodes,
                services: entries.services,
                identities: entries.identities,
                endpoints: entries.endpoints,
            },
            failures: c.failures,
            last_failure: c.last_failure.clone(),
            last_error: c.last_error.clone(),
            endpoints: c
                .endpoints
                .split(',')
                .map(str::trim)
                .filter(|e| !e.is_empty())
                .map(str::to_owned)
                .collect(),
            cached: c.cached,
            heartbeat_age_ms: c.heartbeat_age_ms,
        }
    }
}

/// A fixed two-cluster status for the rendering tests: one ready, one failing.
#[cfg(test)]
pub fn sample() -> pb::ClusterMeshStatus {
    pb::ClusterMeshStatus {
        ready: 1,
        total: 2,
        config_dir: "/etc/meshwork/clustermesh".into(),
        clusters: vec![
            pb::RemoteClusterStatus {
                name: "cluster-2".into(),
                ready: true,
                connected: true,
                cluster_id: 2,
                config: Some(pb::ConfigStatus {
                    required: true,
                    retrieved: true,
                }),
                synced: Some(pb::SyncStatus {
                    nodes: true,
                    services: true,
                    identities: true,
                    endpoints: true,
                }),
                entries: Some(pb::EntryCounts {
                    nodes: 3,
                    services: 2,
                    identities: 5,
                    endpoints: 10,
                }),
                failures: 0,
                last_failure: None,
                last_error: None,
                endpoints: "https://127.0.0.1:2379".into(),
                heartbeat_age_ms: Some(35_400),
                cached: true,
            },
            pb::RemoteClusterStatus {
                name: "cluster-3".into(),
                ready: false,
                connected: true,
                cluster_id: 0,
                config: Some(pb::ConfigStatus {
                    required: true,
                    retrieved: true,
                }),
                synced: Some(pb::SyncStatus::default()),
                entries: Some(pb::EntryCounts {
                    nodes: 1,
                    ..Default::default()
                }),
                failures: 1,
                last_failure: Some("2026-11-29T10:00:00Z".into()),
                last_error: Some("clusterID 2 is already used".into()),
                endpoints: "https://127.0.0.1:2381, https://127.0.0.2:2381".into(),
                heartbeat_age_ms: None,
                cached: false,
            },
        ],
    }
}
