//! Where CiliumNode objects live, and how the operator publishes a node's ENIs and pool to
//! them without ever showing a pool IP whose ENI is unknown.
//!
//! - [`publish`]: the publishing rule, one function shared by every backend.
//! - [`kubernetes`]: the objects in the Kubernetes API (status subresource, then spec).
//! - [`etcd`]: the objects in etcd (kvstore mode), spec and status in one transaction.

pub mod etcd;
pub mod kubernetes;
pub mod publish;

use std::future::Future;

use crate::cilium_node::CiliumNode;

pub use etcd::{EtcdStore, KEY_PREFIX};
pub use kubernetes::KubeStore;
pub use publish::{LiveNode, OperatorState, compose};

/// Attempts of one publish before giving up on conflicts (each re-reads and recomputes).
pub const MAX_ATTEMPTS: usize = 5;

/// Why a read or a publish failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The Kubernetes API refused or could not be reached.
    #[error("kubernetes: {0}")]
    Kube(kube::Error),
    /// etcd refused, could not be reached or did not answer in time.
    #[error(transparent)]
    Etcd(#[from] meshwork_kvstore::KvstoreError),
    /// A stored object could not be encoded or decoded.
    #[error("CiliumNode {name}: {error}")]
    Json {
        /// The node.
        name: String,
        /// The serde error.
        error: serde_json::Error,
    },
    /// The object has no name.
    #[error("CiliumNode without metadata.name")]
    Unnamed,
    /// The node does not exist (any more).
    #[error("CiliumNode {0} not found")]
    NotFound(String),
    /// Every attempt met a concurrent writer.
    #[error("CiliumNode {name}: still conflicting after {attempts} attempts")]
    Conflicts {
        /// The node.
        name: String,
        /// Attempts made.
        attempts: usize,
    },
}

// The cause is in the message: converting does not also make it the error's source, so no
// chain prints it twice.
impl From<kube::Error> for StoreError {
    fn from(error: kube::Error) -> Self {
        Self::Kube(error)
    }
}

/// A store of CiliumNode objects.
pub trait NodeStore: Send + Sync {
    /// The current object, `None` if there is none.
    fn get(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<CiliumNode>, StoreError>> + Send;

    /// Publishes `live` onto `latest` (the newest object the caller knows, with its
    /// `resourceVersion`) following [`compose`]'s rule; on a conflict, re-reads the object
    /// and recomputes, at most [`MAX_ATTEMPTS`] times. Returns the object as stored.
    fn publish(
        &self,
        latest: CiliumNode,
        live: &LiveNode,
    ) -> impl Future<Output = Result<CiliumNode, StoreError>> + Send;
}

/// The name of `node`, which every stored object has.
fn name_of(node: &CiliumNode) -> Result<String, StoreError> {
    node.metadata.name.clone().ok_or(StoreError::Unnamed)
}

#[cfg(test)]
mod tests;
