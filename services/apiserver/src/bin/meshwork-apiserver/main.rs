//! `meshwork-apiserver`: one per cluster, the only writer of its cluster's etcd (see
//! `--help`).

mod args;
mod kvstoremesh;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser as _;
use meshwork_apiserver::etcd_init;
use meshwork_apiserver::exporter::{self, Exporter};
use meshwork_apiserver::grpc::ExportService;
use meshwork_apiserver::metrics::ApiserverMetrics;
use meshwork_http::{HealthServer, MetricsServer};
use meshwork_kvstore::EtcdBackend;
use meshwork_proto::StandardServices;
use meshwork_proto::apiserver::v1::export_server;
use prometheus_client::registry::Registry;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use args::{Cli, CliExt as _, Command, KvstoreArgs};

/// How long etcd has to answer at start.
const ETCD_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the stop waits for the servers and for the loop's last write.
const STOP_GRACE: Duration = Duration::from_secs(5);

// kvstoremesh copies every remote's state, a few allocations per key on several threads, where
// glibc's malloc and free were a sixth of its CPU (perf of a start); the agent does the same.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
    };
    let result = match &cli.command {
        Some(Command::EtcdInit {
            cluster_name,
            kvstore,
        }) => runtime().block_on(etcd_init(cluster_name, kvstore)),
        // The remote-cluster machinery is the agent's: actors, in an actix system.
        Some(Command::Kvstoremesh(args)) => {
            actix_rt::System::with_tokio_rt(runtime).block_on(kvstoremesh::run(args))
        }
        None => runtime().block_on(run(cli)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("meshwork-apiserver: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn etcd_init(cluster: &str, kvstore: &KvstoreArgs) -> anyhow::Result<()> {
    meshwork_types::validate_cluster_name(cluster)
        .with_context(|| format!("--cluster-name {cluster:?}"))?;
    let backend = EtcdBackend::connect(&kvstore.etcd(), ETCD_CONNECT_TIMEOUT).await?;
    let done = etcd_init::init(&mut backend.client(), cluster)
        .await
        .context("creating the etcd users and roles (is the client certificate's CN root?)")?;
    for line in done {
        println!("{line}");
    }
    Ok(())
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    // Every setting and listener checked before etcd is asked anything.
    let settings = cli.settings()?;
    let addrs = cli.addrs()?;
    let tls = cli.grpc_tls()?;
    let mut terminate =
        signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let grpc_listener = tokio::net::TcpListener::bind(addrs.grpc)
        .await
        .with_context(|| format!("binding the gRPC endpoint {}", addrs.grpc))?;
    let health = HealthServer::bind(addrs.health).await?;
    let metrics_server = match addrs.metrics {
        Some(addr) => Some(MetricsServer::bind(addr).await?),
        None => None,
    };
    // The error names the endpoints and the cause (TLS file, handshake, timeout).
    let backend = EtcdBackend::connect(&cli.kvstore.etcd(), ETCD_CONNECT_TIMEOUT).await?;

    let mut registry = Registry::with_prefix("meshwork");
    let metrics = ApiserverMetrics::register(&mut registry);
    let (exporter_loop, commands, ready) = Exporter::start(backend, settings, metrics.clone())
        .await
        .context("adopting what is in etcd")?;
    let exporter_loop = tokio::spawn(exporter_loop.run());

    let (standard, readiness) = StandardServices::new(&[export_server::SERVICE_NAME]).await;
    let health_ready = readiness.clone();
    let mut canaries = ready.clone();
    tokio::spawn(async move {
        if canaries.wait_for(|written| *written).await.is_ok() {
            health_ready.ready().await;
        }
    });
    let stop = CancellationToken::new();
    let mut export = ExportService::new(commands.clone(), metrics);
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        if tls.client_auth {
            export = export.node_is_cn();
        }
        server = server.tls_config(tls.config).context(
            "the gRPC endpoint's TLS (--grpc-cert-file, --grpc-key-file, --grpc-ca-file)",
        )?;
    }
    let router = server.add_service(export.into_server());
    let grpc = tokio::spawn(standard.add_to(router).serve_with_incoming_shutdown(
        tokio_stream::wrappers::TcpListenerStream::new(grpc_listener),
        stop.clone().cancelled_owned(),
    ));
    let mut servers =
        vec![health.serve(ready, "the sync canaries are not written yet", stop.clone())];
    if let Some(server) = metrics_server {
        servers.push(server.serve(registry, None, stop.clone()));
    }
    tracing::info!(cluster = ?cli.cluster_name, grpc = %addrs.grpc, "meshwork-apiserver running");

    tokio::select! {
        _ = terminate.recv() => tracing::info!("SIGTERM: stopping"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
    }
    readiness.shutting_down().await;
    stop.cancel();
    // Publishing sessions are streams that never end on their own: the server gets a grace.
    if tokio::time::timeout(STOP_GRACE, grpc).await.is_err() {
        tracing::info!("publishing sessions still open; closing them");
    }
    let (stopped, done) = tokio::sync::oneshot::channel();
    if commands
        .send(exporter::Command::Stop(stopped))
        .await
        .is_ok()
    {
        let _ = tokio::time::timeout(STOP_GRACE, done).await;
    }
    exporter_loop.abort();
    for server in servers {
        let _ = tokio::time::timeout(STOP_GRACE, server).await;
    }
    tracing::info!("meshwork-apiserver stopped; nothing deleted");
    Ok(())
}
