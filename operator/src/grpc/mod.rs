//! The `meshwork.ipam.v1.NodeIpam` gRPC service: an agent registers its node's CiliumNode
//! spec, watches the node's published snapshots (status and pool of one stored generation,
//! so a pool IP's ENI is always among the snapshot's ENIs), and reports what it handed out
//! and its release answers. The contract, error codes included, is
//! `proto/meshwork/ipam/v1/ipam.proto`.
//!
//! - [`convert`]: stored CiliumNode → `NodeSnapshot` (and the test hook's broken one).
//! - [`watch`]: `WatchNode`'s stream over the node manager's per-node `watch` channel.
//! - [`report`]: `ReportUsage`'s checks and its change to the stored object.
//! - [`register`]: `RegisterNode`'s checks and its change to the stored object.
//! - [`tls`]: the listener's TLS, and the mTLS rule (a client speaks only for the node its
//!   certificate's CN names).
//!
//! Writes go through the [`NodeStore`] with the publish path's conflict rule (re-read the
//! latest object, recompute); each written object is then handed to the node manager
//! directly, before the answer, so the generation a client gets back is one the manager
//! already knows (the store watch delivers it too, later, and is ignored as not newer).

pub mod convert;
pub mod register;
pub mod report;
pub mod tls;
pub mod watch;

use std::sync::Arc;

use actix::{Addr, MailboxError, Recipient};
use meshwork_proto::ipam::v1::node_ipam_server::{NodeIpam, NodeIpamServer};
use meshwork_proto::ipam::v1::{
    RegisterNodeRequest, RegisterNodeResponse, ReportUsageRequest, ReportUsageResponse,
    WatchNodeRequest,
};
use meshwork_types::validate_node_name;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::cilium_node::CiliumNode;
use crate::ec2::Ec2;
use crate::manager::{
    CheckGeneration, GenerationCheck, NodeEvent, NodeManager, SubscribeSnapshots,
};
use crate::node_store::{NodeStore, Part, StoreError, UpdateError, Updated};

pub use watch::{InconsistentSnapshotHook, SnapshotStream};

/// `Ok` if `node` is a CiliumNode name, else INVALID_ARGUMENT saying why.
pub fn node_name(node: &str) -> Result<(), Status> {
    validate_node_name(node).map_err(|why| {
        Status::invalid_argument(format!("node {node:?} is not a CiliumNode name: {why}"))
    })
}

/// The node manager's side of the service.
#[derive(Clone)]
struct Manager {
    subscribe: Recipient<SubscribeSnapshots>,
    check: Recipient<CheckGeneration>,
    events: Recipient<NodeEvent>,
}

/// The service, over the node manager and the node store.
#[derive(Clone)]
pub struct NodeIpamService<S> {
    manager: Manager,
    store: S,
    ec2: Ec2,
    node_is_cn: bool,
    stop: CancellationToken,
    hook: Option<Arc<InconsistentSnapshotHook>>,
}

impl<S> std::fmt::Debug for NodeIpamService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeIpamService")
            .field("node_is_cn", &self.node_is_cn)
            .field("hook", &self.hook)
            .finish_non_exhaustive()
    }
}

fn manager_gone(err: &MailboxError) -> Status {
    Status::unavailable(format!("the operator's node manager: {err}"))
}

fn store_failed(err: &StoreError) -> Status {
    match err {
        StoreError::NotFound(name) => {
            Status::not_found(format!("no CiliumNode {name:?} in the store"))
        }
        StoreError::Json { .. } | StoreError::Unnamed => Status::internal(err.to_string()),
        _ => Status::unavailable(format!("the node store did not answer: {err}")),
    }
}

