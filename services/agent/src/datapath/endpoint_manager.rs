//! `EndpointManager`: the actor shell of [`Endpoints`]. It restores the persisted endpoints
//! at start, regenerates them once remote clusters have synced (bounded), and handles
//! endpoint puts and deletes.
//!
//! Restored endpoints keep running their old program (bound to the previous ipcache map)
//! until they regenerate; their local entries go into the new map at once. Regeneration waits
//! for `IPIdentitiesSynced` as the datapath and the identity cache acknowledge it — the
//! datapath acknowledges a cluster's lists only once their entries are in the map, so a new
//! program never sees a map missing a remote cluster that was merely slow, and a slow
//! WireGuard device never holds regeneration up.
//!
//! The device work (ELF load, the verifier, tc attach) runs one job at a time on tokio's
//! blocking pool, so the actor answers at once meanwhile. It runs on its own arbiter.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use actix::{
    Actor, ActorContext, ActorFutureExt as _, Addr, Arbiter, AsyncContext, Context, Handler,
    Message, MessageResult, Recipient, ResponseFuture, WrapFuture as _,
};
use meshwork_clustermesh::Consumer;
use meshwork_clustermesh::barrier::WaitOutcome;
use meshwork_clustermesh::barrier_actor::GetMeshWait;
use meshwork_clustermesh::timeline::{Step, TimelineRecorder, Waiter};
use meshwork_datapath::endpoint::plan::restore_plan;
use meshwork_datapath::endpoint::store::StoreError;
use meshwork_datapath::endpoint::{EndpointSpec, EndpointStatus, EndpointStore, Endpoints, Job};
use meshwork_datapath::maps::PinDir;
use meshwork_datapath::program::ProgramError;
use meshwork_types::SyncKind;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::metrics::EndpointMetrics;
use super::writer_actor::{DatapathWriter, RemoveLocalEndpoint, SetLocalEndpoint};

/// What regeneration waits for: the datapath's maps and the identity cache, not WireGuard.
pub const REGENERATION_WAITS_FOR: &[Consumer] = &[Consumer::Datapath, Consumer::Identities];

/// Warned once per process, like Cilium.
static WAIT_TIMEOUT_WARNED: AtomicBool = AtomicBool::new(false);

/// Settings of the manager.
#[derive(Debug, Clone)]
pub struct EndpointSettings {
    /// `--clustermesh-ip-identities-sync-timeout`.
    pub ip_identities_sync_timeout: Duration,
    /// `--enable-ipsec`.
    pub enable_ipsec: bool,
    /// Where the wait and each regeneration are recorded (the restart timeline).
    pub timeline: TimelineRecorder,
}

