//! Global services of the mesh, declared through a cluster's apiserver (`Export.PutService`):
//! its pods with matching labels are the backends every other cluster merges.

use anyhow::Context as _;
use meshwork_proto::apiserver::v1 as pb;
use meshwork_proto::apiserver::v1::export_client::ExportClient;

use super::Mesh;

/// The label every pod carries, as the services' selector.
const SELECTOR: &str = "k8s:app=mesh";

impl Mesh {
    /// Declares the shared service `default/<name>` in cluster `cluster` (an index), frontend
    /// `vip:port`/TCP, its backends that cluster's pods on `port`; how many backends it has.
    pub async fn declare_global_service(
        &self,
        cluster: usize,
        name: &str,
        vip: &str,
        port: u16,
    ) -> anyhow::Result<u32> {
        let cluster = &self.clusters[cluster];
        let url = format!("http://{}", cluster.apiserver_options.grpc_addr());
        let channel = tonic::transport::Endpoint::from_shared(url)?
            .connect()
            .await
            .with_context(|| format!("connecting to {}'s apiserver", cluster.name))?;
        let service = pb::Service {
            namespace: "default".to_owned(),
            name: name.to_owned(),
            frontends: vec![vip.to_owned()],
            ports: vec![pb::NamedPort {
                name: "tcp".to_owned(),
                port: u32::from(port),
                protocol: "TCP".to_owned(),
            }],
            selector: vec![SELECTOR.to_owned()],
            shared: true,
        };
        let response = ExportClient::new(channel)
            .put_service(pb::PutServiceRequest {
                service: Some(service),
            })
            .await
            .with_context(|| format!("declaring {name} in {}", cluster.name))?;
        Ok(response.into_inner().backends)
    }
}
