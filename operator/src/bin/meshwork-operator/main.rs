//! `meshwork-operator`: Meshwork's AWS ENI IPAM operator.
//!
//! Without a subcommand it runs the operator (see `--help`); `crd` prints the CiliumNode
//! CustomResourceDefinition generated from the Rust type, so the schema served to
//! Kubernetes can never drift from the code.

mod args;
mod http;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use kube::CustomResourceExt;
use meshwork_operator::cilium_node::CiliumNode;
use meshwork_operator::ec2::{Ec2, Ec2Config, Ec2Metrics, SubnetFilter};
use meshwork_operator::grpc::NodeIpamService;
use meshwork_operator::instances::shared;
use meshwork_operator::manager::{
    self, GetSnapshot, InstancesConfig, LimitsCache, ManagerConfig, PassDeps, ReleaseConfig,
    ResyncFilter, watch,
};
use meshwork_operator::node_store::{EtcdStore, KubeStore, NodeStore};
use prometheus_client::registry::Registry;
use tokio::signal::unix::{SignalKind, signal};

use args::{Cli, Command, RunArgs, StoreChoice};

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
    let listener = match addrs.metrics {
        Some(addr) => Some(http::bind(addr).await?),
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

    let snapshots: Option<actix::Recipient<GetSnapshot>>;
    match store {
        StoreChoice::Etcd(endpoints) => {
            let client = etcd_client::Client::connect(&endpoints, None)
                .await
                .with_context(|| format!("connecting to etcd at {endpoints:?}"))?;
            let operator = start(&run, ec2, EtcdStore::new(client.clone()));
            snapshots = Some(operator.nodes.clone().recipient());
            tokio::spawn(watch::watch_etcd(client, operator.nodes.recipient()));
            tracing::info!(?endpoints, "watching CiliumNodes in etcd");
        }
        StoreChoice::Kube(kubeconfig) => {
            let client = kube_client(kubeconfig).await?;
            let operator = start(&run, ec2, KubeStore::new(client.clone()));
            snapshots = Some(operator.nodes.clone().recipient());
            tokio::spawn(watch::watch_kube(
                kube::Api::all(client),
                operator.nodes.recipient(),
            ));
            tracing::info!("watching CiliumNodes in Kubernetes");
        }
    }

    let (stop_grpc, grpc_stopped) = tokio::sync::oneshot::channel::<()>();
    let grpc = grpc_listener.zip(snapshots).map(|(listener, snapshots)| {
        tracing::info!(addr = ?listener.local_addr().ok(), "serving meshwork.operator.v1.NodeIpam");
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(NodeIpamService::new(snapshots).into_server())
                .serve_with_incoming_shutdown(incoming, async move {
                    let _ = grpc_stopped.await;
                }),
        )
    });
    let (stop_http, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = listener.map(|listener| {
        tracing::info!(addr = ?listener.local_addr().ok(), "serving /metrics and /healthz");
        tokio::spawn(http::serve(listener, Arc::new(registry), async move {
            let _ = stopped.await;
        }))
    });
    tokio::select! {
        _ = terminate.recv() => tracing::info!("SIGTERM: stopping"),
        _ = interrupt.recv() => tracing::info!("SIGINT: stopping"),
    }
    // Passes in flight are dropped: an ENI created but not yet attached is collected by the
    // next operator's GC (it carries the cluster's tags).
    drop(stop_http);
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
            Ok(Ok(result)) => result?,
            Ok(Err(err)) => tracing::warn!(%err, "metrics server task failed"),
            Err(_) => tracing::warn!("metrics server did not stop in time"),
        }
    }
    actix::System::current().stop();
    Ok(())
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
