//! `meshwork-apiserver kvstoremesh`: its flags (Cilium's kvstoremesh names) and its run.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;
use meshwork_clustermesh::mesh::refresh_metrics;
use meshwork_clustermesh::remote_cluster::heartbeat::HeartbeatArgs;
use meshwork_http::{HealthServer, MetricsServer, Refresh};
use meshwork_kvstore::EtcdBackend;
use meshwork_kvstoremesh::service::{KvstoreMesh, Settings};
use meshwork_proto::StandardServices;
use meshwork_proto::kvstoremesh::v1::kvstore_mesh_server;
use meshwork_types::{validate_cluster_id, validate_cluster_name, validate_max_connected_clusters};
use prometheus_client::registry::Registry;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::args::{KvstoreArgs, addr};

/// How long the local etcd has to answer at start.
const ETCD_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the stop waits for the last cache writes.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The flags of `kvstoremesh`.
#[derive(Debug, Args)]
pub struct KvstoremeshArgs {
    /// Name of this cluster (a remote of the same name is refused).
    #[arg(long, env = "MESHWORK_CLUSTER_NAME")]
    pub cluster_name: String,
    /// This cluster's ID, 1..=--max-connected-clusters (no remote may use it).
    #[arg(long, env = "MESHWORK_CLUSTER_ID")]
    pub cluster_id: u32,
    /// Clusters a mesh may hold: 255 or 511.
    #[arg(long, default_value_t = 255)]
    pub max_connected_clusters: u32,
    /// The clustermesh config directory: one file per remote cluster, named after it, in the
    /// agent's format (endpoints, TLS files).
    #[arg(long, value_name = "DIR")]
    pub clustermesh_config: PathBuf,
    /// This cluster's etcd, where the cache is written.
    #[command(flatten)]
    pub kvstore: KvstoreArgs,
    /// TTL of the leases the cache is written under.
    #[arg(long, default_value = "15m", value_parser = humantime::parse_duration)]
    pub kvstore_lease_ttl: Duration,
    /// A remote that does not connect within this after start is not waited for.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub per_cluster_ready_timeout: Duration,
    /// Ready after this regardless of the remotes.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub global_ready_timeout: Duration,
    /// How long a removed remote's entries stay after its cached config was deleted, so the
    /// agents reading it disconnect first.
    #[arg(long, default_value = "3m", value_parser = humantime::parse_duration)]
    pub cache_removal_grace: Duration,
    /// Where `/healthz` and `/readyz` (200 once every remote known at start is cached) are
    /// served.
    #[arg(long, default_value = "127.0.0.1:9881", value_name = "ADDR")]
    pub health_serve_addr: String,
    /// Where the status API (gRPC `meshwork.kvstoremesh.v1.KvstoreMesh`, with health and
    /// reflection) is served, for `meshctl --kvstoremesh ADDR status`; Cilium's kvstoremesh
    /// API port.
    #[arg(long, default_value = "127.0.0.1:9889", value_name = "ADDR")]
    pub api_serve_addr: String,
    /// Where `/metrics` (`meshwork_kvstoremesh_*`) is served; empty disables it.
    #[arg(long, default_value = "127.0.0.1:9965", value_name = "ADDR")]
    pub prometheus_serve_addr: String,

    /// The remotes' heartbeat.
    #[command(flatten)]
    pub heartbeat: HeartbeatArgs,
}

impl KvstoremeshArgs {
    fn settings(&self) -> anyhow::Result<Settings> {
        validate_cluster_name(&self.cluster_name)
            .with_context(|| format!("--cluster-name {:?}", self.cluster_name))?;
        validate_max_connected_clusters(self.max_connected_clusters)
            .context("--max-connected-clusters")?;
        validate_cluster_id(self.cluster_id, self.max_connected_clusters)
            .with_context(|| format!("--cluster-id {}", self.cluster_id))?;
        if self.kvstore_lease_ttl < Duration::from_secs(10) {
            bail!("--kvstore-lease-ttl must be at least 10s");
        }
        Ok(Settings {
            max_connected_clusters: self.max_connected_clusters,
            lease_ttl: self.kvstore_lease_ttl,
            per_cluster_ready_timeout: self.per_cluster_ready_timeout,
            global_ready_timeout: self.global_ready_timeout,
            removal_grace: self.cache_removal_grace,
            heartbeat: self.heartbeat.settings(),
            ..Settings::new(
                &self.cluster_name,
                self.cluster_id,
                &self.clustermesh_config,
            )
        })
    }
}

/// Runs kvstoremesh until SIGTERM; needs an actix system.
pub async fn run(args: &KvstoremeshArgs) -> anyhow::Result<()> {
    let settings = args.settings()?;
    let health_addr = addr("--health-serve-addr", &args.health_serve_addr)?;
    let api_addr = addr("--api-serve-addr", &args.api_serve_addr)?;
    let metrics_addr = (!args.prometheus_serve_addr.is_empty())
        .then(|| addr("--prometheus-serve-addr", &args.prometheus_serve_addr))
        .transpose()?;
    let mut terminate =
        signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let health = HealthServer::bind(health_addr).await?;
    let api_listener = tokio::net::TcpListener::bind(api_addr)
        .await
        .with_context(|| format!("binding --api-serve-addr {api_addr}"))?;
    let metrics_server = match metrics_addr {
        Some(addr) => Some(MetricsServer::bind(addr).await?),
        None => None,
    };
    let backend = EtcdBackend::connect(&args.kvstore.etcd(), ETCD_CONNECT_TIMEOUT).await?;
    let mut registry = Registry::with_prefix("meshwork");
    let kvstoremesh = KvstoreMesh::start(backend, settings, &mut registry)
        .await
        .context("starting kvstoremesh")?;

    let stop = CancellationToken::new();
    let mut servers = vec![health.serve(
        kvstoremesh.ready(),
        "the remote clusters are not cached yet",
        stop.clone(),
    )];
    if let Some(server) = metrics_server {
        let refresh: Refresh = Arc::new(refresh_metrics(
            kvstoremesh.mesh(),
            kvstoremesh.mesh_metrics(),
        ));
        servers.push(server.serve(registry, Some(refresh), stop.clone()));
    }
    let (standard, readiness) = StandardServices::new(&[kvstore_mesh_server::SERVICE_NAME]).await;
    let (health_ready, mut cached) = (readiness.clone(), kvstoremesh.ready());
    tokio::spawn(async move {
        if cached.wait_for(|ready| *ready).await.is_ok() {
            health_ready.ready().await;
        }
    });
    let router = tonic::transport::Server::builder().add_service(
        kvstoremesh
            .status_api(args.kvstore.kvstore_endpoints.join(","))
            .into_server(),
    );
    let api = tokio::spawn(standard.add_to(router).serve_with_incoming_shutdown(
        tokio_stream::wrappers::TcpListenerStream::new(api_listener),
        stop.clone().cancelled_owned(),
    ));
    tracing::info!(cluster = %args.cluster_name, health = %health_addr, api = %api_addr, "meshwork-apiserver kvstoremesh running");
    tokio::select! {
        _ = terminate.recv() => tracing::info!("SIGTERM: stopping"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
    }
    readiness.shutting_down().await;
    stop.cancel();
    if tokio::time::timeout(STOP_GRACE, kvstoremesh.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("the last cache writes did not finish in time");
    }
    let _ = tokio::time::timeout(STOP_GRACE, api).await;
    for server in servers {
        let _ = tokio::time::timeout(STOP_GRACE, server).await;
    }
    tracing::info!("kvstoremesh stopped; the cache is kept for the next start");
    Ok(())
}
