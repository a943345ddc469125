//! `meshwork.apiserver.v1.Export`: each agent's publishing session and the service calls,
//! checked ([`crate::validate`]) and handed to the [`Exporter`](crate::exporter::Exporter)
//! loop as commands. A refused request is answered with a gRPC error naming what is wrong,
//! counted by reason, and writes nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::FutureExt as _;
use meshwork_proto::apiserver::v1 as pb;
use pb::publish_request::Request as Publish;
use pb::publish_response::Response as Answer;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status, Streaming};

use crate::exporter::{Command, LocalServices, Session};
use crate::metrics::ApiserverMetrics;
use crate::state::{EndpointSpec, Refused, ServiceSpec};
use crate::validate::{self, Invalid};

/// Answers queued per session before the session waits for its client to read them.
const SESSION_QUEUE: usize = 256;
/// Messages of one session taken together, at most.
const MAX_BATCH: usize = 256;
/// The largest request accepted (tonic's default, made explicit): a node or an endpoint is a
/// few hundred bytes, so anything near this is not one.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// The service; clones share the loop and the metrics.
#[derive(Debug, Clone)]
pub struct ExportService {
    commands: mpsc::Sender<Command>,
    metrics: ApiserverMetrics,
    sessions: Arc<AtomicU64>,
    /// Clients present certificates (mTLS): a session publishes only the node its CN names.
    node_is_cn: bool,
}

impl ExportService {
    /// A service sending its commands to the loop at `commands`.
    pub fn new(commands: mpsc::Sender<Command>, metrics: ApiserverMetrics) -> Self {
        Self {
            commands,
            metrics,
            sessions: Arc::new(AtomicU64::new(0)),
            node_is_cn: false,
        }
    }

    /// With mTLS: a session may publish only the node its client certificate's CN names.
    pub fn node_is_cn(mut self) -> Self {
        self.node_is_cn = true;
        self
    }

    fn check_cn(
        &self,
        certificates: Option<&[tonic::transport::CertificateDer<'static>]>,
        node: &str,
    ) -> Result<(), Status> {
        if !self.node_is_cn {
            return Ok(());
        }
        let cn = certificates
            .and_then(|certs| certs.first())
            .and_then(|der| common_name(der.as_ref()));
        match cn {
            Some(cn) if cn == node => Ok(()),
            other => {
                self.metrics.refuse("cn_mismatch");
                Err(Status::permission_denied(format!(
                    "a client whose certificate's CN is {other:?} may not publish node {node:?}"
                )))
            }
        }
    }

    /// The tonic server wrapper; a request larger than [`MAX_MESSAGE_BYTES`] is refused.
    pub fn into_server(self) -> pb::export_server::ExportServer<Self> {
        pb::export_server::ExportServer::new(self).max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// A failure to read a publish stream's next message; an oversized one (tonic answers
    /// `OUT_OF_RANGE` for it) is counted.
    fn inbound_error(&self, status: Status) -> Status {
        if matches!(status.code(), Code::OutOfRange | Code::ResourceExhausted) {
            self.metrics.refuse("oversized");
        }
        status
    }

    fn invalid(&self, err: &Invalid) -> Status {
        self.metrics.refuse(err.reason);
        Status::invalid_argument(err.message.clone())
    }

    fn refused(&self, err: &Refused) -> Status {
        self.metrics.refuse(err.reason());
        let message = err.to_string();
        match err {
            Refused::OutsidePodCidr { .. } => Status::invalid_argument(message),
            Refused::CidrOverlap { .. } | Refused::UnknownNode(_) => {
                Status::failed_precondition(message)
            }
            Refused::Exhausted(_) => Status::resource_exhausted(message),
        }
    }

    /// Sends the command `make` builds around a reply channel, and awaits the reply.
    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Result<T, Status> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(make(reply))
            .await
            .map_err(|_| shutting_down())?;
        answer.await.map_err(|_| shutting_down())
    }

    /// Messages of `session` in order; runs of endpoints go to the loop as one command.
    async fn handle_batch(
        &self,
        session: &Session,
        batch: Vec<pb::PublishRequest>,
        out: &mpsc::Sender<Result<pb::PublishResponse, Status>>,
    ) -> Result<(), Status> {
        let mut run = Vec::new();
        for message in batch {
            if let Some(Publish::Endpoint(endpoint)) = &message.request {
                match validate::endpoint(endpoint) {
                    Ok(spec) => {
                        run.push(spec);
                        continue;
                    }
                    Err(err) => {
                        // What came before the bad one is applied, nothing after it.
                        self.put_endpoints(session, run, out).await?;
                        return Err(self.invalid(&err));
                    }
                }
            }
            self.put_endpoints(session, std::mem::take(&mut run), out)
                .await?;
            self.handle(session, message, out).await?;
        }
        self.put_endpoints(session, run, out).await
    }

    /// Puts `specs` (in order) and answers each one's identity, up to the first refused.
    async fn put_endpoints(
        &self,
        session: &Session,
        specs: Vec<EndpointSpec>,
        out: &mpsc::Sender<Result<pb::PublishResponse, Status>>,
    ) -> Result<(), Status> {
        if specs.is_empty() {
            return Ok(());
        }
        let ids: Vec<u64> = specs.iter().map(|spec| spec.id).collect();
        let answers = self
            .ask(|reply| Command::PutEndpoints(session.clone(), specs, reply))
            .await
            .map_err(|_| replaced(session))?;
        for (endpoint_id, answer) in ids.into_iter().zip(answers) {
            let identity = answer.map_err(|e| self.refused(&e))?;
            let response = pb::PublishResponse {
                response: Some(Answer::Identity(pb::EndpointIdentity {
                    endpoint_id,
                    identity,
                })),
            };
            out.send(Ok(response))
                .await
                .map_err(|_| Status::cancelled("the client went"))?;
        }
        Ok(())
    }

    /// One message of `session` other than an endpoint; an answer goes to `out`.
    async fn handle(
        &self,
        session: &Session,
        message: pb::PublishRequest,
        out: &mpsc::Sender<Result<pb::PublishResponse, Status>>,
    ) -> Result<(), Status> {
        let answer = match message.request {
            None => return Err(self.invalid(&empty_message())),
            Some(Publish::Node(node)) => {
                let spec = validate::node(&node).map_err(|e| self.invalid(&e))?;
                if spec.name != session.node {
                    self.metrics.refuse("node_renamed");
                    return Err(Status::invalid_argument(format!(
                        "the session publishes node {:?}, not {:?}",
                        session.node, spec.name
                    )));
                }
                self.ask(|reply| Command::PublishNode(session.clone(), spec, reply))
                    .await?
                    .map_err(|e| self.refused(&e))?;
                None
            }
            Some(Publish::Endpoint(endpoint)) => {
                let spec = validate::endpoint(&endpoint).map_err(|e| self.invalid(&e))?;
                return self.put_endpoints(session, vec![spec], out).await;
            }
            Some(Publish::DeletedEndpoint(id)) => {
                let command = Command::DeleteEndpoint(session.clone(), id);
                self.commands
                    .send(command)
                    .await
                    .map_err(|_| shutting_down())?;
                None
            }
            Some(Publish::InitialStateComplete(_)) => {
                self.ask(|reply| Command::InitialStateComplete(session.clone(), reply))
                    .await
                    .map_err(|_| replaced(session))?;
                Some(Answer::InitialStateWritten(true))
            }
        };
        if let Some(answer) = answer {
            let response = pb::PublishResponse {
                response: Some(answer),
            };
            // A client that no longer reads ends the session.
            out.send(Ok(response))
                .await
                .map_err(|_| Status::cancelled("the client went"))?;
        }
        Ok(())
    }
}

/// The subject's common name of a DER certificate.
fn common_name(der: &[u8]) -> Option<String> {
    let (_, certificate) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = certificate.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_owned)
}

