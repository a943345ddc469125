//! kvstoremesh's status API client (`meshwork.kvstoremesh.v1`, on its --api-serve-addr),
//! with the errors an on-call engineer can act on.

use anyhow::{Context as _, anyhow};
use meshwork_proto::kvstoremesh::v1::kvstore_mesh_client::KvstoreMeshClient;
use meshwork_proto::kvstoremesh::v1::{CacheStatus, StatusRequest, StatusResponse};
use tonic::transport::{Channel, Endpoint};

use crate::client::{CALL_TIMEOUT, CONNECT_TIMEOUT, failed_call};

/// A connection to kvstoremesh's API, made on first use and again after a failed connect.
pub struct Kvstoremesh {
    addr: String,
    client: Option<KvstoreMeshClient<Channel>>,
}

impl Kvstoremesh {
    /// kvstoremesh reached at `addr` (HOST:PORT); nothing is connected yet.
    pub fn new(addr: &str) -> Self {
        Self {
            addr: addr.to_owned(),
            client: None,
        }
    }

    /// kvstoremesh's whole status.
    pub async fn status(&mut self) -> anyhow::Result<StatusResponse> {
        let client = match &mut self.client {
            Some(client) => client,
            None => {
                let channel = Endpoint::from_shared(format!("http://{}", self.addr))
                    .with_context(|| format!("--kvstoremesh {:?} is not HOST:PORT", self.addr))?
                    .connect_timeout(CONNECT_TIMEOUT)
                    .timeout(CALL_TIMEOUT)
                    .connect()
                    .await
                    .map_err(|err| self.unreachable(&err.to_string()))?;
                self.client.insert(KvstoreMeshClient::new(channel))
            }
        };
        let reply = client.status(StatusRequest {}).await.map_err(|status| {
            failed_call(
                &format!("kvstoremesh at {}", self.addr),
                "KvstoreMesh/Status",
                &status,
                "does not serve meshwork.kvstoremesh.v1.KvstoreMesh — is it kvstoremesh's --api-serve-addr?",
                |reason| self.unreachable(reason),
            )
        });
        if reply.is_err() {
            // A broken channel is made again on the next poll.
            self.client = None;
        }
        Ok(reply?.into_inner())
    }

    fn unreachable(&self, reason: &str) -> anyhow::Error {
        anyhow!(
            "cannot reach kvstoremesh at {}: {reason} — is `meshwork-apiserver kvstoremesh` running with this --api-serve-addr? (--kvstoremesh / MESHWORK_KVSTOREMESH)",
            self.addr
        )
    }
}

/// The cache's line under the remote clusters.
pub fn render_cache(cache: &CacheStatus) -> String {
    format!(
        "KVStoreMesh:   {} ({} keys cached in {}, {} write failures)\n",
        if cache.ready { "ready" } else { "not ready" },
        cache.cached_keys,
        cache.local_endpoints,
        cache.write_failures
    )
}
