//! `EndpointManager`: restores persisted endpoints at start, regenerates them once remote
//! clusters have synced (bounded), and handles endpoint create/delete.
//!
//! Restored endpoints keep running their old program (bound to the previous ipcache map) until
//! they regenerate; their local entries go into the new map at once. Regeneration waits for
//! `IPIdentitiesSynced`, then for the synced entries to reach the map ([`Settle`]), so the new
//! program never sees a map missing a remote cluster that was merely slow.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use actix::{
    Actor, ActorFutureExt as _, Addr, AsyncContext, Context, Handler, Message, MessageResult,
    Recipient, WrapFuture as _,
};
use tokio::time::Instant;

use super::plan::restore_plan;
use super::spec::EndpointSpec;
use super::store::EndpointStore;
use crate::clustermesh::barrier::WaitOutcome;
use crate::clustermesh::barrier_actor::{GetMeshWait, SyncBarrierActor};
use crate::clustermesh::kinds::SyncKind;
use crate::clustermesh::remote_state::Settle;
use crate::datapath::maps::PinDir;
use crate::datapath::program;
use crate::datapath::writer_actor::{DatapathWriter, RemoveLocalEndpoint, SetLocalEndpoint};

/// Warned once per process, like Cilium.
static WAIT_TIMEOUT_WARNED: AtomicBool = AtomicBool::new(false);

/// Where an endpoint is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndpointState {
    /// Restored; its old program runs until remote clusters have synced.
    WaitingForSync,
    /// Its program is attached, bound to the current maps.
    Ready,
    /// The last regeneration failed.
    Failed(String),
}

impl EndpointState {
    /// The label `meshctl endpoint list` shows.
    pub fn label(&self) -> &'static str {
        match self {
            Self::WaitingForSync => "waiting-for-sync",
            Self::Ready => "ready",
            Self::Failed(_) => "failed",
        }
    }
}

/// An endpoint and its state.
#[derive(Debug, Clone)]
pub struct EndpointStatus {
    /// The spec.
    pub spec: EndpointSpec,
    /// The state.
    pub state: EndpointState,
    /// Regenerations by this agent process.
    pub generation: u64,
    /// When it last regenerated.
    pub regenerated_at: Option<SystemTime>,
    /// Restored from the state dir at start.
    pub restored: bool,
}

/// Settings of the manager.
#[derive(Debug, Clone)]
pub struct EndpointSettings {
    /// `--clustermesh-ip-identities-sync-timeout`.
    pub ip_identities_sync_timeout: Duration,
    /// `--enable-ipsec`.
    pub enable_ipsec: bool,
}

/// The actor; see the module docs.
pub struct EndpointManager {
    pins: PinDir,
    store: EndpointStore,
    settings: EndpointSettings,
    writer: Addr<DatapathWriter>,
    barrier: Addr<SyncBarrierActor>,
    settle: Recipient<Settle>,
    endpoints: BTreeMap<u64, EndpointStatus>,
}

impl EndpointManager {
    /// A manager of the endpoints persisted in `store`, attaching programs bound to `pins`.
    pub fn new(
        pins: PinDir,
        store: EndpointStore,
        settings: EndpointSettings,
        writer: Addr<DatapathWriter>,
        barrier: Addr<SyncBarrierActor>,
        settle: Recipient<Settle>,
    ) -> Self {
        Self {
            pins,
            store,
            settings,
            writer,
            barrier,
            settle,
            endpoints: BTreeMap::new(),
        }
    }

    fn regenerate(&mut self, id: u64) {
        let Some(endpoint) = self.endpoints.get_mut(&id) else {
            return;
        };
        let allowed = &endpoint.spec.allowed_identities;
        match program::load_and_attach(&self.pins, &endpoint.spec.attach_point(), allowed) {
            Ok(()) => {
                endpoint.state = EndpointState::Ready;
                endpoint.generation += 1;
                endpoint.regenerated_at = Some(SystemTime::now());
                tracing::info!(
                    endpoint = id,
                    generation = endpoint.generation,
                    "endpoint regenerated"
                );
            }
            Err(err) => {
                tracing::error!(endpoint = id, %err, "endpoint regeneration failed");
                endpoint.state = EndpointState::Failed(err.to_string());
            }
        }
    }