fn shutting_down() -> Status {
    Status::unavailable("the apiserver is shutting down")
}

fn replaced(session: &Session) -> Status {
    Status::aborted(format!(
        "a newer session of node {:?} replaced this one",
        session.node
    ))
}

fn empty_message() -> Invalid {
    Invalid {
        reason: "empty_message",
        message: "a publish request carries nothing".to_owned(),
    }
}

/// Reads `session`'s messages until its stream ends or one is refused, then tells the loop
/// the session is gone.
async fn run_session(
    service: ExportService,
    session: Session,
    mut inbound: Streaming<pb::PublishRequest>,
    out: mpsc::Sender<Result<pb::PublishResponse, Status>>,
) {
    let ended = loop {
        let mut batch = match inbound.message().await {
            Ok(Some(message)) => vec![message],
            Ok(None) => break Ok(()),
            Err(status) => break Err(service.inbound_error(status)),
        };
        // And whatever else has arrived already, so a burst costs the loop one command.
        let mut end = None;
        while batch.len() < MAX_BATCH {
            match inbound.message().now_or_never() {
                Some(Ok(Some(message))) => batch.push(message),
                Some(Ok(None)) => {
                    end = Some(Ok(()));
                    break;
                }
                Some(Err(status)) => {
                    end = Some(Err(service.inbound_error(status)));
                    break;
                }
                None => break,
            }
        }
        if let Err(status) = service.handle_batch(&session, batch, &out).await {
            break Err(status);
        }
        if let Some(end) = end {
            break end;
        }
    };
    if let Err(status) = ended {
        tracing::info!(node = %session.node, %status, "publishing session ended with an error");
        let _ = out.send(Err(status)).await;
    }
    let _ = service.commands.send(Command::SessionClosed(session)).await;
}

