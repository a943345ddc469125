//! Errors of the kvstore layer.

use std::path::PathBuf;

/// Why a kvstore operation failed.
#[derive(Debug, thiserror::Error)]
pub enum KvstoreError {
    /// A TLS file named in the configuration could not be read.
    #[error("reading {what} {path}: {error}")]
    TlsFile {
        /// Which file (`trusted-ca-file`, …).
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// The configuration is unusable (no endpoints, cert without key, …).
    #[error("invalid etcd configuration: {0}")]
    Config(String),
    /// etcd could not be reached in time.
    #[error("connecting to etcd at {endpoints}: {error}")]
    Connect {
        /// The endpoints tried.
        endpoints: String,
        /// The client error.
        error: etcd_client::Error,
    },
    /// An etcd request failed.
    #[error("etcd {operation}: {error}")]
    Request {
        /// What was asked (`range cilium/state/…`, `put …`).
        operation: String,
        /// The client error.
        error: etcd_client::Error,
    },
    /// The revision to read at has been compacted away; the caller must re-list.
    #[error("revision {revision} has been compacted (compact revision {compact_revision})")]
    Compacted {
        /// The revision asked for.
        revision: i64,
        /// The oldest revision still available.
        compact_revision: i64,
    },
    /// The server ended a watch stream.
    #[error("etcd closed the watch on {0}")]
    WatchClosed(String),
    /// A request did not answer before its deadline.
    #[error("etcd {0} timed out")]
    Timeout(String),
}

impl KvstoreError {
    pub(crate) fn request(operation: impl Into<String>) -> impl FnOnce(etcd_client::Error) -> Self {
        let operation = operation.into();
        move |source| Self::Request {
            operation,
            error: source,
        }
    }

    /// Whether the error means the response was larger than the client accepts.
    pub fn is_message_too_large(&self) -> bool {
        matches!(self, Self::Request { error: etcd_client::Error::GRpcStatus(status), .. }
            if status.code() == tonic::Code::OutOfRange && status.message().contains("too large"))
    }

    /// Whether etcd refused a read because its revision has been compacted.
    pub fn is_compacted(&self) -> bool {
        match self {
            Self::Compacted { .. } => true,
            Self::Request {
                error: etcd_client::Error::GRpcStatus(status),
                ..
            } => status.message().contains("compacted"),
            _ => false,
        }
    }
}
