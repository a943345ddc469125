//! The agent's API as the plugin uses it: `meshwork.agent.v1.Ipam` for the pod's IP,
//! `meshwork.agent.v1.Datapath` for its endpoint, over the agent's unix socket.
//!
//! gRPC statuses become CNI errors: UNAVAILABLE, RESOURCE_EXHAUSTED (no free IP),
//! DEADLINE_EXCEEDED and ABORTED (the endpoint was deleted while it regenerated) are
//! "try again later" (11); any other status is [`ErrorCode::AgentRefused`] (100) with the
//! agent's message.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use meshwork_proto::agent::v1 as pb;
use pb::datapath_client::DatapathClient;
use pb::ipam_client::IpamClient;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::error::{CniError, ErrorCode};

/// How long one call may take. PutEndpoint is the slow one: up to 10 s for the apiserver's
/// identity, then the program's load and attach.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// A connection to the agent.
#[derive(Debug, Clone)]
pub struct Agent {
    socket: PathBuf,
    ipam: IpamClient<Channel>,
    datapath: DatapathClient<Channel>,
}

impl Agent {
    /// Connects to the agent's socket; a missing socket or a dead agent is
    /// [`ErrorCode::TryAgainLater`].
    pub async fn connect(socket: &Path) -> Result<Self, CniError> {
        let channel = meshwork_proto::connect_unix(socket).await.map_err(|err| {
            CniError::new(
                ErrorCode::TryAgainLater,
                format!("the agent is unreachable at {}", socket.display()),
            )
            .with_details(err.to_string())
        })?;
        Ok(Self {
            socket: socket.to_owned(),
            ipam: IpamClient::new(channel.clone()),
            datapath: DatapathClient::new(channel),
        })
    }

    /// `Ipam/Allocate`: the IP of `owner` (the same one again for an owner that has one).
    pub async fn allocate(
        &mut self,
        owner: &str,
        pod: Option<String>,
    ) -> Result<pb::AllocateResponse, CniError> {
        let request = pb::AllocateRequest {
            owner: owner.to_owned(),
            pod: pod.unwrap_or_default(),
        };
        let mut ipam = self.ipam.clone();
        self.call("Ipam/Allocate", ipam.allocate(request)).await
    }

    /// `Ipam/Release`: gives `owner`'s IP back (an owner without one succeeds).
    pub async fn release(&mut self, owner: &str) -> Result<pb::ReleaseResponse, CniError> {
        let request = pb::ReleaseRequest {
            owner: owner.to_owned(),
        };
        let mut ipam = self.ipam.clone();
        self.call("Ipam/Release", ipam.release(request)).await
    }

    /// `Ipam/Status`.
    pub async fn ipam_status(&mut self) -> Result<pb::IpamStatusResponse, CniError> {
        let mut ipam = self.ipam.clone();
        self.call("Ipam/Status", ipam.status(pb::IpamStatusRequest {}))
            .await
    }

    /// `Datapath/PutEndpoint`: answered once the endpoint is stored and its program attached.
    pub async fn put_endpoint(&mut self, endpoint: pb::Endpoint) -> Result<(), CniError> {
        let request = pb::PutEndpointRequest {
            endpoint: Some(endpoint),
        };
        let mut datapath = self.datapath.clone();
        self.call("Datapath/PutEndpoint", datapath.put_endpoint(request))
            .await
            .map(drop)
    }

    /// `Datapath/DeleteEndpoint`: whether it existed.
    pub async fn delete_endpoint(&mut self, id: u64) -> Result<bool, CniError> {
        let mut datapath = self.datapath.clone();
        self.call(
            "Datapath/DeleteEndpoint",
            datapath.delete_endpoint(pb::DeleteEndpointRequest { id }),
        )
        .await
        .map(|reply| reply.existed)
    }

    /// The endpoint `id` as the agent has it (`Datapath/ListEndpoints`), if it has it.
    pub async fn endpoint(&mut self, id: u64) -> Result<Option<pb::EndpointStatus>, CniError> {
        let mut datapath = self.datapath.clone();
        let list = self
            .call(
                "Datapath/ListEndpoints",
                datapath.list_endpoints(pb::ListEndpointsRequest {}),
            )
            .await?;
        Ok(list
            .endpoints
            .into_iter()
            .find(|e| e.endpoint.as_ref().is_some_and(|e| e.id == id)))
    }

    async fn call<T>(
        &self,
        method: &str,
        call: impl Future<Output = Result<tonic::Response<T>, Status>>,
    ) -> Result<T, CniError> {
        match tokio::time::timeout(CALL_TIMEOUT, call).await {
            Ok(Ok(reply)) => Ok(reply.into_inner()),
            Ok(Err(status)) => Err(status_error(method, &self.socket, &status)),
            Err(_) => Err(CniError::new(
                ErrorCode::TryAgainLater,
                format!(
                    "the agent did not answer {method} within {} s",
                    CALL_TIMEOUT.as_secs()
                ),
            )),
        }
    }
}

/// The CNI error for a gRPC status of `method`.
pub fn status_error(method: &str, socket: &Path, status: &Status) -> CniError {
    let code = match status.code() {
        Code::Unavailable | Code::ResourceExhausted | Code::DeadlineExceeded | Code::Aborted => {
            ErrorCode::TryAgainLater
        }
        _ => ErrorCode::AgentRefused,
    };
    let hint = match status.code() {
        Code::Unimplemented => {
            " (the agent does not serve it: Ipam needs --ipam, Datapath the BPF datapath)"
        }
        _ => "",
    };
    CniError::new(
        code,
        format!("the agent answered {method} with {:?}{hint}", status.code()),
    )
    .with_details(format!(
        "{} (agent at {})",
        status.message(),
        socket.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_try_again_or_refused() {
        let socket = Path::new("/run/agent.sock");
        for (status, code) in [
            (
                Status::resource_exhausted("no free IP"),
                ErrorCode::TryAgainLater,
            ),
            (
                Status::unavailable("no snapshot yet"),
                ErrorCode::TryAgainLater,
            ),
            (Status::aborted("deleted"), ErrorCode::TryAgainLater),
            (
                Status::invalid_argument("bad label"),
                ErrorCode::AgentRefused,
            ),
            (Status::internal("checkpoint"), ErrorCode::AgentRefused),
            (Status::unimplemented(""), ErrorCode::AgentRefused),
        ] {
            let err = status_error("Ipam/Allocate", socket, &status);
            assert_eq!(err.code, code, "{status:?}");
            assert!(err.details.contains(status.message()), "{err}");
        }
        let err = status_error("Ipam/Allocate", socket, &Status::unimplemented(""));
        assert!(err.msg.contains("--ipam"), "{}", err.msg);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_missing_socket_is_try_again_later() {
        let dir = tempfile::tempdir().unwrap();
        let err = Agent::connect(&dir.path().join("agent.sock"))
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::TryAgainLater);
        assert!(err.msg.contains("agent.sock"), "{}", err.msg);
    }
}
