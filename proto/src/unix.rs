//! A tonic channel over a unix socket (the agent's `--api-socket`).

use std::error::Error as _;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};

/// How long [`connect_unix`] waits for the socket to accept before giving up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a channel to a unix socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The socket could not be connected: no such file, nothing listening (connection
    /// refused), permission denied, or the connect timed out.
    #[error("cannot connect to {}: {error}", path.display())]
    Socket {
        /// The socket's path.
        path: PathBuf,
        /// What the connect failed with; its [`kind`](io::Error::kind) tells which case.
        error: io::Error,
    },
    /// The socket accepted, but no gRPC (HTTP/2) connection could be set up over it.
    #[error("cannot set up a gRPC connection over {}: {error}", path.display())]
    Transport {
        /// The socket's path.
        path: PathBuf,
        /// tonic's error.
        error: tonic::transport::Error,
    },
}

impl ConnectError {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        match self {
            Self::Socket { path, .. } | Self::Transport { path, .. } => path,
        }
    }
}

/// Connects to a gRPC server on the unix socket at `path`, with a 5 s connect timeout.
///
/// The connection is made before this returns (so a missing socket or a dead server is a
/// [`ConnectError::Socket`] here, not on the first call); if it drops later, the channel
/// reconnects to the same path.
pub async fn connect_unix(path: impl AsRef<Path>) -> Result<Channel, ConnectError> {
    let endpoint = Endpoint::from_static("http://[::]:50051").connect_timeout(CONNECT_TIMEOUT);
    connect_unix_with(endpoint, path).await
}

/// Like [`connect_unix`], with the caller's [`Endpoint`] settings (timeouts, keepalive…);
/// the endpoint's URI is only used for the `:authority` of requests, never to connect.
pub async fn connect_unix_with(
    endpoint: Endpoint,
    path: impl AsRef<Path>,
) -> Result<Channel, ConnectError> {
    let path: Arc<Path> = Arc::from(path.as_ref());
    let target = Arc::clone(&path);
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let target = Arc::clone(&target);
        async move { Ok::<_, io::Error>(TokioIo::new(UnixStream::connect(&*target).await?)) }
    });
    endpoint
        .connect_with_connector(connector)
        .await
        .map_err(|source| classify(path.to_path_buf(), source))
}

/// Tells a socket failure (whose io error is somewhere in tonic's source chain) from an
/// HTTP/2 failure, so callers can say "nothing listens there" rather than "transport error".
fn classify(path: PathBuf, source: tonic::transport::Error) -> ConnectError {
    let mut cause = source.source();
    while let Some(err) = cause {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            // The chain only lends the io error; keep its kind and text.
            let source = io::Error::new(io.kind(), io.to_string());
            return ConnectError::Socket {
                path,
                error: source,
            };
        }
        cause = err.source();
    }
    ConnectError::Transport {
        path,
        error: source,
    }
}
