//! kvstoremesh's status API (`meshwork.kvstoremesh.v1.KvstoreMesh`), which
//! `meshctl --kvstoremesh ADDR status` reads.

use actix::Addr;
use meshwork_clustermesh::mesh::{ClusterMesh, GetMeshStatus};
use meshwork_clustermesh::status_api::mesh_status;
use meshwork_proto::kvstoremesh::v1 as pb;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::metrics::CacheMetrics;
use crate::stores::CacheStores;

/// Serves the status from the mesh of remotes and the cache writer's metrics.
pub struct StatusApi {
    pub(crate) mesh: Addr<ClusterMesh<CacheStores>>,
    pub(crate) ready: watch::Receiver<bool>,
    pub(crate) metrics: CacheMetrics,
    pub(crate) local_endpoints: String,
    /// `--clustermesh-config`, absolute.
    pub(crate) config_dir: String,
}

impl StatusApi {
    /// The tonic service to add to a router.
    pub fn into_server(self) -> pb::kvstore_mesh_server::KvstoreMeshServer<Self> {
        pb::kvstore_mesh_server::KvstoreMeshServer::new(self)
    }
}

#[tonic::async_trait]
impl pb::kvstore_mesh_server::KvstoreMesh for StatusApi {
    async fn status(
        &self,
        _: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let statuses = self
            .mesh
            .send(GetMeshStatus)
            .await
            .map_err(|_| Status::unavailable("kvstoremesh is shutting down"))?;
        let mut clustermesh = mesh_status(&statuses);
        clustermesh.config_dir.clone_from(&self.config_dir);
        Ok(Response::new(pb::StatusResponse {
            clustermesh: Some(clustermesh),
            cache: Some(pb::CacheStatus {
                ready: *self.ready.borrow(),
                cached_keys: u64::try_from(self.metrics.cached_keys.get()).unwrap_or(0),
                write_failures: self.metrics.write_failures.get(),
                local_endpoints: self.local_endpoints.clone(),
            }),
        }))
    }
}
