//! The datapath's wiring: the ipcache recreated at start, the writer subscribed to remote
//! events, the endpoint manager started once every configured cluster is known, and the
//! `meshwork.agent.v1.Datapath` API.

use std::time::SystemTime;

use actix::{Actor, Addr, Recipient};
use anyhow::Context as _;
use meshwork_agent_core::clustermesh::barrier_actor::{BarrierUpdate, SyncBarrierActor};
use meshwork_agent_core::clustermesh::remote_state::Settle;
use meshwork_agent_core::datapath::drops;
use meshwork_agent_core::datapath::endpoint::manager::{
    DeleteEndpoint, EndpointSettings, ListEndpoints, PutEndpoint,
};
use meshwork_agent_core::datapath::endpoint::{
    EndpointManager, EndpointSpec, EndpointState, EndpointStatus, EndpointStore,
};
use meshwork_agent_core::datapath::lb_writer::{self, LbWriter};
use meshwork_agent_core::datapath::maps::PinDir;
use meshwork_agent_core::datapath::writer_actor::{self, DatapathWriter, GetWriterReport};
use meshwork_proto::agent::v1 as pb;
use tonic::{Request, Response, Status};

use crate::args::Args;

/// The datapath's actors.
#[derive(Clone)]
pub struct Datapath {
    /// Where the maps are pinned.
    pub pins: PinDir,
    /// The ipcache writer.
    pub writer: Addr<DatapathWriter>,
    /// The endpoints, once started.
    pub endpoints: Option<Addr<EndpointManager>>,
}

impl Datapath {
    /// Recreates the ipcache (§5: every start) and starts its writer.
    pub fn start_writer(args: &Args, barrier: Recipient<BarrierUpdate>) -> anyhow::Result<Self> {
        let pins = PinDir::under(&args.bpf_root);
        let map = pins.recreate_ipcache().with_context(|| {
            format!(
                "recreating the ipcache map under {} (is bpffs mounted and the agent root?)",
                pins.path().display()
            )
        })?;
        let lb = LbWriter::open(&pins, barrier).context("opening the service and tunnel maps")?;
        let writer = DatapathWriter::new(map, args.node_ip).with_lb(lb).start();
        Ok(Self {
            pins,
            writer,
            endpoints: None,
        })
    }

    /// Restores the persisted endpoints; they regenerate after the bounded sync wait.
    pub fn start_endpoints(
        &mut self,
        args: &Args,
        barrier: &Addr<SyncBarrierActor>,
        settle: &Recipient<Settle>,
    ) {
        let settings = EndpointSettings {
            ip_identities_sync_timeout: args.clustermesh_ip_identities_sync_timeout,
            enable_ipsec: args.enable_ipsec,
        };
        let manager = EndpointManager::new(
            self.pins.clone(),
            EndpointStore::new(&args.state_dir),
            settings,
            self.writer.clone(),
            barrier.clone(),
            settle.clone(),
        );
        self.endpoints = Some(manager.start());
        writer_actor::prune_restored_when_synced(&self.writer, barrier, settle);
    }

    /// The datapath part of the status.
    pub async fn status(&self) -> pb::DatapathStatus {
        let report = self.writer.send(GetWriterReport).await.unwrap_or_default();
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
            maps: report.lb.map_or_else(Vec::new, |lb| {
                [
                    (lb_writer::SERVICES_MAP, lb.services),
                    (lb_writer::BACKENDS_MAP, lb.backends),
                    (lb_writer::TUNNEL_MAP, lb.tunnel),
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
        let spec = spec_from_proto(endpoint).map_err(Status::invalid_argument)?;
        spec.validate()
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        self.manager()?
            .send(PutEndpoint(spec))
            .await
            .map_err(|_| Status::unavailable("the agent is shutting down"))?
            .map_err(Status::internal)?;
        Ok(Response::new(pb::PutEndpointResponse {}))
    }

    async fn delete_endpoint(
        &self,
        request: Request<pb::DeleteEndpointRequest>,
    ) -> Result<Response<pb::DeleteEndpointResponse>, Status> {
        let id = request.into_inner().id;
        let existed = self
            .manager()?
            .send(DeleteEndpoint(id))
            .await
            .map_err(|_| Status::unavailable("the agent is shutting down"))?
            .map_err(Status::internal)?;
        Ok(Response::new(pb::DeleteEndpointResponse { existed }))
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
    })
}

fn endpoint_status(s: &EndpointStatus) -> pb::EndpointStatus {
    let spec = &s.spec;
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
