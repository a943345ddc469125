//! `meshwork-apiserver kvstoremesh`: its run (its flags are the library's
//! [`KvstoremeshArgs`]).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use meshwork_clustermesh::mesh::refresh_metrics;
use meshwork_http::{HealthServer, MetricsServer, Refresh};
use meshwork_kvstore::EtcdBackend;
use meshwork_kvstoremesh::service::{KvstoreMesh, Settings};
use meshwork_proto::StandardServices;
use meshwork_proto::kvstoremesh::v1::kvstore_mesh_server;
use meshwork_types::{validate_cluster_id, validate_cluster_name, validate_max_connected_clusters};
use prometheus_client::registry::Registry;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use meshwork_apiserver::cli::KvstoremeshArgs;

use crate::args::addr;

/// How long the local etcd has to answer at start.
const ETCD_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the stop waits for the last cache writes.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The settings of `args`, checked (errors name the flag).
fn settings(args: &KvstoremeshArgs) -> anyhow::Result<Settings> {
    validate_cluster_name(&args.cluster_name)
        .with_context(|| format!("--cluster-name {:?}", args.cluster_name))?;
    validate_max_connected_clusters(args.max_connected_clusters)
        .context("--max-connected-clusters")?;
    validate_cluster_id(args.cluster_id, args.max_connected_clusters)
        .with_context(|| format!("--cluster-id {}", args.cluster_id))?;
    if args.kvstore_lease_ttl < Duration::from_secs(10) {
        bail!("--kvstore-lease-ttl must be at least 10s");
    }
    Ok(Settings {
        max_connected_clusters: args.max_connected_clusters,
        lease_ttl: args.kvstore_lease_ttl,
        per_cluster_ready_timeout: args.per_cluster_ready_timeout,
        global_ready_timeout: args.global_ready_timeout,
        removal_grace: args.cache_removal_grace,
        heartbeat: args.heartbeat.settings(),
        ..Settings::new(
            &args.cluster_name,
            args.cluster_id,
            &args.clustermesh_config,
        )
    })
}

/// Runs kvstoremesh until SIGTERM; needs an actix system.
pub async fn run(args: &KvstoremeshArgs) -> anyhow::Result<()> {
    let settings = settings(args)?;
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
