//! CiliumNode objects in etcd (kvstore mode): one key per node,
//! `meshwork/ciliumnodes/v1/<node>`, holding the whole object as JSON.
//!
//! Better than Kubernetes' two requests: spec and status are written together by one
//! transaction, so no reader can ever see one without the other. The transaction compares
//! the key's mod revision with the one the object was read at (carried in
//! `metadata.resourceVersion`), and on a mismatch returns the current value, from which the
//! publish is recomputed.

use meshwork_kvstore::{ConditionalPut, EtcdBackend};

use super::publish::{Order, compose_in};
use super::{
    LiveNode, MAX_ATTEMPTS, NodeStore, Part, StoreError, UpdateError, Updated, guarded, name_of,
};
use crate::cilium_node::CiliumNode;

/// The prefix of every CiliumNode key.
pub const KEY_PREFIX: &str = "meshwork/ciliumnodes/v1/";

/// The key of node `name`.
pub fn key(name: &str) -> String {
    format!("{KEY_PREFIX}{name}")
}

/// The etcd backend.
#[derive(Clone)]
pub struct EtcdStore {
    backend: EtcdBackend,
    order: Order,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.backend.endpoints())
            .field("order", &self.order)
            .finish()
    }
}

/// Decodes the object stored under `key` at `mod_revision`, which becomes its
/// resourceVersion (the revision lives in the key, not in the value).
pub fn decode(key: &str, value: &[u8], mod_revision: i64) -> Result<CiliumNode, StoreError> {
    let mut node: CiliumNode =
        serde_json::from_slice(value).map_err(|source| StoreError::Json {
            name: key.to_owned(),
            error: source,
        })?;
    node.metadata.resource_version = Some(mod_revision.to_string());
    Ok(node)
}

impl EtcdStore {
    /// CiliumNodes through `backend`.
    pub fn new(backend: EtcdBackend) -> Self {
        Self {
            backend,
            order: Order::StatusFirst,
        }
    }

    /// The same store composing in Cilium's old, wrong order (tests only).
    #[cfg(test)]
    pub(crate) fn reversed(mut self) -> Self {
        self.order = Order::SpecFirst;
        self
    }

    /// Writes `node` if its key is still at the revision `node` was read at (absent if it
    /// carries none). `Ok(Err(current))` on a conflict, `current` being the stored object.
    async fn write(
        &self,
        name: &str,
        mut node: CiliumNode,
    ) -> Result<Result<CiliumNode, Option<CiliumNode>>, StoreError> {
        let key = key(name);
        // No (or an unreadable) revision: the object was never stored, so only create it.
        let expected = node
            .metadata
            .resource_version
            .as_deref()
            .and_then(|version| version.parse::<i64>().ok())
            .unwrap_or(0);
        // The revision lives in the key, not in the value.
        node.metadata.resource_version = None;
        let value = serde_json::to_vec(&node).map_err(|source| StoreError::Json {
            name: name.to_owned(),
            error: source,
        })?;
        match self
            .backend
            .put_if_mod_revision(&key, value, expected)
            .await?
        {
            ConditionalPut::Written { revision } => {
                node.metadata.resource_version = Some(revision.to_string());
                Ok(Ok(node))
            }
            ConditionalPut::Conflict { current } => {
                let current = current
                    .map(|(value, revision)| decode(&key, &value, revision))
                    .transpose()?;
                Ok(Err(current))
            }
        }
    }
}

impl NodeStore for EtcdStore {
    async fn get(&self, name: &str) -> Result<Option<CiliumNode>, StoreError> {
        let key = key(name);
        self.backend
            .get(&key)
            .await?
            .map(|(value, revision)| decode(&key, &value, revision))
            .transpose()
    }

    async fn publish(&self, latest: CiliumNode, live: &LiveNode) -> Result<CiliumNode, StoreError> {
        let name = name_of(&latest)?;
        let mut latest = latest;
        for _ in 0..MAX_ATTEMPTS {
            let desired = compose_in(&latest, live, self.order);
            match self.write(&name, desired).await? {
                Ok(stored) => return Ok(stored),
                Err(Some(current)) => latest = current,
                // Deleted (or never created) meanwhile: the operator does not recreate a
                // node its owner removed.
                Err(None) => return Err(StoreError::NotFound(name)),
            }
        }
        Err(StoreError::Conflicts {
            name,
            attempts: MAX_ATTEMPTS,
        })
    }

    /// Spec and status are one value here, so `part` changes nothing: the whole object is
    /// written in one transaction guarded by the revision it was read at.
    async fn update<E, F>(
        &self,
        name: &str,
        _part: Part,
        mut change: F,
    ) -> Result<Updated, UpdateError<E>>
    where
        E: Send,
        F: FnMut(Option<&CiliumNode>) -> Result<Option<CiliumNode>, E> + Send,
    {
        let mut current = self.get(name).await?;
        for _ in 0..MAX_ATTEMPTS {
            let Some(desired) = change(current.as_ref()).map_err(UpdateError::Refused)? else {
                return Ok(Updated::Unchanged(current));
            };
            let desired = guarded(name, current.as_ref(), desired);
            match self.write(name, desired).await? {
                Ok(node) => {
                    let created = current.is_none();
                    return Ok(Updated::Written { node, created });
                }
                // The transaction returned what is stored now (or that nothing is).
                Err(now) => current = now,
            }
        }
        Err(StoreError::Conflicts {
            name: name.to_owned(),
            attempts: MAX_ATTEMPTS,
        }
        .into())
    }
}
