//! The agent as a library: one wiring of the actor graph, used by the binary, the tests and
//! the scenarios.
//!
//! Start-up runs in phases, and each phase takes what the one before it produced, so the
//! order is carried by the types:
//!
//! 1. [`Listeners::bind`]: the API socket and the metrics port, bound before anything else
//!    (a taken port or an unusable path fails the start at once, naming it);
//! 2. [`Devices::open`]: the ipcache recreated and the service maps opened, the WireGuard
//!    device up with its peers restored — all before any remote event exists;
//! 3. [`Devices::start`]: the barrier, with every consumer that will acknowledge registered,
//!    and the consumers' actors;
//! 4. [`Consumers::start_mesh`]: the mesh, its stores sending to those consumers;
//! 5. [`Mesh::load`]: the clustermesh config directory's clusters handed to the mesh, so the
//!    barrier knows every configured cluster — proven by the [`KnownClusters`] it returns;
//! 6. [`Mesh::arm`]: what waits on the barrier (endpoint regeneration, pruning of restored
//!    maps, WireGuard's garbage collection), which needs [`KnownClusters`];
//! 7. [`Armed::serve`]: the API and the metrics served; the agent is running. Its gRPC health
//!    says `NOT_SERVING` until the start-up sync wait has returned (synced, or the breaker
//!    fired) and, with `--ipam`, the IPAM is ready (the router IP allocated: in ENI mode once
//!    the pool held `required` IPs), `SERVING` after, and `NOT_SERVING` again once
//!    [`Agent::shutdown`] begins.
//!
//! The IPAM (`--ipam`) opens with the devices (phase 2): its checkpoint is restored there, so
//! a corrupt one fails the start, and in ENI mode the operator session starts at once, so
//! snapshots arrive while the mesh loads.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, Addr, Recipient};
use futures::FutureExt as _;
use meshwork_clustermesh::barrier::SyncBarrier;
use meshwork_clustermesh::barrier_actor::{GetMeshWait, SyncBarrierActor};
use meshwork_clustermesh::config_dir::{
    ClusterConfigEvent, ConfigDirError, ConfigDirState, ConfigDirWatcher, StopWatching,
};
use meshwork_clustermesh::events::{RemoteEvents, Sinks};
use meshwork_clustermesh::identity_actor::IdentityCacheActor;
use meshwork_clustermesh::mesh::{ClusterMesh, ShutdownMesh, refresh_metrics};
use meshwork_clustermesh::metrics::MeshMetrics;
use meshwork_clustermesh::remote_cluster::runner::MeshSettings;
use meshwork_clustermesh::timeline::{TimelineRecorder, Waiter};
use meshwork_clustermesh::{Consumer, SyncKind, WaitError, WaitOutcome};
use meshwork_datapath::endpoint::EndpointStore;
use meshwork_http::{BindError, MetricsServer, Refresh};
use meshwork_kvstore::KvstoreMetrics;
use meshwork_proto::agent::v1::agent_server::{self, AgentServer};
use meshwork_proto::agent::v1::datapath_server::{self, DatapathServer};
use meshwork_proto::agent::v1::encrypt_server::{self, EncryptServer};
use meshwork_proto::agent::v1::ipam_server::{self, IpamServer};
use meshwork_proto::apiserver::v1 as apiserver_pb;
use meshwork_proto::{Readiness, StandardServices};
use meshwork_wireguard::local_node::LocalNode;
use prometheus_client::registry::Registry;
use tokio::net::UnixListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::api::LocalApi;
use crate::args::{Args, ArgsError};
use crate::datapath::endpoint_manager::{self, EndpointSettings};
use crate::datapath::writer_actor;
use crate::datapath::{Datapath, DatapathError, OpenMaps, published_endpoint};
use crate::ipam::service::IpamApi;
use crate::ipam::{Ipam, IpamError, IpamSettings};
use crate::publisher::Publisher;
use crate::wireguard::actor::{self as wireguard_actor, ArmGc, WireGuard};
use crate::wireguard::{EncryptApi, OpenDevice, WireguardError};