    fn declare(&mut self, spec: EndpointSpec, state: EndpointState, restored: bool) {
        self.writer.do_send(SetLocalEndpoint {
            id: spec.id,
            ips: spec.ips.clone(),
            identity: spec.identity,
        });
        self.endpoints.insert(
            spec.id,
            EndpointStatus {
                spec,
                state,
                generation: 0,
                regenerated_at: None,
                restored,
            },
        );
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
        for spec in restored {
            self.declare(spec, EndpointState::WaitingForSync, true);
        }
        for id in &plan.immediate {
            self.regenerate(*id);
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
        let settle = self.settle.clone();
        let deadline = Instant::now() + plan.wait_timeout;
        let wait = async move {
            let outcome = match barrier.send(GetMeshWait(SyncKind::IpIdentities)).await {
                Ok(wait) => wait.wait(Some(deadline)).await,
                Err(_) => Ok(WaitOutcome::Synced),
            };
            match outcome {
                Ok(WaitOutcome::Synced) => {}
                Ok(WaitOutcome::BreakerFired { .. }) | Err(_) => {
                    if !WAIT_TIMEOUT_WARNED.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            "remote clusters did not sync ipcache and identities within the timeout; \
                             regenerating restored endpoints anyway, expect possible disruption of \
                             cross-cluster connections"
                        );
                    }
                }
            }
            // The synced entries must be in the map before any program is bound to it.
            let _ = settle.send(Settle).await;
        };
        ctx.spawn(wait.into_actor(self).map(move |(), actor, _| {
            for id in plan.after_wait {
                // Deleted during the wait: only that endpoint is skipped.
                if actor.endpoints.contains_key(&id) {
                    actor.regenerate(id);
                }
            }
        }));
    }
}

/// Creates or replaces an endpoint; it regenerates at once.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<(), String>")]
pub struct PutEndpoint(pub EndpointSpec);

impl Handler<PutEndpoint> for EndpointManager {
    type Result = Result<(), String>;

    fn handle(&mut self, PutEndpoint(spec): PutEndpoint, _: &mut Context<Self>) -> Self::Result {
        spec.validate().map_err(|e| e.to_string())?;
        self.store.save(&spec).map_err(|e| e.to_string())?;
        let id = spec.id;
        let restored = self.endpoints.get(&id).is_some_and(|e| e.restored);
        self.declare(spec, EndpointState::WaitingForSync, restored);
        self.regenerate(id);
        match &self.endpoints[&id].state {
            EndpointState::Failed(err) => Err(err.clone()),
            _ => Ok(()),
        }
    }
}

/// Deletes an endpoint: its program is detached, its entries and file removed. Answers
/// whether it existed.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Result<bool, String>")]
pub struct DeleteEndpoint(pub u64);

impl Handler<DeleteEndpoint> for EndpointManager {
    type Result = Result<bool, String>;

    fn handle(
        &mut self,
        DeleteEndpoint(id): DeleteEndpoint,
        _: &mut Context<Self>,
    ) -> Self::Result {
        self.store.remove(id).map_err(|e| e.to_string())?;
        let Some(endpoint) = self.endpoints.remove(&id) else {
            return Ok(false);
        };
        self.writer.do_send(RemoveLocalEndpoint(id));
        program::detach(&endpoint.spec.attach_point()).map_err(|e| e.to_string())?;
        Ok(true)
    }
}

/// Lists the endpoints by ID.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Vec<EndpointStatus>")]
pub struct ListEndpoints;

impl Handler<ListEndpoints> for EndpointManager {
    type Result = MessageResult<ListEndpoints>;

    fn handle(&mut self, _: ListEndpoints, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.endpoints.values().cloned().collect())
    }
}
