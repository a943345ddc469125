//! `meshwork.agent.v1.Ipam` on the API socket (with `--ipam`): the CNI plugin's Allocate
//! and Release, and the pool's Status.

use meshwork_ipam::{AllocateError, ROUTER_OWNER, ReleaseError};
use meshwork_proto::agent::v1 as pb;
use tonic::{Request, Response, Status};

use super::{Ipam, ShuttingDown, convert};

/// Serves the Ipam service from the agent's [`Ipam`].
#[derive(Clone)]
pub struct IpamApi(pub Ipam);

fn allocate_status(err: &AllocateError) -> Status {
    match err {
        AllocateError::InvalidOwner => Status::invalid_argument("the owner is empty"),
        AllocateError::NoSnapshot => Status::unavailable(err.to_string()),
        AllocateError::Exhausted { .. } => {
            Status::resource_exhausted(format!("{err}; retry: the operator allocates more"))
        }
        AllocateError::EniMissing { .. }
        | AllocateError::RouterIpTaken { .. }
        | AllocateError::Checkpoint(_) => Status::internal(err.to_string()),
    }
}

fn shutting_down(_: ShuttingDown) -> Status {
    Status::unavailable("the agent is shutting down")
}

#[tonic::async_trait]
impl pb::ipam_server::Ipam for IpamApi {
    async fn allocate(
        &self,
        request: Request<pb::AllocateRequest>,
    ) -> Result<Response<pb::AllocateResponse>, Status> {
        let request = request.into_inner();
        let allocated = self
            .0
            .allocate(&request.owner, &request.pod)
            .await
            .map_err(shutting_down)?
            .map_err(|err| allocate_status(&err))?;
        Ok(Response::new(convert::allocate_response(
            &allocated.allocation,
            allocated.existing,
        )))
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let owner = request.into_inner().owner;
        // The router IP is the agent's own: no client gives it back.
        if owner == ROUTER_OWNER {
            return Err(Status::invalid_argument(
                "the router IP is the agent's own and is never released through the API",
            ));
        }
        let released = self
            .0
            .release(&owner)
            .await
            .map_err(shutting_down)?
            .map_err(|err| match err {
                ReleaseError::InvalidOwner => Status::invalid_argument("the owner is empty"),
                ReleaseError::Checkpoint(err) => Status::internal(err.to_string()),
            })?;
        Ok(Response::new(pb::ReleaseResponse {
            released: released.is_some(),
            ip: released.map(|a| a.ip.to_string()).unwrap_or_default(),
        }))
    }

    async fn status(
        &self,
        _: Request<pb::IpamStatusRequest>,
    ) -> Result<Response<pb::IpamStatusResponse>, Status> {
        Ok(Response::new(self.0.status()))
    }
}
