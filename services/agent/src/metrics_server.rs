//! `/metrics` (Prometheus text format) and `/healthz` on `--prometheus-serve-addr`.

use std::net::SocketAddr;
use std::sync::Arc;

use actix::Addr;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use meshwork_agent_core::clustermesh::mesh::{ClusterMesh, GetMeshStatus};
use meshwork_agent_core::clustermesh::metrics::MeshMetrics;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// What the metrics endpoint reads.
pub struct MetricsState {
    /// Every registered metric.
    pub registry: Registry,
    /// Cluster mesh gauges, refreshed on each scrape.
    pub mesh_metrics: Arc<MeshMetrics>,
    /// Where the statuses come from.
    pub mesh: Addr<ClusterMesh>,
}

/// Serves until `shutdown` fires.
pub async fn serve(
    addr: SocketAddr,
    state: Arc<MetricsState>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("binding the metrics endpoint {addr}: {e}"))?;
    tracing::info!(%addr, "serving metrics");
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await?;
    Ok(())
}

/// OpenMetrics to scrapers that ask for it, the classic text format otherwise.
async fn metrics(State(state): State<Arc<MetricsState>>, headers: HeaderMap) -> impl IntoResponse {
    if let Ok(statuses) = state.mesh.send(GetMeshStatus).await {
        state.mesh_metrics.update(&statuses);
    }
    let mut body = String::new();
    if let Err(err) = prometheus_client::encoding::text::encode(&mut body, &state.registry) {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {err}\n"),
        )
            .into_response();
    }
    let openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .any(|value| value.contains("application/openmetrics-text"));
    if openmetrics {
        (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response()
    } else {
        (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            crate::metrics_format::classic_text(&body),
        )
            .into_response()
    }
}
