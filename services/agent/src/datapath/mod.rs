//! The datapath as the agent runs it: the ipcache recreated at start, the `DatapathWriter`
//! consuming remote events, the `EndpointManager` started once every configured cluster is
//! known, and the `meshwork.agent.v1.Datapath` API.

pub mod endpoint_manager;
pub mod local_services;
pub mod metrics;
pub mod socket_lb;
pub mod writer_actor;

use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use actix::{Actor, Addr, Recipient};
use meshwork_clustermesh::barrier_actor::{BarrierUpdate, GetMeshWait};
use meshwork_datapath::drops;
use meshwork_datapath::endpoint::{EndpointSpec, EndpointState, EndpointStatus, EndpointStore};
use meshwork_datapath::maps::{MapsError, PinDir};
use meshwork_datapath::remote_maps::{self, RemoteMaps};
use meshwork_datapath::writer::{MapWriter, WriterReport};
use meshwork_proto::agent::v1 as pb;
use meshwork_proto::apiserver::v1 as apiserver_pb;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use self::endpoint_manager::{
    DeleteEndpoint, EndpointError, EndpointManager, EndpointSettings, ListEndpoints, PutEndpoint,
};
use self::metrics::EndpointMetrics;
use self::writer_actor::{DatapathWriter, PruneWhenSynced};
use crate::builder::KnownClusters;
use crate::publisher::{IdentityError, Publisher};

/// How long `PutEndpoint` waits for the apiserver to allocate an identity.
const IDENTITY_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the datapath could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    /// The ipcache could not be recreated.
    #[error(
        "recreating the ipcache map under {pins} (is bpffs mounted and the agent root?): {error}"
    )]
    Ipcache {
        /// The pin directory.
        pins: String,
        /// Why.
        error: Box<MapsError>,
    },
    /// The service or tunnel maps could not be opened.
    #[error("opening the service and tunnel maps: {0}")]
    RemoteMaps(Box<MapsError>),
    /// Socket-LB could not be attached (or a previous agent's detached).
    #[error(transparent)]
    SocketLb(Box<socket_lb::CgroupError>),
}

/// The maps, recreated and opened, not yet driven by an actor.
pub struct OpenMaps {
    pins: PinDir,
    writer: MapWriter,
}

impl OpenMaps {
    /// Recreates the ipcache under `bpf_root` (§5: every start), opens the service and
    /// tunnel maps with what the previous agent left in them, and attaches socket-LB to them
    /// (or removes the previous agent's, when it is off).
    pub fn recreate(
        bpf_root: &std::path::Path,
        node_ip: Option<IpAddr>,
        socket_lb: &socket_lb::SocketLbArgs,
    ) -> Result<Self, DatapathError> {
        let pins = PinDir::under(bpf_root);
        let map = pins
            .recreate_ipcache()
            .map_err(|source| DatapathError::Ipcache {
                pins: pins.path().display().to_string(),
                error: Box::new(source),
            })?;
        let remote = RemoteMaps::open(&pins).map_err(|e| DatapathError::RemoteMaps(Box::new(e)))?;
        socket_lb::setup(socket_lb, bpf_root, &pins)
            .map_err(|e| DatapathError::SocketLb(Box::new(e)))?;
        Ok(Self {
            pins,
            writer: MapWriter::new(map, node_ip).with_remote_maps(remote),
        })
    }

    /// Starts the writer on its own arbiter, acknowledging to `barrier`. With a `publisher`
    /// (`--apiserver-addr`), endpoints are published through it and the cluster's services
    /// it receives are the local services of `cluster` (name, ID); restored services then
    /// wait for them before any prune.
    pub fn start(
        mut self,
        barrier: Recipient<BarrierUpdate>,
        publisher: Option<Publisher>,
        (cluster, cluster_id): (&str, u32),
    ) -> Datapath {
        if publisher.is_some() {
            self.writer.expect_local_services();
        }
        let writer = DatapathWriter::new(self.writer, barrier);
        let report = writer.report();
        let arbiter = actix::Arbiter::new();
        let writer = DatapathWriter::start_in_arbiter(&arbiter.handle(), |_| writer);
        if let Some(publisher) = &publisher {
            local_services::follow(publisher, writer.clone(), cluster, cluster_id);
        }
        Datapath {
            pins: self.pins,
            writer,
            report,
            endpoints: None,
            publisher,
            metrics: EndpointMetrics::default(),
        }
    }
}

/// The datapath's actors.
#[derive(Clone)]
pub struct Datapath {
    /// Where the maps are pinned.
    pub pins: PinDir,
    /// The map writer.
    pub writer: Addr<DatapathWriter>,
    report: watch::Receiver<WriterReport>,
    /// The endpoints, once started.
    pub endpoints: Option<Addr<EndpointManager>>,
    /// Where endpoints with labels are published (and get their identity), with
    /// `--apiserver-addr`.
    pub publisher: Option<Publisher>,
    /// Regenerations, counted by the endpoint manager.
    metrics: EndpointMetrics,
}