impl<S: NodeStore + Clone + Unpin + 'static> NodeIpamService<S> {
    /// The service of `nodes` (the node manager), writing to `store`; `ec2` finds the type
    /// of a registered instance when the registration names none.
    pub fn new(nodes: &Addr<NodeManager<S>>, store: S, ec2: Ec2) -> Self {
        Self {
            manager: Manager {
                subscribe: nodes.clone().recipient(),
                check: nodes.clone().recipient(),
                events: nodes.clone().recipient(),
            },
            store,
            ec2,
            node_is_cn: false,
            stop: CancellationToken::new(),
            hook: None,
        }
    }
}

impl<S> NodeIpamService<S> {
    /// Requests must come from the node their client certificate's CN names
    /// (PERMISSION_DENIED otherwise): the listener is mTLS.
    #[must_use]
    pub fn node_is_cn(mut self) -> Self {
        self.node_is_cn = true;
        self
    }

    /// `WatchNode` streams end with UNAVAILABLE once `stop` is cancelled (the server's
    /// graceful shutdown waits for every stream to end).
    #[must_use]
    pub fn stop_on(mut self, stop: CancellationToken) -> Self {
        self.stop = stop;
        self
    }

    /// Arms the test hook for `node` (see [`InconsistentSnapshotHook`]). Test only.
    #[must_use]
    pub fn test_hook_inconsistent_snapshot(mut self, node: impl Into<String>) -> Self {
        self.hook = Some(Arc::new(InconsistentSnapshotHook::new(node)));
        self
    }

    /// The tonic server wrapper.
    pub fn into_server(self) -> NodeIpamServer<Self> {
        NodeIpamServer::new(self)
    }

    fn authorize(&self, cn: Option<&str>, node: &str) -> Result<(), Status> {
        if self.node_is_cn {
            tls::check_node(cn, node)?;
        }
        Ok(())
    }

    /// Hands a written object to the node manager and waits until it took it.
    async fn tell_manager(&self, event: NodeEvent) {
        if let Err(err) = self.manager.events.send(event).await {
            // The store watch delivers it anyway.
            tracing::debug!(%err, "the node manager did not take a written CiliumNode");
        }
    }
}

