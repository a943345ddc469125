//! `DatapathWriter`: the actor shell of [`MapWriter`]. It runs on its own arbiter (map writes
//! are syscalls that must not stall the mesh), applies every batch of remote events in order,
//! acknowledges a batch's list-dones to the barrier once written, and prunes restored state
//! when the mesh-wide waits that guard it are over. Its report is published after every
//! message, so status never waits for its mailbox.

use std::net::IpAddr;
use std::sync::Arc;

use actix::{
    Actor, ActorContext, ActorFutureExt as _, Arbiter, AsyncContext, Context, Handler, Message,
    Recipient, WrapFuture as _,
};
use meshwork_clustermesh::Consumer;
use meshwork_clustermesh::barrier_actor::{BarrierUpdate, GetMeshWait};
use meshwork_clustermesh::events::RemoteEvents;
use meshwork_clustermesh::timeline::{Step, TimelineRecorder, Waiter};
use meshwork_datapath::writer::{MapWriter, WriterReport};
use meshwork_types::{ClusterService, SyncKind};
use tokio::sync::watch;

/// The datapath's own acknowledgements: what a wait that guards its restored state counts.
pub const DATAPATH: &[Consumer] = &[Consumer::Datapath];

/// The actor; see the module docs.
pub struct DatapathWriter {
    writer: MapWriter,
    barrier: Recipient<BarrierUpdate>,
    report: watch::Sender<WriterReport>,
}

impl DatapathWriter {
    /// A shell over `writer`, acknowledging to `barrier`.
    pub fn new(writer: MapWriter, barrier: Recipient<BarrierUpdate>) -> Self {
        let report = watch::Sender::new(writer.report());
        Self {
            writer,
            barrier,
            report,
        }
    }

    /// The writer's report, as of its last message.
    pub fn report(&self) -> watch::Receiver<WriterReport> {
        self.report.subscribe()
    }

    fn publish(&self) {
        self.report.send_replace(self.writer.report());
    }
}

impl Actor for DatapathWriter {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // A batch written behind is counted (and its errors reported) when it is done, not
        // when the next batch comes. Weak: the flush thread must not keep the actor alive.
        let actor = ctx.address().downgrade();
        self.writer.on_flushed(move || {
            if let Some(actor) = actor.upgrade() {
                actor.do_send(Flushed);
            }
        });
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        Arbiter::current().stop();
    }
}

impl Handler<RemoteEvents> for DatapathWriter {
    type Result = ();

    fn handle(&mut self, batch: RemoteEvents, _: &mut Context<Self>) {
        self.writer.apply_remote(&batch.cluster.name, &batch.events);
        for ack in batch.applied_by(Consumer::Datapath) {
            self.barrier.do_send(ack);
        }
        self.publish();
    }
}

/// A batch written behind is done: its outcome goes into the report.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
struct Flushed;

impl Handler<Flushed> for DatapathWriter {
    type Result = ();

    fn handle(&mut self, _: Flushed, _: &mut Context<Self>) {
        self.writer.collect_flushed();
        self.publish();
    }
}

/// Sets the ipcache entries of a local endpoint (replacing its earlier ones); answers once
/// they are in the map.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct SetLocalEndpoint {
    /// The endpoint.
    pub id: u64,
    /// Its IPs (host entries).
    pub ips: Vec<IpAddr>,
    /// Its identity.
    pub identity: u32,
}

impl SetLocalEndpoint {
    /// The entries of `spec`.
    pub fn of(spec: &meshwork_datapath::endpoint::EndpointSpec) -> Self {
        Self {
            id: spec.id,
            ips: spec.ips.clone(),
            identity: spec.identity,
        }
    }
}

impl Handler<SetLocalEndpoint> for DatapathWriter {
    type Result = ();

    fn handle(&mut self, msg: SetLocalEndpoint, _: &mut Context<Self>) {
        self.writer.set_local(msg.id, &msg.ips, msg.identity);
        self.publish();
    }
}

/// Removes a deleted endpoint's entries.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct RemoveLocalEndpoint(pub u64);

impl Handler<RemoveLocalEndpoint> for DatapathWriter {
    type Result = ();

    fn handle(&mut self, RemoveLocalEndpoint(id): RemoveLocalEndpoint, _: &mut Context<Self>) {
        self.writer.remove_local(id);
        self.publish();
    }
}

/// The local cluster's services, whole, as the apiserver last sent them (each replaces the
/// one before); the first makes the local state known and runs the first prune pass.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct LocalServices {
    /// The local cluster's name.
    pub cluster: Arc<str>,
    /// Its ID.
    pub cluster_id: u32,
    /// Its services, shared or not.
    pub services: Vec<Arc<ClusterService>>,
}

impl Handler<LocalServices> for DatapathWriter {
    type Result = ();

    fn handle(&mut self, msg: LocalServices, _: &mut Context<Self>) {
        let before = deleted(&self.writer.report());
        self.writer
            .apply_local_services(&msg.cluster, msg.cluster_id, msg.services);
        let removed = deleted(&self.writer.report()).saturating_sub(before);
        if removed > 0 {
            tracing::info!(removed, "pruned restored local service state");
        }
        self.publish();
    }
}

/// Every configured cluster is known to the barrier: wait (bounded by the circuit breaker)
/// for `ServicesSynced` and `NodesSynced` of this writer's own acknowledgements, then prune
/// the restored services, backends and tunnel entries they guard — never before.
#[derive(Message)]
#[rtype(result = "()")]
pub struct PruneWhenSynced {
    /// Where the waits come from.
    pub barrier: Recipient<GetMeshWait>,
    /// Where each wait and prune pass is recorded (the restart timeline).
    pub timeline: TimelineRecorder,
}

impl Handler<PruneWhenSynced> for DatapathWriter {
    type Result = ();

    fn handle(&mut self, prune: PruneWhenSynced, ctx: &mut Context<Self>) {
        for kind in [SyncKind::Services, SyncKind::Nodes] {
            let barrier = prune.barrier.clone();
            let timeline = prune.timeline.clone();
            let waited = async move {
                let wait = barrier.send(GetMeshWait::only(kind, DATAPATH)).await.ok()?;
                // No deadline of its own: the barrier's circuit breaker bounds it.
                let outcome = wait.wait(None).await;
                timeline.wait_returned(Waiter::Prune, kind, &outcome);
                outcome.ok()
            };
            let timeline = prune.timeline.clone();
            ctx.spawn(waited.into_actor(self).map(move |outcome, actor, _| {
                if outcome.is_some() {
                    tracing::info!(wait = kind.cilium_name(), "pruning restored datapath state");
                    let before = deleted(&actor.writer.report());
                    actor.writer.synced(kind);
                    let removed = deleted(&actor.writer.report()).saturating_sub(before);
                    timeline.record(Step::Pruned { kind, removed });
                    actor.publish();
                }
            }));
        }
    }
}

/// Entries deleted from the service, backend and tunnel maps so far.
fn deleted(report: &WriterReport) -> u64 {
    report.remote_maps.as_ref().map_or(0, |maps| {
        maps.services.deleted + maps.backends.deleted + maps.tunnel.deleted
    })
}

/// Stops the actor and its arbiter; the maps stay as they are.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct Stop;

impl Handler<Stop> for DatapathWriter {
    type Result = ();

    fn handle(&mut self, _: Stop, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
