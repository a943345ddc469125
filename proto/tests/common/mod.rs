//! A fake agent for the transport tests: the agent's logic is not what they test.

#![allow(dead_code, reason = "each test binary uses part of the helpers")]

use meshwork_proto::agent::v1::agent_server::Agent;
use meshwork_proto::agent::v1::{
    ClusterMeshStatus, RemoteClusterStatus, StatusRequest, StatusResponse, WaitSyncedRequest,
    WaitSyncedResponse,
};
use tonic::{Request, Response, Status};

/// Answers with a fixed status; the agent's logic is not what is tested here.
pub struct FakeAgent;

#[tonic::async_trait]
impl Agent for FakeAgent {
    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        Ok(Response::new(StatusResponse {
            datapath: None,
            apiserver: None,
            clustermesh: Some(ClusterMeshStatus {
                ready: 1,
                total: 1,
                clusters: vec![RemoteClusterStatus {
                    name: "cluster-2".into(),
                    ready: true,
                    cluster_id: 2,
                    last_error: None,
                    ..Default::default()
                }],
                ..Default::default()
            }),
        }))
    }

    async fn timeline(
        &self,
        _: Request<meshwork_proto::agent::v1::TimelineRequest>,
    ) -> Result<Response<meshwork_proto::agent::v1::TimelineResponse>, Status> {
        Err(Status::unimplemented("not part of this test"))
    }

    async fn wait_synced(
        &self,
        _: Request<WaitSyncedRequest>,
    ) -> Result<Response<WaitSyncedResponse>, Status> {
        Err(Status::unimplemented("not part of this test"))
    }
}
