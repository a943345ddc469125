//! Wiring: flags → actors → servers, and a clean stop on SIGTERM.

use std::sync::Arc;

use actix::Actor;
use anyhow::Context as _;
use meshwork_agent_core::clustermesh::barrier::SyncBarrier;
use meshwork_agent_core::clustermesh::barrier_actor::SyncBarrierActor;
use meshwork_agent_core::clustermesh::config_dir::ConfigDirWatcher;
use meshwork_agent_core::clustermesh::identity_actor::IdentityCacheActor;
use meshwork_agent_core::clustermesh::mesh::{ClusterMesh, ShutdownMesh};
use meshwork_agent_core::clustermesh::metrics::MeshMetrics;
use meshwork_agent_core::clustermesh::remote_cluster::runner::MeshSettings;
use meshwork_agent_core::clustermesh::remote_cluster::stores::Sinks;
use meshwork_agent_core::clustermesh::remote_state::RemoteStateActor;
use meshwork_agent_core::kvstore::KvstoreMetrics;
use meshwork_agent_core::wireguard::local_node::LocalNode;
use meshwork_proto::agent::v1::agent_server::AgentServer;
use meshwork_proto::agent::v1::datapath_server::DatapathServer;
use meshwork_proto::agent::v1::encrypt_server::EncryptServer;
use prometheus_client::registry::Registry;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::api::LocalApi;
use crate::args::Args;
use crate::datapath::Datapath;
use crate::metrics_server::{self, MetricsState};

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(args: Args) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.state_dir)
        .with_context(|| format!("creating the state dir {}", args.state_dir.display()))?;
    // Read the config dir before anything waits, so every configured cluster is known.
    let initial = match &args.clustermesh_config {
        Some(dir) => Some(ConfigDirWatcher::read_initial(
            dir.clone(),
            args.cluster_name.clone(),
        )?),
        None => None,
    };

    let mut registry = Registry::with_prefix("meshwork");
    let kvstore_metrics = KvstoreMetrics::register(&mut registry);
    let mesh_metrics = Arc::new(MeshMetrics::register(&mut registry));

    let barrier = SyncBarrierActor::new(SyncBarrier::new(args.clustermesh_sync_timeout)).start();
    let mut datapath = if args.enable_bpf_datapath {
        Some(Datapath::start_writer(&args, barrier.clone().recipient())?)
    } else {
        None
    };
    let mut state = RemoteStateActor::new(barrier.clone().recipient());
    if let Some(datapath) = &datapath {
        // The datapath acknowledges services once their backends are written.
        state = state
            .with_subscriber(datapath.writer.clone().recipient())
            .without_service_acks();
    }
    let wireguard = crate::wireguard::start(
        &args.wireguard,
        &args.state_dir,
        local_node(&args),
        &mut registry,
    )?;
    let state = crate::wireguard::subscribe(state, wireguard.as_ref()).start();
    let identities = IdentityCacheActor::default().start();
    let sinks = Sinks {
        barrier: barrier.clone().recipient(),
        state: state.clone().recipient(),
        identities: identities.recipient(),
    };
    let mut settings = MeshSettings::new(args.cluster_name.clone());
    settings.max_connected_clusters = args.max_connected_clusters;
    let mesh = ClusterMesh::new(settings, args.cluster_id, sinks, kvstore_metrics).start();
    if let Some((dir_state, events)) = initial {
        for event in events {
            // Awaited: the barrier knows the cluster before the API can be asked to wait.
            mesh.send(event).await.context("the cluster mesh stopped")?;
        }
        ConfigDirWatcher::new(dir_state, mesh.clone().recipient()).start();
    }
    // After the configured clusters are known: the restore wait snapshots them.
    if let Some(datapath) = &mut datapath {
        datapath.start_endpoints(&args, &barrier, &state.clone().recipient());
    }
    crate::wireguard::arm(wireguard.as_ref(), &barrier);

    let shutdown = CancellationToken::new();
    let api = serve_api(
        &args,
        LocalApi {
            mesh: mesh.clone(),
            barrier,
            datapath: datapath.clone(),
        },
        crate::wireguard::EncryptApi(wireguard),
        shutdown.clone(),
    )?;
    let metrics = match args.metrics_addr()? {
        Some(addr) => {
            let state = Arc::new(MetricsState {
                registry,
                mesh_metrics,
                mesh: mesh.clone(),
            });
            Some(tokio::spawn(metrics_server::serve(
                addr,
                state,
                shutdown.clone(),
            )))
        }
        None => None,
    };
    tracing::info!(cluster = %args.cluster_name, socket = %args.api_socket().display(), "meshwork-agent running");

    let mut terminate =
        signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = terminate.recv() => tracing::info!("SIGTERM: stopping"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
    }
    // Remote clusters stop without draining: the datapath keeps its state across restarts.
    let _ = mesh.send(ShutdownMesh).await;
    shutdown.cancel();
    let _ = api.await;
    if let Some(metrics) = metrics {
        let _ = metrics.await;
    }
    let _ = std::fs::remove_file(args.api_socket());
    tracing::info!("meshwork-agent stopped");
    actix_rt::System::current().stop();
    Ok(())
}

/// The agent's own node: the host name, this cluster, `--node-ip`.
fn local_node(args: &Args) -> LocalNode {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_default();
    LocalNode {
        name,
        cluster: args.cluster_name.clone(),
        cluster_id: args.cluster_id,
        node_ip: args.node_ip,
    }
}

fn serve_api(
    args: &Args,
    api: LocalApi,
    encrypt: crate::wireguard::EncryptApi,
    shutdown: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let path = args.api_socket();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // A socket file left by a previous run would make bind fail.
    if path.exists() {
        std::fs::remove_file(&path)
            .with_context(|| format!("removing the stale socket {}", path.display()))?;
    }
    let listener = tokio::net::UnixListener::bind(&path)
        .with_context(|| format!("binding the API socket {}", path.display()))?;
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    let datapath = api.datapath.clone().map(DatapathServer::new);
    Ok(tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .add_service(AgentServer::new(api))
            .add_optional_service(datapath)
            .add_service(EncryptServer::new(encrypt))
            .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
            .await;
        if let Err(err) = served {
            tracing::error!(%err, "the API server failed");
        }
    }))
}