impl Datapath {
    /// Registers the datapath's metrics (see [`metrics`]) in `registry`.
    pub fn register_metrics(&self, registry: &mut Registry) {
        metrics::register(
            registry,
            self.pins.clone(),
            self.report.clone(),
            &self.metrics,
        );
    }

    /// Restores the persisted endpoints, which regenerate after the bounded sync wait, and
    /// arms the pruning of restored state. Both need every configured cluster known.
    pub fn start_endpoints(
        &mut self,
        settings: EndpointSettings,
        state_dir: &std::path::Path,
        barrier: &Recipient<GetMeshWait>,
        _known: &KnownClusters,
    ) {
        let prune = PruneWhenSynced {
            barrier: barrier.clone(),
            timeline: settings.timeline.clone(),
        };
        let manager = EndpointManager::new(
            self.pins.clone(),
            EndpointStore::new(state_dir),
            settings,
            self.writer.clone(),
            barrier.clone(),
            self.metrics.clone(),
        );
        self.endpoints = Some(manager.start_own_arbiter());
        self.writer.do_send(prune);
    }

    /// The writer's report as of its last message.
    pub fn report(&self) -> WriterReport {
        self.report.borrow().clone()
    }

    /// The datapath part of the status.
    pub async fn status(&self) -> pb::DatapathStatus {
        let report = self.report();
        let (drops, drops_error) = match drops::read(&self.pins) {
            Ok(counts) => (counts, None),
            Err(err) => (Vec::new(), Some(err.to_string())),
        };
        let endpoints = match &self.endpoints {
            Some(manager) => manager.send(ListEndpoints).await.unwrap_or_default(),
            None => Vec::new(),
        };
        pb::DatapathStatus {
            enabled: true,
            pin_dir: self.pins.path().display().to_string(),
            ipcache_entries: report.entries as u64,
            drops: drops
                .into_iter()
                .map(|(reason, count)| pb::ReasonCount {
                    reason: reason.label().to_owned(),
                    count,
                })
                .collect(),
            ipcache_rejected: report
                .rejected
                .iter()
                .map(|(reason, count)| pb::ReasonCount {
                    reason: (*reason).to_owned(),
                    count: *count,
                })
                .collect(),
            ipcache_map_full: report.stats.map_full,
            last_error: report.last_error.or(drops_error),
            maps: report.remote_maps.map_or_else(Vec::new, |lb| {
                [
                    (remote_maps::SERVICES_MAP, lb.services),
                    (remote_maps::BACKENDS_MAP, lb.backends),
                    (remote_maps::TUNNEL_MAP, lb.tunnel),
                ]
                .into_iter()
                .map(|(name, s)| pb::MapStatus {
                    name: name.to_owned(),
                    written: s.written,
                    deleted: s.deleted,
                    restored_pending: s.restored_pending,
                    errors: s.errors,
                })
                .collect()
            }),
            endpoints: u32::try_from(endpoints.len()).unwrap_or(u32::MAX),
            endpoints_ready: u32::try_from(
                endpoints
                    .iter()
                    .filter(|e| e.state == EndpointState::Ready)
                    .count(),
            )
            .unwrap_or(u32::MAX),
        }
    }

    /// An endpoint with labels is published; identity 0 gets the apiserver's identity for
    /// its labels. Returns what is to be published once the endpoint is in place.
    async fn publish(
        &self,
        spec: &mut EndpointSpec,
    ) -> Result<Option<apiserver_pb::Endpoint>, Status> {
        if spec.labels.is_empty() {
            return Ok(None);
        }
        for label in &spec.labels {
            meshwork_types::Label::parse_strict(label).map_err(|why| {
                Status::invalid_argument(format!("endpoint {}: label {label:?}: {why}", spec.id))
            })?;
        }
        let Some(publisher) = &self.publisher else {
            if spec.identity == 0 {
                return Err(Status::unavailable(format!(
                    "endpoint {}: identity 0 is to come from the apiserver, and the agent has no --apiserver-addr",
                    spec.id
                )));
            }
            return Ok(None);
        };
        let endpoint = published_endpoint(spec);
        if spec.identity == 0 {
            spec.identity = publisher
                .identity(endpoint.clone(), IDENTITY_TIMEOUT)
                .await
                .map_err(|err| match err {
                    IdentityError::Refused { .. } => Status::invalid_argument(err.to_string()),
                    IdentityError::NoAnswer { .. } => Status::unavailable(err.to_string()),
                })?;
        }
        Ok(Some(endpoint))
    }

    fn manager(&self) -> Result<&Addr<EndpointManager>, Status> {
        self.endpoints
            .as_ref()
            .ok_or_else(|| Status::unavailable("endpoints are not restored yet"))
    }
}