impl<S: NodeStore + Clone + 'static> NodeIpamService<S> {
    /// The instance's type as EC2 describes it.
    async fn describe_instance_type(&self, instance_id: &str) -> Result<String, Status> {
        match self.ec2.describe_instance_type(instance_id).await {
            Ok(Some(instance_type)) => Ok(instance_type),
            Ok(None) => Err(Status::invalid_argument(format!(
                "instance_type is empty and EC2 knows no instance {instance_id:?}"
            ))),
            Err(err) => Err(Status::unavailable(format!(
                "describing the instance type of {instance_id}: {err}"
            ))),
        }
    }

    async fn register(
        &self,
        mut registration: register::Registration,
    ) -> Result<RegisterNodeResponse, Status> {
        let mut described = false;
        loop {
            let change = |current: Option<&CiliumNode>| register::apply(&registration, current);
            let stored = match self
                .store
                .update(&registration.node, Part::Spec, change)
                .await
            {
                Ok(Updated::Written { node, created }) => {
                    tracing::info!(node = %registration.node, created, "node registered");
                    (node, created)
                }
                Ok(Updated::Unchanged(Some(node))) => (node, false),
                Ok(Updated::Unchanged(None)) => {
                    // `apply` always creates a missing object.
                    return Err(Status::internal("registration wrote no object"));
                }
                Err(UpdateError::Refused(register::NeedsInstanceType)) if !described => {
                    registration.instance_type = self
                        .describe_instance_type(&registration.instance_id)
                        .await?;
                    described = true;
                    continue;
                }
                Err(UpdateError::Refused(register::NeedsInstanceType)) => {
                    return Err(Status::internal("no instance type after describing it"));
                }
                Err(UpdateError::Store(err)) => return Err(store_failed(&err)),
            };
            let (node, created) = stored;
            let generation = node.metadata.resource_version.clone().unwrap_or_default();
            // Driven from now on, whatever the store watch's delay.
            self.tell_manager(NodeEvent::Upsert(Box::new(node))).await;
            return Ok(RegisterNodeResponse {
                created,
                generation,
            });
        }
    }

    async fn report(&self, report: report::Report) -> Result<ReportUsageResponse, Status> {
        let check = CheckGeneration {
            node: report.node.clone(),
            generation: report.generation.clone(),
        };
        let answered = match self
            .manager
            .check
            .send(check)
            .await
            .map_err(|err| manager_gone(&err))?
        {
            GenerationCheck::Unknown => {
                return Err(Status::not_found(format!(
                    "the operator drives no ENI node {:?} (register it first)",
                    report.node
                )));
            }
            GenerationCheck::Unpublished => {
                return Err(Status::failed_precondition(format!(
                    "generation {:?} was never published for node {:?}: nothing is \
                     published yet",
                    report.generation, report.node
                )));
            }
            GenerationCheck::Stale { latest } => {
                return Err(Status::failed_precondition(format!(
                    "generation {:?} is not one of node {:?}'s recent snapshots; the latest \
                     is {latest:?}",
                    report.generation, report.node
                )));
            }
            GenerationCheck::Published(generation) => generation,
        };
        let mut applied = 0;
        let change = |current: Option<&CiliumNode>| -> Result<_, report::Refusal> {
            let (node, answers) = report::apply(&report, &answered, current)?;
            applied = answers;
            Ok(node)
        };
        let node = match self.store.update(&report.node, Part::Status, change).await {
            Ok(Updated::Written { node, .. }) => node,
            Ok(Updated::Unchanged(Some(node))) => node,
            Ok(Updated::Unchanged(None)) => {
                return Err(report::Refusal::NotFound.status(&report.node));
            }
            Err(UpdateError::Refused(refusal)) => return Err(refusal.status(&report.node)),
            Err(UpdateError::Store(err)) => return Err(store_failed(&err)),
        };
        let generation = node.metadata.resource_version.clone().unwrap_or_default();
        // The generation answered is one the next report may name.
        self.tell_manager(NodeEvent::Reported(Box::new(node))).await;
        Ok(ReportUsageResponse {
            generation,
            answers_applied: applied,
        })
    }
}

#[tonic::async_trait]
impl<S: NodeStore + Clone + Unpin + 'static> NodeIpam for NodeIpamService<S> {
    async fn register_node(
        &self,
        request: Request<RegisterNodeRequest>,
    ) -> Result<Response<RegisterNodeResponse>, Status> {
        let cn = tls::client_cn(&request);
        let registration = register::validate(request.into_inner())?;
        self.authorize(cn.as_deref(), &registration.node)?;
        self.register(registration).await.map(Response::new)
    }

    type WatchNodeStream = SnapshotStream;

    async fn watch_node(
        &self,
        request: Request<WatchNodeRequest>,
    ) -> Result<Response<SnapshotStream>, Status> {
        let cn = tls::client_cn(&request);
        let node = request.into_inner().node;
        node_name(&node)?;
        self.authorize(cn.as_deref(), &node)?;
        let receiver = self
            .manager
            .subscribe
            .send(SubscribeSnapshots(node.clone()))
            .await
            .map_err(|err| manager_gone(&err))?
            .ok_or_else(|| {
                Status::not_found(format!(
                    "the operator drives no ENI node {node:?} (register it first)"
                ))
            })?;
        let stream = watch::follow(node, receiver, self.stop.clone(), self.hook.clone());
        Ok(Response::new(stream))
    }

    async fn report_usage(
        &self,
        request: Request<ReportUsageRequest>,
    ) -> Result<Response<ReportUsageResponse>, Status> {
        let cn = tls::client_cn(&request);
        let report = report::validate(request.into_inner())?;
        self.authorize(cn.as_deref(), &report.node)?;
        self.report(report).await.map(Response::new)
    }
}
