//! The node agent's local API (its unix socket), as `meshctl` speaks it.

use std::path::Path;

use anyhow::Context as _;
use meshwork_proto::agent::v1 as pb;
use meshwork_proto::agent::v1::agent_client::AgentClient;
use meshwork_proto::agent::v1::datapath_client::DatapathClient;
use meshwork_proto::agent::v1::encrypt_client::EncryptClient;
use meshwork_proto::agent::v1::ipam_client::IpamClient;

/// The agent's API socket on a node (its `--state-dir` is `/run/meshwork`).
pub const SOCKET: &str = "/run/meshwork/agent.sock";

/// Runs `future` on a current-thread runtime of its own.
pub fn block_on<T>(future: impl Future<Output = T>) -> anyhow::Result<T> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    Ok(runtime.block_on(future))
}

/// The agent's status.
pub async fn status(socket: &Path) -> anyhow::Result<pb::StatusResponse> {
    let channel = meshwork_proto::connect_unix(socket).await?;
    Ok(AgentClient::new(channel)
        .status(pb::StatusRequest {})
        .await?
        .into_inner())
}

/// The agent's endpoints.
pub async fn endpoints(socket: &Path) -> anyhow::Result<Vec<pb::EndpointStatus>> {
    let channel = meshwork_proto::connect_unix(socket).await?;
    Ok(DatapathClient::new(channel)
        .list_endpoints(pb::ListEndpointsRequest {})
        .await?
        .into_inner()
        .endpoints)
}

/// Creates or replaces an endpoint; answered once its program is attached.
pub async fn put_endpoint(socket: &Path, endpoint: pb::Endpoint) -> anyhow::Result<()> {
    let channel = meshwork_proto::connect_unix(socket).await?;
    DatapathClient::new(channel)
        .put_endpoint(pb::PutEndpointRequest {
            endpoint: Some(endpoint),
        })
        .await
        .context("Datapath/PutEndpoint")?;
    Ok(())
}

/// The agent's IPAM allocations (with `--ipam`).
pub async fn ipam_allocations(socket: &Path) -> anyhow::Result<Vec<pb::IpAllocation>> {
    let channel = meshwork_proto::connect_unix(socket).await?;
    Ok(IpamClient::new(channel)
        .status(pb::IpamStatusRequest {})
        .await?
        .into_inner()
        .allocations)
}

/// `meshwork-devnode status`: one JSON line of what the checks read — remote clusters
/// ready of total, the endpoint programs' drops, ipcache entries, endpoints, WireGuard
/// peers (and how many have handshaken).
pub fn print_status() -> anyhow::Result<()> {
    block_on(async {
        let socket = Path::new(SOCKET);
        let status = status(socket).await?;
        let mesh = status.clustermesh.unwrap_or_default();
        let datapath = status.datapath.unwrap_or_default();
        let channel = meshwork_proto::connect_unix(socket).await?;
        let encrypt = EncryptClient::new(channel)
            .status(pb::EncryptStatusRequest {})
            .await
            .map(tonic::Response::into_inner)
            .ok();
        let peers = encrypt.as_ref().map_or(0, |e| e.peers.len());
        let handshaken = encrypt.as_ref().map_or(0, |e| {
            e.peers.iter().filter(|p| p.last_handshake_unix > 0).count()
        });
        println!(
            "{}",
            serde_json::json!({
                "ready": mesh.ready,
                "total": mesh.total,
                "drops": datapath.drops.iter().map(|d| d.count).sum::<u64>(),
                "ipcache_entries": datapath.ipcache_entries,
                "endpoints": datapath.endpoints,
                "endpoints_ready": datapath.endpoints_ready,
                "wireguard_peers": peers,
                "wireguard_handshaken": handshaken,
            })
        );
        Ok(())
    })?
}
