//! A probe endpoint of its own (the apiserver's `--health-serve-addr`): `/healthz` answers
//! 200 while the process serves, `/readyz` 200 once it is ready and 503 (saying why) before.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::BindError;

/// A bound probe endpoint.
#[derive(Debug)]
pub struct HealthServer {
    listener: TcpListener,
    addr: SocketAddr,
}

#[derive(Clone)]
struct Readiness {
    ready: watch::Receiver<bool>,
    not_ready: &'static str,
}

impl HealthServer {
    /// Binds `addr`.
    pub async fn bind(addr: SocketAddr) -> Result<Self, BindError> {
        let (listener, addr) = crate::bind("health", addr).await?;
        Ok(Self { listener, addr })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until `shutdown` is cancelled; `/readyz` follows `ready` and says `not_ready`
    /// while it is false.
    pub fn serve(
        self,
        ready: watch::Receiver<bool>,
        not_ready: &'static str,
        shutdown: CancellationToken,
    ) -> JoinHandle<()> {
        let app = Router::new()
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/readyz", get(readyz))
            .with_state(Readiness { ready, not_ready });
        crate::spawn("health", self.listener, self.addr, app, shutdown)
    }
}

async fn readyz(State(readiness): State<Readiness>) -> (StatusCode, String) {
    if *readiness.ready.borrow() {
        (StatusCode::OK, "ready\n".to_owned())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", readiness.not_ready),
        )
    }
}
