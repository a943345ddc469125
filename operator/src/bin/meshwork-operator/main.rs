//! `meshwork-operator`: Meshwork's AWS ENI IPAM operator.
//!
//! Without a subcommand it runs the operator (see `--help`); `crd` prints the CiliumNode
//! CustomResourceDefinition generated from the Rust type, so the schema served to
//! Kubernetes can never drift from the code.

mod args;
mod leadership;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use meshwork_http::MetricsServer;
use meshwork_kvstore::{EtcdBackend, KvstoreMetrics, WatchStoreOptions};
use meshwork_operator::cilium_node;
use meshwork_operator::ec2::{Ec2, Ec2Config, Ec2Metrics, SubnetFilter};
use meshwork_operator::grpc::NodeIpamService;
use meshwork_operator::grpc::tls::TlsFiles;
use meshwork_operator::instances::shared;
use meshwork_operator::manager::{
    self, InstancesConfig, LimitsCache, ManagerConfig, PassDeps, ReleaseConfig, ResyncFilter, watch,
};
use meshwork_operator::node_store::{EtcdStore, KubeStore, NodeStore};
use meshwork_proto::ipam::v1::node_ipam_server;
use meshwork_proto::{Readiness, StandardServices};
use prometheus_client::registry::Registry;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use args::{Cli, Command, RunArgs, RunArgsExt as _, StoreChoice};
use leadership::Leadership;

