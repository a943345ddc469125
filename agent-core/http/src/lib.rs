//! The HTTP endpoint of every Meshwork process (`--prometheus-serve-addr`): `/metrics` in the
//! classic Prometheus text format (0.0.4), or OpenMetrics to scrapers that ask for it, and
//! `/healthz`.
//!
//! [`MetricsServer::bind`] binds at once, so a taken port fails the process at start with the
//! address and the OS error; [`MetricsServer::serve`] serves until its token is cancelled.
//! [`HealthServer`] is the same for a separate probe port (`/healthz`, `/readyz`).

mod classic;
mod health;

pub use health::HealthServer;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use futures::future::BoxFuture;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use classic::classic_text;

/// An endpoint could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("binding the {endpoint} endpoint {addr}: {error}")]
pub struct BindError {
    /// Which endpoint (`metrics`, `health`).
    pub endpoint: &'static str,
    /// The address.
    pub addr: SocketAddr,
    /// The OS error.
    pub error: io::Error,
}

/// Runs before every scrape (gauges refreshed from a status snapshot).
pub type Refresh = Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

/// A bound metrics endpoint.
#[derive(Debug)]
pub struct MetricsServer {
    listener: TcpListener,
    addr: SocketAddr,
}

struct Scrape {
    registry: Registry,
    refresh: Option<Refresh>,
}

impl MetricsServer {
    /// Binds `addr`.
    pub async fn bind(addr: SocketAddr) -> Result<Self, BindError> {
        let (listener, addr) = bind("metrics", addr).await?;
        Ok(Self { listener, addr })
    }

    /// The bound address (the port picked, if 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves `registry` (after `refresh`, when given) until `shutdown` is cancelled.
    pub fn serve(
        self,
        registry: Registry,
        refresh: Option<Refresh>,
        shutdown: CancellationToken,
    ) -> JoinHandle<()> {
        let app = Router::new()
            .route("/metrics", get(metrics))
            .route("/healthz", get(|| async { "ok\n" }))
            .with_state(Arc::new(Scrape { registry, refresh }));
        spawn("metrics", self.listener, self.addr, app, shutdown)
    }
}

/// Binds the `endpoint` at `addr`; returns the listener and its address (the port picked,
/// if 0 was asked for).
async fn bind(
    endpoint: &'static str,
    addr: SocketAddr,
) -> Result<(TcpListener, SocketAddr), BindError> {
    let listener = TcpListener::bind(addr).await.map_err(|source| BindError {
        endpoint,
        addr,
        error: source,
    })?;
    let addr = listener.local_addr().unwrap_or(addr);
    Ok((listener, addr))
}

/// Serves `app` on `listener` until `shutdown` is cancelled.
fn spawn(
    endpoint: &'static str,
    listener: TcpListener,
    addr: SocketAddr,
    app: Router,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    tracing::info!(%addr, "serving the {endpoint} endpoint");
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await;
        if let Err(err) = served {
            tracing::error!(%addr, %err, "the {endpoint} endpoint failed");
        }
    })
}

/// OpenMetrics to scrapers that ask for it, the classic text format otherwise.
async fn metrics(State(scrape): State<Arc<Scrape>>, headers: HeaderMap) -> impl IntoResponse {
    if let Some(refresh) = &scrape.refresh {
        refresh().await;
    }
    let mut body = String::new();
    if let Err(err) = prometheus_client::encoding::text::encode(&mut body, &scrape.registry) {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {err}\n"),
        )
            .into_response();
    }
    if wants_openmetrics(&headers) {
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
            classic_text(&body),
        )
            .into_response()
    }
}

fn wants_openmetrics(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .any(|value| value.contains("application/openmetrics-text"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prometheus_client::metrics::counter::Counter;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    async fn get(addr: SocketAddr, accept: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!(
            "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        tokio::time::timeout(
            Duration::from_secs(10),
            stream.read_to_string(&mut response),
        )
        .await
        .expect("an answer")
        .unwrap();
        response
    }

    #[tokio::test]
    async fn classic_text_unless_openmetrics_is_asked_for_and_a_taken_port_is_an_error() {
        let mut registry = Registry::with_prefix("m");
        let counter = Counter::<u64>::default();
        registry.register("rejected", "Rejected.", counter.clone());
        counter.inc();
        let server = MetricsServer::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let addr = server.local_addr();
        let taken = MetricsServer::bind(addr).await.unwrap_err();
        assert!(
            taken
                .to_string()
                .starts_with(&format!("binding the metrics endpoint {addr}: ")),
            "{taken}"
        );
        assert_eq!(taken.error.kind(), io::ErrorKind::AddrInUse);
        let stop = CancellationToken::new();
        let served = server.serve(registry, None, stop.clone());

        let classic = get(addr, "text/plain").await;
        assert!(classic.contains("text/plain; version=0.0.4"), "{classic}");
        assert!(
            classic.contains("# TYPE m_rejected_total counter"),
            "{classic}"
        );
        assert!(!classic.contains("# EOF"), "{classic}");
        let open = get(addr, "application/openmetrics-text; version=1.0.0").await;
        assert!(open.contains("application/openmetrics-text"), "{open}");
        assert!(open.contains("# TYPE m_rejected counter"), "{open}");
        assert!(open.contains("# EOF"), "{open}");

        stop.cancel();
        tokio::time::timeout(Duration::from_secs(5), served)
            .await
            .expect("the server stops when cancelled")
            .unwrap();
    }
}