/// How long shutdown waits for an actor on its own thread (one stuck in a device call is
/// left to end with the process).
const STOP_GRACE: Duration = Duration::from_secs(1);

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A flag value is unusable.
    #[error(transparent)]
    Args(#[from] ArgsError),
    /// The state dir could not be created.
    #[error("creating the state dir {path}: {error}")]
    StateDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        error: io::Error,
    },
    /// The API socket could not be bound.
    #[error("binding the API socket {path}: {error}")]
    ApiSocket {
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        error: io::Error,
    },
    /// The metrics port could not be bound.
    #[error(transparent)]
    Metrics(#[from] BindError),
    /// The clustermesh config directory cannot be read.
    #[error(transparent)]
    ConfigDir(#[from] ConfigDirError),
    /// The BPF datapath could not be set up.
    #[error(transparent)]
    Datapath(#[from] DatapathError),
    /// WireGuard could not be set up.
    #[error(transparent)]
    Wireguard(#[from] WireguardError),
    /// The IPAM could not be set up.
    #[error(transparent)]
    Ipam(#[from] IpamError),
    /// The mesh actor stopped during start-up.
    #[error("the cluster mesh stopped during start-up")]
    MeshGone,
}

/// Builds and starts an agent; see the module docs.
pub struct AgentBuilder {
    args: Args,
    settings: MeshSettings,
    ipam_settings: IpamSettings,
    observers: Vec<Recipient<RemoteEvents>>,
}

impl AgentBuilder {
    /// An agent run as `args` say.
    pub fn new(args: Args) -> Self {
        let mut settings = MeshSettings::new(args.cluster_name.clone());
        settings.max_connected_clusters = args.max_connected_clusters;
        settings.heartbeat = args.heartbeat.settings();
        Self {
            args,
            settings,
            ipam_settings: IpamSettings::default(),
            observers: Vec::new(),
        }
    }

    /// Changes the IPAM's pacing (tests shorten the operator reconnects).
    pub fn ipam_settings(mut self, change: impl FnOnce(&mut IpamSettings)) -> Self {
        change(&mut self.ipam_settings);
        self
    }

    /// Changes the remote clusters' connection settings (tests shorten the retries).
    pub fn mesh_settings(mut self, change: impl FnOnce(&mut MeshSettings)) -> Self {
        change(&mut self.settings);
        self
    }

    /// Also sends every batch of remote events to `observer` (tests and benchmarks watch
    /// what the consumers see). An observer acknowledges nothing.
    pub fn observer(mut self, observer: Recipient<RemoteEvents>) -> Self {
        self.observers.push(observer);
        self
    }

    /// Starts the agent (inside an actix system); see the module docs.
    pub async fn start(self) -> Result<Agent, StartError> {
        let Self {
            args,
            mut settings,
            ipam_settings,
            observers,
        } = self;
        // Offset 0 of the restart timeline.
        let timeline = TimelineRecorder::start();
        settings.timeline = timeline.clone();
        args.validate()?;
        let listeners = Listeners::bind(&args).await?;
        // Read once, synchronously, before anything waits.
        let initial = match &args.clustermesh_config {
            Some(dir) => Some(ConfigDirWatcher::read_initial(
                dir.clone(),
                args.cluster_name.clone(),
            )?),
            None => None,
        };
        let mut registry = Registry::with_prefix("meshwork");
        let devices = Devices::open(&args, &ipam_settings, &mut registry)?;
        let consumers = devices.start(&args, timeline);
        let mesh = consumers.start_mesh(&args, settings, observers, &mut registry);
        let (mesh, known) = mesh.load(initial).await?;
        let armed = mesh.arm(&args, &known);
        let agent = armed.serve(listeners, registry, &ipam_settings).await;
        tracing::info!(cluster = %args.cluster_name, socket = %args.api_socket().display(), "meshwork-agent running");
        Ok(agent)
    }
}

/// Phase 1: every listener, bound.
pub struct Listeners {
    api: SocketFile,
    metrics: Option<MetricsServer>,
}

impl Listeners {
    /// Creates the state dir and binds the API socket and the metrics port.
    pub async fn bind(args: &Args) -> Result<Self, StartError> {
        std::fs::create_dir_all(&args.state_dir).map_err(|source| StartError::StateDir {
            path: args.state_dir.clone(),
            error: source,
        })?;
        let api = SocketFile::bind(args.api_socket())?;
        let metrics = match args.metrics_addr()? {
            Some(addr) => Some(MetricsServer::bind(addr).await?),
            None => None,
        };
        Ok(Self { api, metrics })
    }
}

/// The API socket, removed when dropped (a failed start leaves nothing behind).
struct SocketFile {
    path: PathBuf,
    listener: Option<UnixListener>,
}

impl SocketFile {
    fn bind(path: PathBuf) -> Result<Self, StartError> {
        let failed = |source| StartError::ApiSocket {
            path: path.clone(),
            error: source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(failed)?;
        }
        // A socket file left by a previous run would make bind fail.
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => return Err(failed(err)),
        }
        let listener = UnixListener::bind(&path).map_err(failed)?;
        Ok(Self {
            path,
            listener: Some(listener),
        })
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Phase 2: the devices, opened.
pub struct Devices {
    datapath: Option<OpenMaps>,
    wireguard: Option<OpenDevice>,
    publisher: Option<Publisher>,
    ipam: Option<Ipam>,
}

impl Devices {
    /// Recreates the ipcache and opens the service maps (unless the datapath is off), brings
    /// the WireGuard device up (when enabled), and opens the IPAM (with `--ipam`: its
    /// checkpoint restored, its operator session started).
    pub fn open(
        args: &Args,
        ipam_settings: &IpamSettings,
        registry: &mut Registry,
    ) -> Result<Self, StartError> {
        let datapath = if args.enable_bpf_datapath {
            Some(OpenMaps::recreate(
                &args.bpf_root,
                args.node_ip,
                &args.socket_lb,
            )?)
        } else {
            None
        };
        let wireguard =
            crate::wireguard::open(&args.wireguard, &args.state_dir, local_node(args), registry)?;
        let publisher = match args.apiserver_addr.as_deref() {
            Some(addr) => {
                let tls = args.apiserver_tls()?;
                let public_key = wireguard.as_ref().map(OpenDevice::public_key);
                Some(start_publisher(addr, tls, args, public_key))
            }
            None => None,
        };
        let ipam = crate::ipam::open(args, registry, ipam_settings)?;
        Ok(Self {
            datapath,
            wireguard,
            publisher,
            ipam,
        })
    }

    /// The barrier, with every consumer that will acknowledge registered, and the
    /// consumers' actors; the start's steps are recorded on `timeline`.
    pub fn start(self, args: &Args, timeline: TimelineRecorder) -> Consumers {
        let mut barrier =
            SyncBarrier::new(args.clustermesh_sync_timeout).with_consumer(Consumer::Identities);
        if self.datapath.is_some() {
            barrier = barrier.with_consumer(Consumer::Datapath);
        }
        if self.wireguard.is_some() {
            barrier = barrier.with_consumer(Consumer::WireGuard);
        }
        let barrier = SyncBarrierActor::new(barrier)
            .with_timeline(timeline.clone())
            .start();
        let acks = barrier.clone().recipient();
        let datapath = self.datapath.map(|maps| {
            maps.start(
                acks.clone(),
                self.publisher.clone(),
                (&args.cluster_name, args.cluster_id),
            )
        });
        Consumers {
            identities: IdentityCacheActor::new(acks.clone()).start(),
            datapath,
            wireguard: self.wireguard.map(|device| device.start(acks)),
            barrier,
            publisher: self.publisher,
            ipam: self.ipam,
            timeline,
        }
    }
}

/// Phase 3: the barrier and the consumers of remote state.
pub struct Consumers {
    barrier: Addr<SyncBarrierActor>,
    identities: Addr<IdentityCacheActor>,
    datapath: Option<Datapath>,
    wireguard: Option<Addr<WireGuard>>,
    publisher: Option<Publisher>,
    ipam: Option<Ipam>,
    timeline: TimelineRecorder,
}

impl Consumers {
    /// The mesh, its stores sending every batch to each consumer (datapath first), then to
    /// `observers`; its metrics, the kvstore's and the datapath's go into `registry`.
    pub fn start_mesh(
        self,
        args: &Args,
        settings: MeshSettings,
        observers: Vec<Recipient<RemoteEvents>>,
        registry: &mut Registry,
    ) -> Mesh {
        if let Some(datapath) = &self.datapath {
            datapath.register_metrics(registry);
        }
        let mut consumers: Vec<Recipient<RemoteEvents>> = Vec::new();
        consumers.extend(self.datapath.iter().map(|d| d.writer.clone().recipient()));
        consumers.extend(self.wireguard.iter().map(|w| w.clone().recipient()));
        consumers.extend(observers);
        let sinks = Sinks {
            barrier: self.barrier.clone().recipient(),
            consumers,
            identities: self.identities.clone().recipient(),
        };
        let metrics = KvstoreMetrics::register(registry);
        let mesh_metrics = Arc::new(MeshMetrics::register(registry));
        let mesh = ClusterMesh::new(settings, args.cluster_id, sinks, metrics).start();
        Mesh {
            consumers: self,
            mesh,
            mesh_metrics,
            watcher: None,
            config_dir: args.clustermesh_config.clone(),
        }
    }
}

/// Phase 4: the mesh, started.
pub struct Mesh {
    consumers: Consumers,
    mesh: Addr<ClusterMesh>,
    mesh_metrics: Arc<MeshMetrics>,
    watcher: Option<Addr<ConfigDirWatcher>>,
    /// `--clustermesh-config`, for the status API.
    config_dir: Option<PathBuf>,
}

/// Proof that the barrier knows every configured cluster: what waits on it needs this.
pub struct KnownClusters(());

impl Mesh {
    /// Hands the initially read clusters to the mesh, each acknowledged (so the barrier
    /// knows them before anyone can wait), then watches the directory for changes.
    pub async fn load(
        mut self,
        initial: Option<(ConfigDirState, Vec<ClusterConfigEvent>)>,
    ) -> Result<(Self, KnownClusters), StartError> {
        if let Some((state, events)) = initial {
            for event in events {
                self.mesh
                    .send(event)
                    .await
                    .map_err(|_| StartError::MeshGone)?;
            }
            let watcher = ConfigDirWatcher::new(state, self.mesh.clone().recipient());
            self.watcher = Some(watcher.start());
        }
        Ok((self, KnownClusters(())))
    }

    /// Starts what waits on the barrier: endpoint regeneration and the pruning of restored
    /// maps (datapath), garbage collection of restored peers (WireGuard).
    pub fn arm(mut self, args: &Args, known: &KnownClusters) -> Armed {
        let waits: Recipient<GetMeshWait> = self.consumers.barrier.clone().recipient();
        if let Some(datapath) = &mut self.consumers.datapath {
            let settings = EndpointSettings {
                ip_identities_sync_timeout: args.clustermesh_ip_identities_sync_timeout,
                enable_ipsec: args.enable_ipsec,
                timeline: self.consumers.timeline.clone(),
            };
            datapath.start_endpoints(settings, &args.state_dir, &waits, known);
        }
        if let Some(wireguard) = &self.consumers.wireguard {
            wireguard.do_send(ArmGc {
                barrier: waits,
                timeline: self.consumers.timeline.clone(),
            });
        }
        Armed(self)
    }
}

/// Phase 6: everything runs but the servers.
pub struct Armed(Mesh);

impl Armed {
    /// Serves the API (with gRPC health and reflection) on the bound socket and the metrics
    /// on the bound port; the health turns `SERVING` once the start-up sync wait returns and
    /// the IPAM (if any) is ready.
    pub async fn serve(
        self,
        mut listeners: Listeners,
        registry: Registry,
        ipam_settings: &IpamSettings,
    ) -> Agent {
        let Mesh {
            consumers,
            mesh,
            mesh_metrics,
            watcher,
            config_dir,
        } = self.0;
        let shutdown = CancellationToken::new();
        let mut servers = Vec::new();
        let mut served = vec![agent_server::SERVICE_NAME, encrypt_server::SERVICE_NAME];
        if consumers.datapath.is_some() {
            served.push(datapath_server::SERVICE_NAME);
        }
        if consumers.ipam.is_some() {
            served.push(ipam_server::SERVICE_NAME);
        }
        let (standard, readiness) = StandardServices::new(&served).await;
        let becoming_ready = tokio::spawn(ready_after_sync(
            consumers.barrier.clone(),
            readiness.clone(),
            consumers.timeline.clone(),
            consumers
                .ipam
                .clone()
                .map(|ipam| (ipam, ipam_settings.progress_interval)),
        ));
        let api = LocalApi {
            mesh: mesh.clone(),
            barrier: consumers.barrier.clone(),
            datapath: consumers.datapath.clone(),
            publisher: consumers.publisher.clone(),
            timeline: consumers.timeline.clone(),
            config_dir: LocalApi::config_dir_of(config_dir.as_deref()),
        };
        if let Some(listener) = listeners.api.listener.take() {
            servers.push(serve_api(
                listener,
                api,
                EncryptApi(consumers.wireguard.clone()),
                consumers.ipam.clone().map(IpamApi),
                standard,
                shutdown.clone(),
            ));
        }
        if let Some(metrics) = listeners.metrics.take() {
            let mesh_refresh = refresh_metrics(mesh.clone(), mesh_metrics);
            let ipam = consumers.ipam.clone();
            let refresh: Refresh = Arc::new(move || {
                if let Some(ipam) = &ipam {
                    ipam.refresh_metrics();
                }
                mesh_refresh()
            });
            servers.push(metrics.serve(registry, Some(refresh), shutdown.clone()));
        }
        Agent {
            mesh,
            watcher,
            barrier: consumers.barrier,
            identities: consumers.identities,
            datapath: consumers.datapath,
            wireguard: consumers.wireguard,
            publisher: consumers.publisher,
            ipam: consumers.ipam,
            shutdown,
            servers,
            readiness,
            becoming_ready,
            _socket: listeners.api,
        }
    }
}

/// Reports the agent ready once the start-up wait for every kind has returned, as
/// `meshctl status --wait` sees it (synced, or the breaker fired), and the IPAM, if any, is
/// ready (its progress logged every `interval` meanwhile).
async fn ready_after_sync(
    barrier: Addr<SyncBarrierActor>,
    readiness: Readiness,
    timeline: TimelineRecorder,
    ipam: Option<(Ipam, Duration)>,
) {
    let mesh = async {
        for kind in [SyncKind::Nodes, SyncKind::Services, SyncKind::IpIdentities] {
            let Ok(wait) = barrier.send(GetMeshWait::all(kind)).await else {
                return false;
            };
            let outcome = wait.wait(None).await;
            timeline.wait_returned(Waiter::Readiness, kind, &outcome);
            if let Err(err) = outcome {
                tracing::warn!(%err, "the start-up sync wait failed; the agent stays NOT_SERVING");
                return false;
            }
        }
        true
    };
    let ipam = async {
        if let Some((ipam, interval)) = &ipam {
            ipam.wait_ready(*interval).await;
        }
    };
    let (synced, ()) = tokio::join!(mesh, ipam);
    if !synced {
        return;
    }
    readiness.ready().await;
    tracing::info!("meshwork-agent ready (gRPC health SERVING)");
}

fn serve_api(
    listener: UnixListener,
    api: LocalApi,
    encrypt: EncryptApi,
    ipam: Option<IpamApi>,
    standard: StandardServices,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    let datapath = api.datapath.clone().map(DatapathServer::new);
    let ipam = ipam.map(IpamServer::new);
    tokio::spawn(async move {
        let router = tonic::transport::Server::builder()
            .add_service(AgentServer::new(api))
            .add_optional_service(datapath)
            .add_service(EncryptServer::new(encrypt))
            .add_optional_service(ipam);
        let served = standard
            .add_to(router)
            .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
            .await;
        if let Err(err) = served {
            tracing::error!(%err, "the API server failed");
        }
    })
}

/// Starts publishing this node (`--node-name`, `--node-ip`, `--ipv4-alloc-cidr`, the
/// WireGuard key) and the persisted endpoints that carry labels to the apiserver at `addr`.
fn start_publisher(
    addr: &str,
    tls: Option<tonic::transport::ClientTlsConfig>,
    args: &Args,
    wireguard_public_key: Option<&str>,
) -> Publisher {
    let node = apiserver_pb::Node {
        name: args.node_name(),
        addresses: args
            .node_ip
            .iter()
            .map(|ip| apiserver_pb::NodeAddress {
                r#type: "InternalIP".to_owned(),
                ip: ip.to_string(),
            })
            .collect(),
        ipv4_alloc_cidrs: args.ipv4_alloc_cidr.iter().cloned().collect(),
        wireguard_public_key: wireguard_public_key.unwrap_or_default().to_owned(),
        // ENI pod IPs lie in no pod CIDR: the apiserver must not refuse them for that.
        eni_ipam: args.ipam.ipam == Some(crate::ipam::args::IpamMode::Eni),
        ..apiserver_pb::Node::default()
    };
    // Read again by the endpoint manager later; here only what to publish.
    let (restored, _) = EndpointStore::new(&args.state_dir).load_all();
    let endpoints = restored
        .iter()
        .filter(|spec| !spec.labels.is_empty())
        .map(published_endpoint)
        .collect();
    Publisher::start(addr, tls, node, endpoints)
}

/// The agent's own node: `--node-name` (the host name), this cluster, `--node-ip`.
fn local_node(args: &Args) -> LocalNode {
    LocalNode {
        name: args.node_name(),
        cluster: args.cluster_name.clone(),
        cluster_id: args.cluster_id,
        node_ip: args.node_ip,
    }
}

/// A running agent.
pub struct Agent {
    mesh: Addr<ClusterMesh>,
    watcher: Option<Addr<ConfigDirWatcher>>,
    barrier: Addr<SyncBarrierActor>,
    identities: Addr<IdentityCacheActor>,
    datapath: Option<Datapath>,
    wireguard: Option<Addr<WireGuard>>,
    publisher: Option<Publisher>,
    ipam: Option<Ipam>,
    shutdown: CancellationToken,
    servers: Vec<JoinHandle<()>>,
    readiness: Readiness,
    becoming_ready: JoinHandle<()>,
    _socket: SocketFile,
}

impl Agent {
    /// The cluster mesh.
    pub fn mesh(&self) -> &Addr<ClusterMesh> {
        &self.mesh
    }

    /// The sync barrier.
    pub fn barrier(&self) -> &Addr<SyncBarrierActor> {
        &self.barrier
    }

    /// The identity cache.
    pub fn identities(&self) -> &Addr<IdentityCacheActor> {
        &self.identities
    }

    /// The BPF datapath, when enabled.
    pub fn datapath(&self) -> Option<&Datapath> {
        self.datapath.as_ref()
    }

    /// The WireGuard actor, when enabled.
    pub fn wireguard(&self) -> Option<&Addr<WireGuard>> {
        self.wireguard.as_ref()
    }

    /// The IPAM, with `--ipam`.
    pub fn ipam(&self) -> Option<&Ipam> {
        self.ipam.as_ref()
    }

    /// Applies a config directory change, as the watcher would (for agents started without
    /// `--clustermesh-config`); answers once the mesh has taken it.
    pub async fn configure(&self, event: ClusterConfigEvent) {
        let _ = self.mesh.send(event).await;
    }

    /// Waits for `kind` over the clusters known now, as `meshctl status --wait` does.
    pub async fn wait(
        &self,
        kind: SyncKind,
        timeout: Option<Duration>,
    ) -> Result<WaitOutcome, WaitError> {
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        match self.barrier.send(GetMeshWait::all(kind)).await {
            Ok(wait) => wait.wait(deadline).await,
            Err(_) => Ok(WaitOutcome::Synced),
        }
    }

    /// Stops every actor and task, draining nothing: the datapath keeps its state across
    /// restarts. Actors on the system arbiter end with the system.
    pub async fn shutdown(self) {
        // Health first, so probes see the agent leave before its API does.
        self.becoming_ready.abort();
        self.readiness.shutting_down().await;
        if let Some(publisher) = &self.publisher {
            // The session ends; the apiserver keeps the node's entries for its grace.
            publisher.stop();
        }
        if let Some(ipam) = &self.ipam {
            // The operator session ends; the allocations stay in the checkpoint.
            ipam.stop();
        }
        if let Some(watcher) = &self.watcher {
            let _ = watcher.send(StopWatching).await;
        }
        let _ = self.mesh.send(ShutdownMesh).await;
        self.shutdown.cancel();
        for server in self.servers {
            let _ = tokio::time::timeout(STOP_GRACE, server).await;
        }
        let mut stopping = Vec::new();
        if let Some(datapath) = &self.datapath {
            if let Some(endpoints) = &datapath.endpoints {
                stopping.push(endpoints.send(endpoint_manager::Stop).map(drop).boxed());
            }
            stopping.push(datapath.writer.send(writer_actor::Stop).map(drop).boxed());
        }
        if let Some(wireguard) = &self.wireguard {
            stopping.push(wireguard.send(wireguard_actor::Stop).map(drop).boxed());
        }
        if tokio::time::timeout(STOP_GRACE, futures::future::join_all(stopping))
            .await
            .is_err()
        {
            tracing::warn!("an actor did not stop in time (a device call still runs); leaving it");
        }
        tracing::info!("meshwork-agent stopped");
    }
}