/// Sends the session the cluster's services each time they change (the first time once the
/// initial state is complete), until the session ends.
async fn send_local_services(
    mut services: watch::Receiver<Option<LocalServices>>,
    out: mpsc::Sender<Result<pb::PublishResponse, Status>>,
    mut session_ended: oneshot::Receiver<()>,
) {
    loop {
        let current = services.borrow_and_update().clone();
        if let Some(current) = current {
            let response = pb::PublishResponse {
                response: Some(Answer::LocalServices(pb::LocalServices {
                    services: current
                        .iter()
                        .map(|(spec, backends)| service_to_proto(spec, backends))
                        .collect(),
                })),
            };
            if out.send(Ok(response)).await.is_err() {
                return;
            }
        }
        tokio::select! {
            changed = services.changed() => if changed.is_err() { return },
            _ = &mut session_ended => return,
        }
    }
}

fn service_to_proto(spec: &ServiceSpec, backends: &[std::net::IpAddr]) -> pb::ServiceStatus {
    pb::ServiceStatus {
        service: Some(crate::declarations::to_proto(spec)),
        backends: backends.iter().map(ToString::to_string).collect(),
    }
}

#[tonic::async_trait]
impl pb::export_server::Export for ExportService {
    type PublishStream = ReceiverStream<Result<pb::PublishResponse, Status>>;

    async fn publish(
        &self,
        request: Request<Streaming<pb::PublishRequest>>,
    ) -> Result<Response<Self::PublishStream>, Status> {
        let certificates = request.peer_certs();
        let mut inbound = request.into_inner();
        let first = inbound
            .message()
            .await
            .map_err(|status| self.inbound_error(status))?
            .ok_or_else(|| {
                self.metrics.refuse("no_node");
                Status::invalid_argument("the session ended before it published its node")
            })?;
        let Some(Publish::Node(node)) = first.request else {
            self.metrics.refuse("no_node");
            return Err(Status::invalid_argument(
                "the first message of a session must carry the node",
            ));
        };
        let spec = validate::node(&node).map_err(|e| self.invalid(&e))?;
        self.check_cn(certificates.as_deref().map(Vec::as_slice), &spec.name)?;
        let session = Session {
            node: spec.name.clone(),
            id: self.sessions.fetch_add(1, Ordering::Relaxed) + 1,
        };
        self.ask(|reply| Command::PublishNode(session.clone(), spec, reply))
            .await?
            .map_err(|e| self.refused(&e))?;
        tracing::info!(node = %session.node, session = session.id, "agent publishing");
        let local_services = self.ask(Command::WatchLocalServices).await?;
        let service = self.clone();
        let (out, answers) = mpsc::channel(SESSION_QUEUE);
        // Dropped when the session ends: the services stop too, so the stream closes.
        let (session_ended, ended) = oneshot::channel::<()>();
        tokio::spawn(send_local_services(local_services, out.clone(), ended));
        tokio::spawn(async move {
            run_session(service, session, inbound, out).await;
            drop(session_ended);
        });
        Ok(Response::new(ReceiverStream::new(answers)))
    }

    async fn put_service(
        &self,
        request: Request<pb::PutServiceRequest>,
    ) -> Result<Response<pb::PutServiceResponse>, Status> {
        let service = request.into_inner().service.ok_or_else(|| {
            self.metrics.refuse("invalid_service");
            Status::invalid_argument("the request carries no service")
        })?;
        let spec = validate::service(&service).map_err(|e| self.invalid(&e))?;
        let backends = self.ask(|reply| Command::PutService(spec, reply)).await?;
        Ok(Response::new(pb::PutServiceResponse {
            backends: u32::try_from(backends).unwrap_or(u32::MAX),
        }))
    }

    async fn delete_service(
        &self,
        request: Request<pb::DeleteServiceRequest>,
    ) -> Result<Response<pb::DeleteServiceResponse>, Status> {
        let pb::DeleteServiceRequest { namespace, name } = request.into_inner();
        validate::namespaced_name(&namespace, &name).map_err(|e| self.invalid(&e))?;
        let existed = self
            .ask(|reply| Command::DeleteService(namespace, name, reply))
            .await?;
        Ok(Response::new(pb::DeleteServiceResponse { existed }))
    }

    async fn list_services(
        &self,
        _: Request<pb::ListServicesRequest>,
    ) -> Result<Response<pb::ListServicesResponse>, Status> {
        let services = self.ask(Command::ListServices).await?;
        Ok(Response::new(pb::ListServicesResponse {
            services: services
                .iter()
                .map(|(spec, backends)| service_to_proto(spec, backends))
                .collect(),
        }))
    }

    async fn delete_node(
        &self,
        request: Request<pb::DeleteNodeRequest>,
    ) -> Result<Response<pb::DeleteNodeResponse>, Status> {
        let name = request.into_inner().name;
        validate::node_name(&name).map_err(|e| self.invalid(&e))?;
        let existed = self
            .ask(|reply| Command::DeleteNode(name.clone(), reply))
            .await?
            .map_err(|err| Status::failed_precondition(format!("node {name:?}: {err}")))?;
        Ok(Response::new(pb::DeleteNodeResponse { existed }))
    }
}
