//! What a remote cluster's stores tell their consumers, in the order the stores saw it.
//!
//! A store's events end with [`RemoteEvent::ListDone`] once its first list is complete:
//! every entry that list covered comes before it in the same stream (kube's `InitDone`), so a
//! consumer that has applied the marker has applied the list, and says so itself.

use std::sync::Arc;

use crate::{ClusterService, IpCacheEntry, Node, Resource};

/// An upsert or a delete of a value.
#[derive(Debug, Clone, PartialEq)]
pub enum Change<V> {
    /// Created or changed.
    Upsert(Arc<V>),
    /// Deleted; the last value.
    Delete(Arc<V>),
}

impl<V> Change<V> {
    /// Whether the value was upserted (not deleted).
    pub fn is_upsert(&self) -> bool {
        matches!(self, Self::Upsert(_))
    }

    /// The value upserted, or the last value of the deleted key.
    pub fn value(&self) -> &Arc<V> {
        match self {
            Self::Upsert(value) | Self::Delete(value) => value,
        }
    }
}

/// A change a remote cluster contributed (the cluster is named by the batch that carries it).
#[derive(Debug, Clone)]
pub enum RemoteEvent {
    /// A remote node.
    Node {
        /// The change.
        change: Change<Node>,
    },
    /// A remote global (shared) service.
    Service {
        /// The change.
        change: Change<ClusterService>,
    },
    /// A remote ipcache entry (its key is [`IpCacheEntry::key_name`]).
    IpCache {
        /// An upsert of a key the cluster did not have before.
        created: bool,
        /// The change.
        change: Change<IpCacheEntry>,
    },
    /// The first list of this resource is complete: everything it covered came before.
    /// Sent once per store (never again on reconnects or re-lists).
    ListDone(Resource),
}