/// How long etcd has to answer at start.
const ETCD_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(Command::Crd) = cli.command {
        let yaml = cilium_node::crd_yaml().context("encoding the CRD")?;
        std::io::stdout()
            .lock()
            .write_all(yaml.as_bytes())
            .context("writing the CRD")?;
        return Ok(());
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let run = cli.run;
    // Check the settings before starting anything.
    let store = run.store()?;
    let region = run.region()?;
    let addrs = Addrs {
        metrics: run.metrics_addr()?,
        grpc: run.grpc_addr()?,
    };
    let tls = run.grpc_tls()?;
    if matches!(store, StoreChoice::Kube(_)) {
        run.leader_election.timing().validate()?;
    }
    actix_rt::System::with_tokio_rt(|| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
    .block_on(operate(run, store, region, addrs, tls))
}

/// Where the operator serves.
struct Addrs {
    metrics: Option<SocketAddr>,
    grpc: Option<SocketAddr>,
}

/// What the gRPC endpoint serves with, besides its listener.
struct GrpcSettings {
    tls: Option<TlsFiles>,
    /// `--test-hook-inconsistent-snapshot`.
    test_hook: Option<String>,
    /// Ends the server and, first, every `WatchNode` stream (graceful shutdown waits for
    /// them, and a watch never ends by itself).
    stop: CancellationToken,
}

async fn operate(
    run: RunArgs,
    store: StoreChoice,
    region: String,
    addrs: Addrs,
    tls: Option<TlsFiles>,
) -> anyhow::Result<()> {
    let mut registry = Registry::with_prefix("meshwork");
    let metrics = Ec2Metrics::register(&mut registry);
    let mut config = Ec2Config::new(region);
    config.qps = run.limit_ipam_api_qps;
    config.burst = run.limit_ipam_api_burst;
    config.endpoint.clone_from(&run.ec2_endpoint);
    let ec2 = Ec2::connect(&config, metrics)
        .await
        .context("setting up EC2")?;
    let mut terminate = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    // Bound before anything starts, so a taken port fails the start (address and OS error).
    let metrics_server = match addrs.metrics {
        Some(addr) => Some(MetricsServer::bind(addr).await?),
        None => None,
    };
    // In Kubernetes the gRPC port is bound only once this replica leads: a standby refuses
    // connections at once, so an agent's retry reaches the leader behind the Service.
    let grpc_listener = match (&store, addrs.grpc) {
        (StoreChoice::Etcd(_), Some(addr)) => Some(bind_grpc(addr).await?),
        _ => None,
    };
    let kvstore_metrics =
        matches!(store, StoreChoice::Etcd(_)).then(|| KvstoreMetrics::register(&mut registry));
    // Served from the start (a standby's /healthz answers too), with every metric registered.
    let stop_http = CancellationToken::new();
    let server = metrics_server.map(|server| server.serve(registry, None, stop_http.clone()));

    let settings = GrpcSettings {
        tls,
        test_hook: run.test_hook_inconsistent_snapshot.clone(),
        stop: CancellationToken::new(),
    };
    let mut leadership = None;
    let grpc = match store {
        StoreChoice::Etcd(config) => {
            // The error names the endpoints and the cause (TLS file, handshake, timeout).
            let backend = EtcdBackend::connect(&config, ETCD_CONNECT_TIMEOUT).await?;
            let options = WatchStoreOptions {
                metrics: kvstore_metrics.unwrap_or_default(),
                ..WatchStoreOptions::new(run.cluster_name.clone())
            };
            let store = EtcdStore::new(backend.clone());
            let operator = start(&run, ec2.clone(), store.clone());
            let grpc = match grpc_listener {
                Some(listener) => {
                    Some(serve_grpc(listener, &operator, store, ec2, &settings).await?)
                }
                None => None,
            };
            tokio::spawn(watch::watch_etcd(
                backend,
                operator.nodes.recipient(),
                options,
            ));
            tracing::info!(endpoints = ?config.endpoints, tls = config.uses_tls(),
                "watching CiliumNodes in etcd");
            grpc
        }
        StoreChoice::Kube(kubeconfig) => {
            let client = kube_client(kubeconfig).await?;
            let mut election = Leadership::start(&client, &run.leader_election);
            tokio::select! {
                leading = election.leading() => leading?,
                _ = terminate.recv() => return stop_standby(election, stop_http, server).await,
                _ = interrupt.recv() => return stop_standby(election, stop_http, server).await,
            }
            tracing::info!("leading: starting the allocator");
            let store = KubeStore::new(client.clone());
            let operator = start(&run, ec2.clone(), store.clone());
            let grpc = match addrs.grpc {
                Some(addr) => {
                    let listener = bind_grpc(addr).await?;
                    Some(serve_grpc(listener, &operator, store, ec2, &settings).await?)
                }
                None => None,
            };
            tokio::spawn(watch::watch_kube(
                kube::Api::all(client),
                operator.nodes.recipient(),
            ));
            tracing::info!("watching CiliumNodes in Kubernetes");
            leadership = Some(election);
            grpc
        }
    };

    tokio::select! {
        _ = terminate.recv() => tracing::info!("SIGTERM: stopping"),
        _ = interrupt.recv() => tracing::info!("SIGINT: stopping"),
        () = lost(leadership.as_mut()) => {
            // As Cilium's operator: exit at once, every pass and stream dropped with the
            // runtime, well before another replica may take over (a lease duration after
            // the last renewal, the renew deadline having passed already).
            bail!("leader election lost: another replica may lead now; exiting to campaign again");
        }
    }
    // Passes in flight are dropped: an ENI created but not yet attached is collected by the
    // next operator's GC (it carries the cluster's tags).
    if let Some((_, readiness)) = &grpc {
        readiness.shutting_down().await;
    }
    stop_http.cancel();
    settings.stop.cancel();
    if let Some((grpc, _)) = grpc {
        match tokio::time::timeout(Duration::from_secs(5), grpc).await {
            Ok(Ok(result)) => result.context("serving gRPC")?,
            Ok(Err(err)) => tracing::warn!(%err, "gRPC server task failed"),
            Err(_) => tracing::warn!("gRPC server did not stop in time"),
        }
    }
    if let Some(server) = server {
        match tokio::time::timeout(Duration::from_secs(5), server).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!(%err, "metrics server task failed"),
            Err(_) => tracing::warn!("metrics server did not stop in time"),
        }
    }
    // Given up only now, so the next leader never overlaps this one's last writes.
    if let Some(election) = leadership {
        election.stop().await;
    }
    actix::System::current().stop();
    Ok(())
}

/// Binds the gRPC endpoint.
async fn bind_grpc(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the gRPC endpoint {addr}"))
}

/// Resolves when leadership is lost; never without an election.
async fn lost(leadership: Option<&mut Leadership>) {
    match leadership {
        Some(leadership) => leadership.lost().await,
        None => std::future::pending().await,
    }
}

