//! `meshwork-operator`: Meshwork's AWS ENI IPAM operator.
//!
//! Without a subcommand it runs the operator (see `--help`); `crd` prints the CiliumNode
//! CustomResourceDefinition generated from the Rust type, so the schema served to
//! Kubernetes can never drift from the code.

mod args;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use kube::CustomResourceExt;
use meshwork_http::MetricsServer;
use meshwork_kvstore::{EtcdBackend, KvstoreMetrics, WatchStoreOptions};
use meshwork_operator::cilium_node::CiliumNode;
use meshwork_operator::ec2::{Ec2, Ec2Config, Ec2Metrics, SubnetFilter};
use meshwork_operator::grpc::NodeIpamService;
use meshwork_operator::instances::shared;
use meshwork_operator::manager::{
    self, GetSnapshot, InstancesConfig, LimitsCache, ManagerConfig, PassDeps, ReleaseConfig,
    ResyncFilter, watch,
};
use meshwork_operator::node_store::{EtcdStore, KubeStore, NodeStore};
use meshwork_proto::operator::v1::node_ipam_server;
use meshwork_proto::{Readiness, StandardServices};
use prometheus_client::registry::Registry;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use args::{Cli, Command, RunArgs, StoreChoice};

/// How long etcd has to answer at start.
const ETCD_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(Command::Crd) = cli.command {
        let yaml = yaml_serde::to_string(&CiliumNode::crd()).context("encoding the CRD")?;
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
    actix_rt::System::with_tokio_rt(|| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
    .block_on(operate(run, store, region, addrs))
}

/// Where the operator serves.
struct Addrs {
    metrics: Option<SocketAddr>,
    grpc: Option<SocketAddr>,
}

async fn operate(
    run: RunArgs,
    store: StoreChoice,
    region: String,
    addrs: Addrs,
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
    let grpc_listener = match addrs.grpc {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding the gRPC endpoint {addr}"))?,
        ),
        None => None,
    };

    let snapshots: actix::Recipient<GetSnapshot>;
    let ready: tokio::sync::watch::Receiver<bool>;
    match store {
        StoreChoice::Etcd(config) => {
            // The error names the endpoints and the cause (TLS file, handshake, timeout).
            let backend = EtcdBackend::connect(&config, ETCD_CONNECT_TIMEOUT).await?;
            let options = WatchStoreOptions {
                metrics: KvstoreMetrics::register(&mut registry),
                ..WatchStoreOptions::new(run.cluster_name.clone())
            };
            let operator = start(&run, ec2, EtcdStore::new(backend.clone()));
            snapshots = operator.nodes.clone().recipient();
            ready = operator.ready;
            tokio::spawn(watch::watch_etcd(
                backend,
                operator.nodes.recipient(),
                options,
            ));
            tracing::info!(endpoints = ?config.endpoints, tls = config.uses_tls(),
                "watching CiliumNodes in etcd");
        }
        StoreChoice::Kube(kubeconfig) => {
            let client = kube_client(kubeconfig).await?;
            let operator = start(&run, ec2, KubeStore::new(client.clone()));
            snapshots = operator.nodes.clone().recipient();
            ready = operator.ready;
            tokio::spawn(watch::watch_kube(
                kube::Api::all(client),
                operator.nodes.recipient(),
            ));
            tracing::info!("watching CiliumNodes in Kubernetes");
        }
    }

    let (stop_grpc, grpc_stopped) = tokio::sync::oneshot::channel::<()>();
    let mut readiness = None;
    let grpc = match grpc_listener {
        Some(listener) => {
            let (standard, health) = StandardServices::new(&[node_ipam_server::SERVICE_NAME]).await;
            tokio::spawn(ready_when(ready, health.clone()));
            readiness = Some(health);
            tracing::info!(addr = ?listener.local_addr().ok(), "serving meshwork.operator.v1.NodeIpam");
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let router = tonic::transport::Server::builder()
                .add_service(NodeIpamService::new(snapshots).into_server());
            Some(tokio::spawn(
                standard
                    .add_to(router)
                    .serve_with_incoming_shutdown(incoming, async move {
                        let _ = grpc_stopped.await;
                    }),
            ))
        }
        None => None,
    };
    let stop_http = CancellationToken::new();
    let server = metrics_server.map(|server| server.serve(registry, None, stop_http.clone()));
    tokio::select! {
        _ = terminate.recv() => tracing::info!("SIGTERM: stopping"),
        _ = interrupt.recv() => tracing::info!("SIGINT: stopping"),
    }
    // Passes in flight are dropped: an ENI created but not yet attached is collected by the
    // next operator's GC (it carries the cluster's tags).
    if let Some(readiness) = &readiness {
        readiness.shutting_down().await;
    }
    stop_http.cancel();
    drop(stop_grpc);
    if let Some(grpc) = grpc {
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
    actix::System::current().stop();
    Ok(())
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