/// Why an endpoint request failed.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// The spec is not valid.
    #[error(transparent)]
    Spec(#[from] meshwork_datapath::endpoint::spec::SpecError),
    /// Persisting it failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Its program could not be loaded, attached or detached.
    #[error(transparent)]
    Program(#[from] ProgramError),
    /// The endpoint was deleted before it regenerated.
    #[error("endpoint {0} was deleted before it regenerated")]
    Deleted(u64),
    /// The manager stopped before the job ran.
    #[error("the endpoint manager stopped")]
    Stopped,
}

type Reply = oneshot::Sender<Result<(), EndpointError>>;

/// The actor; see the module docs.
pub struct EndpointManager {
    pins: PinDir,
    store: EndpointStore,
    settings: EndpointSettings,
    writer: Addr<DatapathWriter>,
    barrier: Recipient<GetMeshWait>,
    endpoints: Endpoints,
    /// Who waits for which job's outcome.
    replies: Vec<(Job, Reply)>,
    metrics: EndpointMetrics,
}

impl EndpointManager {
    /// A manager of the endpoints persisted in `store`, attaching programs bound to `pins`;
    /// regenerations are counted in `metrics`.
    pub fn new(
        pins: PinDir,
        store: EndpointStore,
        settings: EndpointSettings,
        writer: Addr<DatapathWriter>,
        barrier: Recipient<GetMeshWait>,
        metrics: EndpointMetrics,
    ) -> Self {
        Self {
            pins,
            store,
            settings,
            writer,
            barrier,
            endpoints: Endpoints::new(),
            replies: Vec::new(),
            metrics,
        }
    }

    /// Starts the manager on an arbiter of its own.
    pub fn start_own_arbiter(self) -> Addr<Self> {
        Self::start_in_arbiter(&Arbiter::new().handle(), |_| self)
    }

    /// Runs the next queued job, if none runs.
    fn run_next(&mut self, ctx: &mut Context<Self>) {
        let Some(job) = self.endpoints.next_job() else {
            return;
        };
        let pins = self.pins.clone();
        let work = tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let outcome = job.run(&pins);
            (job, outcome, started.elapsed())
        });
        ctx.spawn(work.into_actor(self).map(|done, actor, ctx| {
            match done {
                Ok((job, outcome, took)) => {
                    actor.endpoints.finished(&job, &outcome);
                    actor.record(&job, &outcome, took);
                    actor.reply(&job, outcome.map_err(EndpointError::from));
                }
                Err(err) => tracing::error!(%err, "an endpoint job panicked"),
            }
            actor.run_next(ctx);
        }));
    }

    /// Puts a finished regeneration, which took `took`, on the timeline and in the metrics.
    fn record(&self, job: &Job, outcome: &Result<(), ProgramError>, took: Duration) {
        if let Job::Regenerate { spec, .. } = job {
            self.metrics.regenerated(outcome.is_ok(), took);
            self.settings.timeline.record(Step::EndpointRegenerated {
                endpoint: spec.id,
                error: outcome.as_ref().err().map(ToString::to_string),
            });
        }
    }

    /// Answers whoever waits for `job`.
    fn reply(&mut self, job: &Job, outcome: Result<(), EndpointError>) {
        if let Some(at) = self.replies.iter().position(|(awaited, _)| awaited == job) {
            let (_, reply) = self.replies.swap_remove(at);
            let _ = reply.send(outcome);
        }
    }

    /// Queues a reply for `job` and starts it if nothing runs.
    fn reply_when_done(
        &mut self,
        job: Job,
        ctx: &mut Context<Self>,
    ) -> ResponseFuture<Result<(), EndpointError>> {
        let (tx, rx) = oneshot::channel();
        self.replies.push((job, tx));
        self.run_next(ctx);
        Box::pin(async move { rx.await.unwrap_or(Err(EndpointError::Stopped)) })
    }
}
impl Actor for EndpointManager {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let (restored, errors) = self.store.load_all();
        for err in errors {
            tracing::error!(%err, "an endpoint could not be restored; its file is kept");
        }
        let plan = restore_plan(
            &restored,
            self.settings.enable_ipsec,
            self.settings.ip_identities_sync_timeout,
        );
        // The restored endpoints' own entries go into the new map before any program uses it.
        let declared: Vec<_> = restored
            .iter()
            .map(|spec| self.writer.send(SetLocalEndpoint::of(spec)))
            .collect();
        self.endpoints.restore(restored);
        // With IPsec the host endpoint regenerates first and synchronously (§5), before the
        // manager answers anything.
        self.endpoints.regenerate(plan.immediate.iter().copied());
        while let Some(job) = self.endpoints.next_job() {
            let started = std::time::Instant::now();
            let outcome = job.run(&self.pins);
            self.endpoints.finished(&job, &outcome);
            self.record(&job, &outcome, started.elapsed());
        }
        if plan.after_wait.is_empty() {
            return;
        }
        tracing::info!(
            endpoints = plan.after_wait.len(),
            timeout = ?plan.wait_timeout,
            "waiting for remote clusters (ipcache, identities, nodes) before regenerating restored endpoints"
        );
        let barrier = self.barrier.clone();
        let timeline = self.settings.timeline.clone();
        let deadline = Instant::now() + plan.wait_timeout;
        let wait = async move {
            futures::future::join_all(declared).await;
            let outcome = match barrier
                .send(GetMeshWait::only(
                    SyncKind::IpIdentities,
                    REGENERATION_WAITS_FOR,
                ))
                .await
            {
                Ok(wait) => wait.wait(Some(deadline)).await,
                Err(_) => Ok(WaitOutcome::Synced),
            };
            timeline.wait_returned(Waiter::Regeneration, SyncKind::IpIdentities, &outcome);
            if !matches!(outcome, Ok(WaitOutcome::Synced))
                && !WAIT_TIMEOUT_WARNED.swap(true, Ordering::Relaxed)
            {
                tracing::warn!(
                    "remote clusters did not sync ipcache and identities within the timeout; \
                     regenerating restored endpoints anyway, expect possible disruption of \
                     cross-cluster connections"
                );
            }
        };
        ctx.spawn(wait.into_actor(self).map(move |(), actor, ctx| {
            // Deleted during the wait: only that endpoint is skipped.
            actor.endpoints.regenerate(plan.after_wait);
            actor.run_next(ctx);
        }));
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        Arbiter::current().stop();
    }
}

/// Creates or replaces an endpoint; answers once it has regenerated.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<(), EndpointError>")]
pub struct PutEndpoint(pub EndpointSpec);

impl Handler<PutEndpoint> for EndpointManager {
    type Result = ResponseFuture<Result<(), EndpointError>>;

    fn handle(&mut self, PutEndpoint(spec): PutEndpoint, ctx: &mut Context<Self>) -> Self::Result {
        if let Err(err) = spec.validate().map_err(EndpointError::from).and_then(|()| {
            self.store.save(&spec)?;
            Ok(())
        }) {
            return Box::pin(async move { Err(err) });
        }
        self.writer.do_send(SetLocalEndpoint::of(&spec));
        let job = self.endpoints.put(spec);
        self.reply_when_done(job, ctx)
    }
}

/// Deletes an endpoint: its program is detached, its entries and file removed. Answers
/// whether it existed, once its program is detached.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Result<bool, EndpointError>")]
pub struct DeleteEndpoint(pub u64);

impl Handler<DeleteEndpoint> for EndpointManager {
    type Result = ResponseFuture<Result<bool, EndpointError>>;

    fn handle(
        &mut self,
        DeleteEndpoint(id): DeleteEndpoint,
        ctx: &mut Context<Self>,
    ) -> Self::Result {
        if let Err(err) = self.store.remove(id) {
            return Box::pin(async move { Err(err.into()) });
        }
        let Some((detach, dropped)) = self.endpoints.delete(id) else {
            return Box::pin(async { Ok(false) });
        };
        for job in dropped {
            self.reply(&job, Err(EndpointError::Deleted(id)));
        }
        self.writer.do_send(RemoveLocalEndpoint(id));
        let detached = self.reply_when_done(detach, ctx);
        Box::pin(async move { detached.await.map(|()| true) })
    }
}

/// Lists the endpoints by ID.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Vec<EndpointStatus>")]
pub struct ListEndpoints;

impl Handler<ListEndpoints> for EndpointManager {
    type Result = MessageResult<ListEndpoints>;

    fn handle(&mut self, _: ListEndpoints, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.endpoints.list())
    }
}

/// Stops the manager and its arbiter; attached programs stay.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct Stop;

impl Handler<Stop> for EndpointManager {
    type Result = ();

    fn handle(&mut self, _: Stop, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
