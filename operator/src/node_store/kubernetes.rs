//! CiliumNode objects in the Kubernetes API.
//!
//! A publish is two requests, because the status subresource is written separately from
//! the object: `PUT …/ciliumnodes/<node>/status` first, then `PUT …/ciliumnodes/<node>`
//! with the spec, carrying the resourceVersion the status write returned. If the status
//! write fails, no spec request is made, so the old pool stays next to a status at least as
//! new. A 409 on either request means someone else wrote in between: re-read the object
//! and recompute both halves from it and the live cache.

use kube::Client;
use kube::api::{Api, PostParams};

use super::publish::{Order, compose_in};
use super::{
    LiveNode, MAX_ATTEMPTS, NodeStore, Part, StoreError, UpdateError, Updated, guarded, name_of,
};
use crate::cilium_node::CiliumNode;

/// The Kubernetes backend.
#[derive(Clone)]
pub struct KubeStore {
    api: Api<CiliumNode>,
    order: Order,
}

impl std::fmt::Debug for KubeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeStore")
            .field("order", &self.order)
            .finish()
    }
}

impl KubeStore {
    /// CiliumNodes (cluster-scoped) through `client`.
    pub fn new(client: Client) -> Self {
        Self {
            api: Api::all(client),
            order: Order::StatusFirst,
        }
    }

    /// The same store publishing in Cilium's old, wrong order (tests only).
    #[cfg(test)]
    pub(crate) fn reversed(mut self) -> Self {
        self.order = Order::SpecFirst;
        self
    }

    /// Writes `desired` in the store's order; the error of the first failing request.
    async fn write(&self, name: &str, desired: CiliumNode) -> Result<CiliumNode, kube::Error> {
        let params = PostParams::default();
        match self.order {
            Order::StatusFirst => {
                let mut written = self.api.replace_status(name, &params, &desired).await?;
                // The status write returned the new resourceVersion; the spec goes on top.
                written.spec = desired.spec;
                self.api.replace(name, &params, &written).await
            }
            #[cfg(test)]
            Order::SpecFirst => {
                let mut written = self.api.replace(name, &params, &desired).await?;
                written.status = desired.status;
                self.api.replace_status(name, &params, &written).await
            }
        }
    }
}

fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.is_conflict())
}

/// The object changed, appeared or went between the read and the write: read it again.
fn is_stale_read(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status)
        if status.is_conflict() || status.is_already_exists() || status.is_not_found())
}

impl NodeStore for KubeStore {
    async fn get(&self, name: &str) -> Result<Option<CiliumNode>, StoreError> {
        Ok(self.api.get_opt(name).await?)
    }

    async fn publish(&self, latest: CiliumNode, live: &LiveNode) -> Result<CiliumNode, StoreError> {
        let name = name_of(&latest)?;
        let mut latest = latest;
        for _ in 0..MAX_ATTEMPTS {
            let desired = compose_in(&latest, live, self.order);
            match self.write(&name, desired).await {
                Ok(stored) => return Ok(stored),
                Err(err) if is_conflict(&err) => {
                    tracing::debug!(node = %name, "CiliumNode changed meanwhile; re-reading");
                    latest = self
                        .api
                        .get_opt(&name)
                        .await?
                        .ok_or_else(|| StoreError::NotFound(name.clone()))?;
                }
                Err(err) => return Err(err.into()),
            }
        }
        Err(StoreError::Conflicts {
            name,
            attempts: MAX_ATTEMPTS,
        })
    }

    /// One request per attempt: POST when there is no object, else PUT of the object
    /// (spec) or of its status subresource, carrying the resourceVersion read; a 409 (or a
    /// 404: deleted meanwhile) re-reads the object and recomputes.
    async fn update<E, F>(
        &self,
        name: &str,
        part: Part,
        mut change: F,
    ) -> Result<Updated, UpdateError<E>>
    where
        E: Send,
        F: FnMut(Option<&CiliumNode>) -> Result<Option<CiliumNode>, E> + Send,
    {
        let params = PostParams::default();
        let mut current = self.api.get_opt(name).await.map_err(StoreError::from)?;
        for _ in 0..MAX_ATTEMPTS {
            let Some(desired) = change(current.as_ref()).map_err(UpdateError::Refused)? else {
                return Ok(Updated::Unchanged(current));
            };
            let desired = guarded(name, current.as_ref(), desired);
            let written = match (&current, part) {
                (None, _) => self.api.create(&params, &desired).await,
                (Some(_), Part::Spec) => self.api.replace(name, &params, &desired).await,
                (Some(_), Part::Status) => self.api.replace_status(name, &params, &desired).await,
            };
            match written {
                Ok(node) => {
                    let created = current.is_none();
                    return Ok(Updated::Written { node, created });
                }
                Err(err) if is_stale_read(&err) => {
                    tracing::debug!(node = %name, "CiliumNode changed meanwhile; re-reading");
                    current = self.api.get_opt(name).await.map_err(StoreError::from)?;
                }
                Err(err) => return Err(StoreError::from(err).into()),
            }
        }
        Err(StoreError::Conflicts {
            name: name.to_owned(),
            attempts: MAX_ATTEMPTS,
        }
        .into())
    }
}