#[tonic::async_trait]
impl pb::datapath_server::Datapath for Datapath {
    async fn list_endpoints(
        &self,
        _: Request<pb::ListEndpointsRequest>,
    ) -> Result<Response<pb::ListEndpointsResponse>, Status> {
        let endpoints = self
            .manager()?
            .send(ListEndpoints)
            .await
            .map_err(|_| Status::unavailable("the agent is shutting down"))?;
        Ok(Response::new(pb::ListEndpointsResponse {
            endpoints: endpoints.iter().map(endpoint_status).collect(),
        }))
    }

    async fn put_endpoint(
        &self,
        request: Request<pb::PutEndpointRequest>,
    ) -> Result<Response<pb::PutEndpointResponse>, Status> {
        let endpoint = request
            .into_inner()
            .endpoint
            .ok_or_else(|| Status::invalid_argument("missing endpoint"))?;
        let mut spec = spec_from_proto(endpoint).map_err(Status::invalid_argument)?;
        let published = self.publish(&mut spec).await?;
        spec.validate()
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        self.manager()?
            .send(PutEndpoint(spec))
            .await
            .map_err(|_| Status::unavailable("the agent is shutting down"))?
            .map_err(|e| endpoint_status_error(&e))?;
        if let (Some(publisher), Some(endpoint)) = (&self.publisher, published) {
            publisher.put(endpoint);
        }
        Ok(Response::new(pb::PutEndpointResponse {}))
    }

    async fn delete_endpoint(
        &self,
        request: Request<pb::DeleteEndpointRequest>,
    ) -> Result<Response<pb::DeleteEndpointResponse>, Status> {
        let id = request.into_inner().id;
        if let Some(publisher) = &self.publisher {
            publisher.remove(id);
        }
        let existed = self
            .manager()?
            .send(DeleteEndpoint(id))
            .await
            .map_err(|_| Status::unavailable("the agent is shutting down"))?
            .map_err(|e| endpoint_status_error(&e))?;
        Ok(Response::new(pb::DeleteEndpointResponse { existed }))
    }
}

fn endpoint_status_error(err: &EndpointError) -> Status {
    match err {
        EndpointError::Spec(_) => Status::invalid_argument(err.to_string()),
        EndpointError::Stopped => Status::unavailable(err.to_string()),
        EndpointError::Deleted(_) => Status::aborted(err.to_string()),
        _ => Status::internal(err.to_string()),
    }
}

/// What the apiserver gets of an endpoint.
pub fn published_endpoint(spec: &EndpointSpec) -> apiserver_pb::Endpoint {
    let (pod_namespace, pod_name) = spec.pod_parts();
    apiserver_pb::Endpoint {
        id: spec.id,
        ips: spec.ips.iter().map(ToString::to_string).collect(),
        labels: spec.labels.clone(),
        named_ports: Vec::new(),
        pod_namespace,
        pod_name,
    }
}

fn spec_from_proto(e: pb::Endpoint) -> Result<EndpointSpec, String> {
    let ips = e
        .ips
        .iter()
        .map(|ip| ip.parse().map_err(|_| format!("unparsable IP {ip:?}")))
        .collect::<Result<_, _>>()?;
    Ok(EndpointSpec {
        id: e.id,
        interface: e.interface,
        netns: (!e.netns.is_empty()).then(|| e.netns.into()),
        ips,
        identity: e.identity,
        allowed_identities: e.allowed_identities,
        host: e.host,
        labels: e.labels,
        pod: match (e.pod_namespace.is_empty(), e.pod_name.is_empty()) {
            (_, true) => None,
            (false, false) => Some(format!("{}/{}", e.pod_namespace, e.pod_name)),
            (true, false) => {
                return Err(format!(
                    "endpoint {}: pod {:?} has no namespace",
                    e.id, e.pod_name
                ));
            }
        },
    })
}

fn endpoint_status(s: &EndpointStatus) -> pb::EndpointStatus {
    let spec = &s.spec;
    let (pod_namespace, pod_name) = spec.pod_parts();
    pb::EndpointStatus {
        endpoint: Some(pb::Endpoint {
            id: spec.id,
            interface: spec.interface.clone(),
            netns: spec
                .netns
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            ips: spec.ips.iter().map(ToString::to_string).collect(),
            identity: spec.identity,
            allowed_identities: spec.allowed_identities.clone(),
            host: spec.host,
            labels: spec.labels.clone(),
            pod_namespace,
            pod_name,
        }),
        state: s.state.label().to_owned(),
        generation: s.generation,
        regenerated_at: s.regenerated_at.map(rfc3339),
        restored: s.restored,
        error: match &s.state {
            EndpointState::Failed(err) => Some(err.clone()),
            _ => None,
        },
    }
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}
