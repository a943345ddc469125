//! The local API (`meshwork.agent.v1.Agent`) on the agent's unix socket.

use std::path::Path;
use std::time::Duration;

use actix::Addr;
use meshwork_clustermesh::barrier_actor::{GetMeshWait, SyncBarrierActor};
use meshwork_clustermesh::mesh::{ClusterMesh, GetMeshStatus};
use meshwork_clustermesh::status_api::mesh_status;
use meshwork_clustermesh::timeline::TimelineRecorder;
use meshwork_clustermesh::timeline_api::timeline_response;
use meshwork_clustermesh::{SyncKind, WaitError, WaitOutcome};
use meshwork_proto::agent::v1 as pb;
use tonic::{Request, Response, Status};

use crate::datapath::Datapath;
use crate::publisher::Publisher;

/// Serves the API from the mesh and the barrier actors.
pub struct LocalApi {
    /// The cluster mesh.
    pub mesh: Addr<ClusterMesh>,
    /// The sync barrier.
    pub barrier: Addr<SyncBarrierActor>,
    /// The BPF datapath, when enabled.
    pub datapath: Option<Datapath>,
    /// The publishing to the apiserver, with `--apiserver-addr`.
    pub publisher: Option<Publisher>,
    /// The restart timeline.
    pub timeline: TimelineRecorder,
    /// The clustermesh config directory as the status reports it (see
    /// [`LocalApi::config_dir_of`]).
    pub config_dir: String,
}

impl LocalApi {
    /// `--clustermesh-config` as the status reports it: absolute, since meshctl may run
    /// elsewhere than the agent's working directory; empty without one.
    pub fn config_dir_of(dir: Option<&Path>) -> String {
        dir.map(|dir| {
            std::path::absolute(dir)
                .unwrap_or_else(|_| dir.to_owned())
                .to_string_lossy()
                .into_owned()
        })
        .unwrap_or_default()
    }
}

#[tonic::async_trait]
impl pb::agent_server::Agent for LocalApi {
    async fn status(
        &self,
        _: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let statuses = self
            .mesh
            .send(GetMeshStatus)
            .await
            .map_err(|_| Status::unavailable("the agent is shutting down"))?;
        let datapath = match &self.datapath {
            Some(datapath) => Some(datapath.status().await),
            None => None,
        };
        let mut clustermesh = mesh_status(&statuses);
        clustermesh.config_dir.clone_from(&self.config_dir);
        Ok(Response::new(pb::StatusResponse {
            clustermesh: Some(clustermesh),
            datapath,
            apiserver: self.publisher.as_ref().map(Publisher::status),
        }))
    }

    async fn timeline(
        &self,
        _: Request<pb::TimelineRequest>,
    ) -> Result<Response<pb::TimelineResponse>, Status> {
        let timeline = self
            .timeline
            .snapshot()
            .ok_or_else(|| Status::unavailable("the agent keeps no timeline"))?;
        Ok(Response::new(timeline_response(&timeline)))
    }

    async fn wait_synced(
        &self,
        request: Request<pb::WaitSyncedRequest>,
    ) -> Result<Response<pb::WaitSyncedResponse>, Status> {
        let request = request.into_inner();
        let started = tokio::time::Instant::now();
        // A deadline beyond what an instant can hold is no deadline of its own.
        let deadline = (request.timeout_ms > 0)
            .then(|| started.checked_add(Duration::from_millis(request.timeout_ms)))
            .flatten();
        let mut kinds = Vec::new();
        for kind in &request.kinds {
            kinds.push(match pb::SyncKind::try_from(*kind) {
                Ok(pb::SyncKind::Nodes) => SyncKind::Nodes,
                Ok(pb::SyncKind::Services) => SyncKind::Services,
                Ok(pb::SyncKind::IpIdentities) => SyncKind::IpIdentities,
                _ => {
                    return Err(Status::invalid_argument(format!(
                        "unknown sync kind {kind}"
                    )));
                }
            });
        }
        if kinds.is_empty() {
            kinds = vec![SyncKind::Nodes, SyncKind::Services, SyncKind::IpIdentities];
        }
        let mut breaker_fired = false;
        for kind in kinds {
            let wait = self
                .barrier
                .send(GetMeshWait::all(kind))
                .await
                .map_err(|_| Status::unavailable("the agent is shutting down"))?;
            match wait.wait(deadline).await {
                Ok(WaitOutcome::Synced) => {}
                Ok(WaitOutcome::BreakerFired { .. }) => breaker_fired = true,
                Err(err @ WaitError::CallerDeadline { .. }) => {
                    return Err(Status::deadline_exceeded(err.to_string()));
                }
                // Only per-cluster waits end this way; a retry waits on what is there then.
                Err(err @ WaitError::Disconnected(_)) => {
                    return Err(Status::unavailable(err.to_string()));
                }
            }
        }
        Ok(Response::new(pb::WaitSyncedResponse {
            breaker_fired,
            waited_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        }))
    }
}
