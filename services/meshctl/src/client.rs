//! The agent's API client, with the errors an on-call engineer can act on.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::anyhow;
use meshwork_proto::agent::v1::agent_client::AgentClient;
use meshwork_proto::agent::v1::{ClusterMeshStatus, StatusRequest, StatusResponse};
use meshwork_proto::{ConnectError, connect_unix_with};
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

/// Status is a snapshot: an agent that takes longer than this is stuck.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(10);
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection to the agent's API, made on first use and again after a failed connect.
pub struct Agent {
    socket: PathBuf,
    client: Option<AgentClient<Channel>>,
}

impl Agent {
    /// An agent reached at `socket`; nothing is connected yet.
    pub fn new(socket: &Path) -> Self {
        Self {
            socket: socket.to_path_buf(),
            client: None,
        }
    }

    /// The agent's cluster mesh status (empty when the agent reports none).
    pub async fn status(&mut self) -> anyhow::Result<ClusterMeshStatus> {
        Ok(self.full_status().await?.clustermesh.unwrap_or_default())
    }

    /// A channel to the agent, for the other services on its socket.
    pub async fn channel(&self) -> anyhow::Result<Channel> {
        let endpoint = Endpoint::from_static("http://[::]:50051")
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(CALL_TIMEOUT);
        connect_unix_with(endpoint, &self.socket)
            .await
            .map_err(|err| connect_error(&err))
    }

    /// Maps a failed call of `rpc` (`Service/Method`) to an error an on-call engineer can
    /// act on.
    pub fn call_error(&self, rpc: &str, status: &tonic::Status) -> anyhow::Error {
        match status.code() {
            Code::InvalidArgument | Code::Internal | Code::NotFound => {
                anyhow!("{rpc}: {}", status.message())
            }
            _ => call_error(&self.socket, rpc, status),
        }
    }

    /// The agent's whole status.
    pub async fn full_status(&mut self) -> anyhow::Result<StatusResponse> {
        let client = match &mut self.client {
            Some(client) => client,
            None => {
                let channel = self.channel().await?;
                self.client.insert(AgentClient::new(channel))
            }
        };
        let reply = client
            .status(StatusRequest {})
            .await
            .map_err(|status| call_error(&self.socket, "Agent/Status", &status))?;
        Ok(reply.into_inner())
    }
}

fn unreachable(socket: &Path, reason: &str) -> anyhow::Error {
    anyhow!(
        "cannot reach the agent at {}: {reason} — is meshwork-agent running? (--socket / MESHWORK_SOCKET)",
        socket.display()
    )
}

pub(crate) fn connect_error(err: &ConnectError) -> anyhow::Error {
    match err {
        ConnectError::Socket {
            path,
            error: source,
        } => {
            let reason = match source.kind() {
                io::ErrorKind::NotFound => "no such socket".to_owned(),
                io::ErrorKind::ConnectionRefused => "connection refused".to_owned(),
                io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
                io::ErrorKind::TimedOut => {
                    format!("connect timed out after {}s", CONNECT_TIMEOUT.as_secs())
                }
                _ => source.to_string(),
            };
            unreachable(path, &reason)
        }
        ConnectError::Transport {
            path,
            error: source,
        } => anyhow!(
            "cannot set up a gRPC connection to the agent at {}: {source} — is it meshwork-agent's API socket? (--socket / MESHWORK_SOCKET)",
            path.display()
        ),
    }
}

/// Maps a failed call of `rpc` (`Service/Method` of `meshwork.agent.v1`) to an error that
/// names the call.
pub(crate) fn call_error(socket: &Path, rpc: &str, status: &tonic::Status) -> anyhow::Error {
    let server = format!("the agent at {}", socket.display());
    let unimplemented = format!("does not serve meshwork.agent.v1.{rpc} — a different version?");
    failed_call(&server, rpc, status, &unimplemented, |reason| {
        unreachable(socket, reason)
    })
}

/// How a failed call of `rpc` on `server` ("the agent at …") reads: UNAVAILABLE through
/// `unreachable`, UNIMPLEMENTED with `unimplemented` after the server's name.
pub(crate) fn failed_call(
    server: &str,
    rpc: &str,
    status: &tonic::Status,
    unimplemented: &str,
    unreachable: impl FnOnce(&str) -> anyhow::Error,
) -> anyhow::Error {
    match status.code() {
        Code::Unavailable => unreachable(status.message()),
        // tonic reports the client-side call timeout as Cancelled.
        Code::DeadlineExceeded | Code::Cancelled => anyhow!(
            "{server} did not answer {rpc} within {}s",
            CALL_TIMEOUT.as_secs()
        ),
        Code::Unimplemented => anyhow!("{server} {unimplemented}"),
        code => anyhow!(
            "{server} failed to answer {rpc}: {code:?}: {}",
            status.message()
        ),
    }
}
