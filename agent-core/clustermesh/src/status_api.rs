//! The remote clusters' status in the API's shape (`meshwork.agent.v1.ClusterMeshStatus`),
//! which the agent and kvstoremesh both serve.

use std::time::SystemTime;

use meshwork_proto::agent::v1 as pb;

use crate::status::ClusterStatus;

/// Every remote cluster's status, with the ready and total counts of `cilium status`.
pub fn mesh_status(statuses: &[ClusterStatus]) -> pb::ClusterMeshStatus {
    let clusters: Vec<pb::RemoteClusterStatus> = statuses.iter().map(cluster_status).collect();
    pb::ClusterMeshStatus {
        ready: u32::try_from(clusters.iter().filter(|c| c.ready).count()).unwrap_or(u32::MAX),
        total: u32::try_from(clusters.len()).unwrap_or(u32::MAX),
        clusters,
        // The server fills in its own directory.
        config_dir: String::new(),
    }
}

/// One remote cluster's status.
pub fn cluster_status(s: &ClusterStatus) -> pb::RemoteClusterStatus {
    pb::RemoteClusterStatus {
        name: s.name.clone(),
        ready: s.ready(),
        connected: s.connected,
        cluster_id: s.cluster_id,
        config: Some(pb::ConfigStatus {
            required: s.config_required,
            retrieved: s.config_retrieved,
        }),
        // Cilium's status calls the listed stores "synced" and the ipcache "endpoints".
        synced: Some(pb::SyncStatus {
            nodes: s.listed.nodes,
            services: s.listed.services,
            identities: s.listed.identities,
            endpoints: s.listed.ipcache,
        }),
        entries: Some(pb::EntryCounts {
            nodes: s.entries.nodes,
            services: s.entries.services,
            identities: s.entries.identities,
            endpoints: s.entries.ipcache,
        }),
        failures: s.failures,
        last_failure: s
            .last_failure
            .map(|t| humantime::format_rfc3339_seconds(t).to_string()),
        last_error: s.last_error.clone(),
        endpoints: s.etcd_endpoints.clone(),
        heartbeat_age_ms: s.last_heartbeat.map(|at| {
            let age = SystemTime::now().duration_since(at).unwrap_or_default();
            u64::try_from(age.as_millis()).unwrap_or(u64::MAX)
        }),
        cached: s.cached,
    }
}
