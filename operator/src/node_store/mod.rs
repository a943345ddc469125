//! Where CiliumNode objects live, and how the operator publishes a node's ENIs and pool to
//! them without ever showing a pool IP whose ENI is unknown.
//!
//! - [`publish`]: the publishing rule, one function shared by every backend.
//! - [`kubernetes`]: the objects in the Kubernetes API (status subresource, then spec).
//! - [`etcd`]: the objects in etcd (kvstore mode), spec and status in one transaction.
//!
//! Besides publishing, [`NodeStore::update`] writes what others own (the agent's usage and
//! release answers, its registration) with the same rule for conflicts: re-read the latest
//! object and recompute the change from it.

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

/// Which half of a CiliumNode an update changes. Kubernetes writes them through separate
/// requests (the object for spec, the status subresource for status) and ignores the other
/// half; etcd stores the whole object either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// `spec` (and, when creating, the object).
    Spec,
    /// `status`.
    Status,
}

/// What [`NodeStore::update`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Updated {
    /// The change wanted nothing written; the stored object, if there is one.
    Unchanged(Option<CiliumNode>),
    /// The object as stored after the write.
    Written {
        /// The stored object, with its new resourceVersion.
        node: CiliumNode,
        /// There was no object: it was created.
        created: bool,
    },
}

/// Why an update failed; nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum UpdateError<E> {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The change refused the object it was given.
    #[error("refused")]
    Refused(E),
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

    /// Reads node `name`, and writes what `change` makes of it (`None`: write nothing; an
    /// error: refuse, write nothing). `change` gets `None` when there is no object; what it
    /// returns then is created (in Kubernetes without its status, which a create ignores).
    /// Only `part` of the returned object is written. A conflicting writer meanwhile makes
    /// the store re-read the latest object and call `change` again, at most
    /// [`MAX_ATTEMPTS`] times, so `change` must be a function of the object alone.
    fn update<E, F>(
        &self,
        name: &str,
        part: Part,
        change: F,
    ) -> impl Future<Output = Result<Updated, UpdateError<E>>> + Send
    where
        E: Send,
        F: FnMut(Option<&CiliumNode>) -> Result<Option<CiliumNode>, E> + Send;
}

/// `desired` ready to be written over `current`: named `name`, and carrying the
/// resourceVersion `current` was read at (none when creating), which guards the write.
fn guarded(name: &str, current: Option<&CiliumNode>, mut desired: CiliumNode) -> CiliumNode {
    desired.metadata.name = Some(name.to_owned());
    desired.metadata.resource_version =
        current.and_then(|current| current.metadata.resource_version.clone());
    desired
}

/// The name of `node`, which every stored object has.
fn name_of(node: &CiliumNode) -> Result<String, StoreError> {
    node.metadata.name.clone().ok_or(StoreError::Unnamed)
}

#[cfg(test)]
mod tests;