/// A signal before this replica led: stop campaigning and the metrics server, exit 0.
async fn stop_standby(
    election: Leadership,
    stop_http: CancellationToken,
    server: Option<tokio::task::JoinHandle<()>>,
) -> anyhow::Result<()> {
    tracing::info!("signal: stopping before leading");
    election.stop().await;
    stop_http.cancel();
    if let Some(server) = server {
        let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    }
    actix::System::current().stop();
    Ok(())
}

/// Starts serving `NodeIpam` (with health and reflection) on `listener`; returns the
/// server's task and its health.
async fn serve_grpc<S: NodeStore + Clone + Unpin + 'static>(
    listener: tokio::net::TcpListener,
    operator: &manager::Operator<S>,
    store: S,
    ec2: Ec2,
    settings: &GrpcSettings,
) -> anyhow::Result<(
    tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    Readiness,
)> {
    let (standard, health) = StandardServices::new(&[node_ipam_server::SERVICE_NAME]).await;
    tokio::spawn(ready_when(operator.ready.clone(), health.clone()));
    let mut service =
        NodeIpamService::new(&operator.nodes, store, ec2).stop_on(settings.stop.clone());
    if let Some(node) = &settings.test_hook {
        tracing::warn!(%node, "test hook armed: an inconsistent snapshot will be sent once");
        service = service.test_hook_inconsistent_snapshot(node.clone());
    }
    let mut server = tonic::transport::Server::builder();
    let mode = match &settings.tls {
        Some(tls) => {
            if tls.node_is_cn() {
                service = service.node_is_cn();
            }
            server = server.tls_config(tls.server_config()).context(
                "the gRPC endpoint's TLS (--grpc-tls-cert, --grpc-tls-key, --grpc-tls-client-ca)",
            )?;
            if tls.node_is_cn() { "mTLS" } else { "TLS" }
        }
        None => "plaintext",
    };
    tracing::info!(addr = ?listener.local_addr().ok(), mode, "serving meshwork.ipam.v1.NodeIpam");
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let router = server.add_service(service.into_server());
    let stop = settings.stop.clone();
    let task = tokio::spawn(
        standard
            .add_to(router)
            .serve_with_incoming_shutdown(incoming, stop.cancelled_owned()),
    );
    Ok((task, health))
}

/// Reports the operator ready (gRPC health `SERVING`) once `ready` turns true.
async fn ready_when(mut ready: tokio::sync::watch::Receiver<bool>, readiness: Readiness) {
    if ready.wait_for(|ready| *ready).await.is_ok() {
        readiness.ready().await;
        tracing::info!(
            "operator ready: CiliumNodes listed and EC2 described (gRPC health SERVING)"
        );
    }
}

fn start<S: NodeStore + Clone + Unpin + 'static>(
    run: &RunArgs,
    ec2: Ec2,
    store: S,
) -> manager::Operator<S> {
    let eni_tags = run.effective_eni_tags();
    let deps = PassDeps {
        ec2,
        cache: shared(),
        limits: Arc::new(LimitsCache::new(run.limit_overrides())),
        store,
        release: ReleaseConfig {
            enabled: run.aws_release_excess_ips,
            delay: run.release_delay(),
        },
    };
    let config = ManagerConfig {
        eni_tags: eni_tags.clone(),
        prefix_delegation: run.aws_enable_prefix_delegation,
        workers: run.parallel_alloc_workers,
    };
    let instances = InstancesConfig {
        filter: ResyncFilter {
            subnets: SubnetFilter {
                ids: run.subnet_ids_filter.clone(),
                tags: run.subnet_tags_filter.clone(),
            },
            instance_tags: run.instance_tags_filter.clone(),
        },
        eni_tags,
        gc_interval: Duration::from_secs(run.eni_gc_interval),
        ..InstancesConfig::default()
    };
    manager::start(deps, &config, instances)
}

async fn kube_client(kubeconfig: Option<std::path::PathBuf>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .context("loading the kubeconfig")?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig and not in a cluster")?,
    };
    kube::Client::try_from(config).context("building the Kubernetes client")
}
