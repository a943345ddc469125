//! The `WireGuard` actor: a thin shell that feeds remote events into the [`PeerTable`] and
//! applies its plans to the device in batches (one request per mailbox drain).
//!
//! Device calls block (bounded by the backend's I/O timeouts), so the actor is meant to run
//! on its own arbiter ([`WireGuard::start_own_arbiter`]).

use std::time::Duration;

use actix::{
    Actor, ActorContext as _, ActorFutureExt as _, Addr, Arbiter, AsyncContext as _, Context,
    Handler, Message, MessageResult, Recipient, WrapFuture as _,
};

use super::LISTEN_PORT;
use super::backend::{Backend, BackendError, DeviceUpdate, PeerUpdate};
use super::key::PrivateKey;
use super::local_node::LocalNode;
use super::metrics::WireguardMetrics;
use super::peers::{GcWait, PeerTable};
use super::status::{EncryptStatus, PeerStatus, PendingGc};
use super::userspace::{Ensured, Userspace, UserspaceError};
use crate::clustermesh::SyncKind;
use crate::clustermesh::barrier_actor::GetMeshWait;
use crate::clustermesh::events::{Change, RemoteEvent, RemoteEvents};

/// How often the device is probed (a vanished device is recreated).
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(1);
/// How long after a failed request it is retried.
pub const RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// Why the actor could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The userspace implementation could not be started.
    #[error(transparent)]
    Userspace(#[from] UserspaceError),
    /// The device could not be read or configured.
    #[error(transparent)]
    Device(#[from] BackendError),
}

/// The actor's settings.
pub struct WireGuardConfig {
    /// Drives the device.
    pub backend: Box<dyn Backend>,
    /// The node's key.
    pub private_key: PrivateKey,
    /// `--encrypt-node`.
    pub encrypt_node: bool,
    /// The userspace fallback to supervise, if any.
    pub userspace: Option<Userspace>,
    /// Where rejections and peer counts go (`WireguardMetrics::default()`: nowhere).
    pub metrics: WireguardMetrics,
    /// The agent's own node (its object carries the public key).
    pub local_node: LocalNode,
}

/// See the module docs.
pub struct WireGuard {
    table: PeerTable,
    backend: Box<dyn Backend>,
    private_key: PrivateKey,
    userspace: Option<Userspace>,
    metrics: WireguardMetrics,
    local_node: LocalNode,
    flush_scheduled: bool,
    retry_scheduled: bool,
    device_up: bool,
    recreations: u64,
    last_error: Option<String>,
    /// Started by [`WireGuard::start_own_arbiter`]: the arbiter stops with the actor.
    owns_arbiter: bool,
}

impl WireGuard {
    /// Brings the device up (starting the userspace fallback if configured), reads its peers
    /// as restored, and sets the private key and listen port. Peers are left as they are.
    pub fn new(config: WireGuardConfig) -> Result<Self, StartError> {
        let WireGuardConfig {
            backend,
            private_key,
            encrypt_node,
            mut userspace,
            metrics,
            local_node,
        } = config;
        if let Some(userspace) = &mut userspace
            && userspace.ensure()? == Ensured::Reused
        {
            tracing::info!(
                device = backend.device(),
                "reusing the running userspace WireGuard device"
            );
        }
        let mut actor = Self {
            table: PeerTable::new(encrypt_node),
            backend,
            private_key,
            userspace,
            metrics,
            local_node,
            flush_scheduled: false,
            retry_scheduled: false,
            device_up: true,
            recreations: 0,
            last_error: None,
            owns_arbiter: false,
        };
        let restored = actor.backend.get()?;
        tracing::info!(
            device = actor.backend.device(),
            peers = restored.peers.len(),
            "restored WireGuard peers"
        );
        actor.table.restore(&restored);
        actor.update_gauges();
        actor.configure_device()?;
        Ok(actor)
    }

    /// Starts the actor on an arbiter of its own (device calls block). The arbiter's thread
    /// ends when the actor stops ([`Stop`]).
    pub fn start_own_arbiter(mut self) -> Addr<Self> {
        self.owns_arbiter = true;
        let arbiter = Arbiter::new();
        Self::start_in_arbiter(&arbiter.handle(), |_| self)
    }

    fn configure_device(&mut self) -> Result<(), BackendError> {
        self.backend.set(&DeviceUpdate {
            private_key: Some(self.private_key.secret()),
            listen_port: Some(LISTEN_PORT),
            peers: Vec::new(),
        })
    }

    fn update_gauges(&self) {
        self.metrics
            .set_peers(self.table.applied_len(), self.table.pending_peers());
    }

    fn schedule_flush(&mut self, ctx: &mut Context<Self>) {
        if !self.flush_scheduled {
            self.flush_scheduled = true;
            ctx.notify(Flush);
        }
    }

    fn schedule_retry(&mut self, ctx: &mut Context<Self>) {
        if !self.retry_scheduled {
            self.retry_scheduled = true;
            ctx.run_later(RETRY_INTERVAL, |actor, ctx| {
                actor.retry_scheduled = false;
                actor.flush(ctx);
            });
        }
    }

    fn flush(&mut self, ctx: &mut Context<Self>) {
        if !self.device_up {
            return;
        }
        if self.table.has_changes() {
            let plan = self.table.plan();
            match self.backend.set(&plan.update) {
                Ok(()) => {
                    self.table.commit(plan);
                    self.last_error = None;
                }
                Err(err) => {
                    self.table.fail(plan);
                    self.device_error(&err, ctx);
                    return;
                }
            }
        }
        let gc = gc_pass(&mut self.table, self.backend.as_mut());
        self.update_gauges();
        if let Err(err) = gc {
            self.device_error(&err, ctx);
        }
    }

    fn device_error(&mut self, err: &BackendError, ctx: &mut Context<Self>) {
        tracing::warn!(%err, "WireGuard device request failed, retrying");
        self.last_error = Some(err.to_string());
        if err.is_gone() {
            self.device_up = false;
            self.check_device(ctx);
        } else {
            self.schedule_retry(ctx);
        }
    }

    /// Probes the device; a vanished one is recreated (with the fallback) and configured
    /// again from scratch.
    fn check_device(&mut self, ctx: &mut Context<Self>) {
        match self.backend.get() {
            Ok(_) if self.device_up => return,
            // It came back empty (someone else recreated it): configure it below.
            Ok(_) => {}
            Err(err) if err.is_gone() => {
                self.device_up = false;
                let Some(userspace) = &mut self.userspace else {
                    return;
                };
                if let Err(err) = userspace.ensure() {
                    self.last_error = Some(err.to_string());
                    return;
                }
            }
            Err(err) => {
                self.last_error = Some(err.to_string());
                return;
            }
        }
        if let Err(err) = self.configure_device() {
            self.last_error = Some(err.to_string());
            return;
        }
        tracing::warn!(
            device = self.backend.device(),
            "WireGuard device was gone: configured again"
        );
        self.recreations += 1;
        self.device_up = true;
        self.table.device_reset();
        self.flush(ctx);
    }

    fn status(&mut self) -> EncryptStatus {
        let device = self.backend.get();
        let rejections = self.table.rejections();
        let local_node = self.local_node.node(&self.private_key.public_key());
        let mut status = EncryptStatus {
            device: self.backend.device().to_owned(),
            backend: self.backend.kind().to_owned(),
            public_key: local_node.wireguard_pub_key.clone(),
            local_node,
            device_up: device.is_ok(),
            userspace_pid: self.userspace.as_mut().and_then(Userspace::pid),
            device_recreations: self.recreations,
            rejected_duplicate_keys: rejections.duplicate_keys,
            rejected_malformed_keys: rejections.malformed_keys,
            last_error: self.last_error.clone(),
            pending_gc: self
                .table
                .pending_gc()
                .into_iter()
                .map(|(key, wait)| PendingGc {
                    public_key: key.to_base64(),
                    wait: wait.name().to_owned(),
                })
                .collect(),
            ..EncryptStatus::default()
        };
        match device {
            Ok(device) => {
                status.listen_port = device.listen_port;
                status.peers = device
                    .peers
                    .into_iter()
                    .map(|peer| PeerStatus {
                        public_key: peer.key.to_base64(),
                        node: self.table.owner(&peer.key),
                        endpoint: peer.endpoint.map(|e| e.to_string()),
                        allowed_ips: peer.allowed_ips.iter().map(ToString::to_string).collect(),
                        last_handshake: peer.last_handshake,
                        rx_bytes: peer.rx_bytes,
                        tx_bytes: peer.tx_bytes,
                    })
                    .collect();
            }
            Err(err) => status.last_error = Some(err.to_string()),
        }
        status
    }
}

/// Removes obsolete restored peers one at a time; the first error stops the pass (the rest
/// wait for the retry). Returns how many were removed.
pub fn gc_pass(table: &mut PeerTable, backend: &mut dyn Backend) -> Result<usize, BackendError> {
    let mut removed = 0;
    while let Some(key) = table.next_gc() {
        backend.set(&DeviceUpdate {
            peers: vec![PeerUpdate::remove(key)],
            ..DeviceUpdate::default()
        })?;
        tracing::info!(peer = %key, "removed obsolete restored WireGuard peer");
        table.gc_done(&key);
        removed += 1;
    }
    Ok(removed)
}

impl Actor for WireGuard {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(HEALTH_INTERVAL, Self::check_device);
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        if self.owns_arbiter {
            Arbiter::current().stop();
        }
    }
}

/// Stops the actor: no more probes or device calls; the device and its peers stay as they
/// are (an agent restart must not drop established tunnels).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct Stop;

impl Handler<Stop> for WireGuard {
    type Result = ();

    fn handle(&mut self, _: Stop, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

impl Handler<RemoteEvents> for WireGuard {
    type Result = ();

    fn handle(&mut self, batch: RemoteEvents, ctx: &mut Context<Self>) {
        let cluster = &batch.cluster;
        for event in &batch.events {
            match event {
                RemoteEvent::Node { change } => match change {
                    Change::Upsert(node) => {
                        if let Err(err) = self.table.upsert_node(cluster, node) {
                            self.metrics.rejected(&err);
                            tracing::warn!(%err, "rejected a remote node's WireGuard peer");
                        }
                    }
                    Change::Delete(node) => {
                        self.table
                            .delete_node(&(cluster.clone(), node.name.clone()));
                    }
                },
                RemoteEvent::IpCache { change, .. } => match change {
                    Change::Upsert(entry) => self.table.ipcache(cluster, entry, false),
                    Change::Delete(entry) => self.table.ipcache(cluster, entry, true),
                },
                RemoteEvent::Service { .. } => {}
            }
        }
        self.schedule_flush(ctx);
    }
}

#[derive(Message)]
#[rtype(result = "()")]
struct Flush;

impl Handler<Flush> for WireGuard {
    type Result = ();

    fn handle(&mut self, _: Flush, ctx: &mut Context<Self>) {
        self.flush_scheduled = false;
        self.flush(ctx);
    }
}

/// A wait finished (or its circuit breaker fired): the matching restored state may go.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct Synced(pub GcWait);

impl Handler<Synced> for WireGuard {
    type Result = ();

    fn handle(&mut self, Synced(wait): Synced, ctx: &mut Context<Self>) {
        tracing::info!(
            wait = wait.name(),
            "remote state synced: WireGuard garbage collection may run"
        );
        match wait {
            GcWait::NodesSynced => self.table.nodes_synced(),
            GcWait::IpIdentitiesSynced => self.table.ipcache_synced(),
        }
        self.schedule_flush(ctx);
    }
}

/// Remote clusters are known: wait for `NodesSynced` and `IPIdentitiesSynced` (each bounded
/// by the barrier's circuit breaker) before collecting restored state.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ArmGc(pub Recipient<GetMeshWait>);

impl Handler<ArmGc> for WireGuard {
    type Result = ();

    fn handle(&mut self, ArmGc(barrier): ArmGc, ctx: &mut Context<Self>) {
        for (kind, wait) in [
            (SyncKind::Nodes, GcWait::NodesSynced),
            (SyncKind::IpIdentities, GcWait::IpIdentitiesSynced),
        ] {
            let barrier = barrier.clone();
            let waited = async move {
                let mesh_wait = barrier.send(GetMeshWait(kind)).await.ok()?;
                // No caller deadline: the breaker (--clustermesh-sync-timeout) bounds it.
                mesh_wait.wait(None).await.ok()
            };
            ctx.spawn(waited.into_actor(self).map(move |outcome, _, ctx| {
                if outcome.is_some() {
                    ctx.notify(Synced(wait));
                }
            }));
        }
    }
}

/// Asks for the status.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "EncryptStatus")]
pub struct GetEncryptStatus;

impl Handler<GetEncryptStatus> for WireGuard {
    type Result = MessageResult<GetEncryptStatus>;

    fn handle(&mut self, _: GetEncryptStatus, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.status())
    }
}

/// How many peers the device holds as far as the actor knows, once every pending change has
/// been applied (benchmarks and tests wait on it).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "usize")]
pub struct FlushNow;

impl Handler<FlushNow> for WireGuard {
    type Result = usize;

    fn handle(&mut self, _: FlushNow, ctx: &mut Context<Self>) -> usize {
        self.flush(ctx);
        self.table.applied_len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wireguard::backend::{DeviceState, PeerState};
    use crate::wireguard::key::Key;

    /// A device that fails the `fail_at`-th request.
    struct Flaky {
        state: DeviceState,
        requests: usize,
        fail_at: usize,
    }

    impl Backend for Flaky {
        fn device(&self) -> &str {
            "flaky"
        }
        fn kind(&self) -> &'static str {
            "test"
        }
        fn get(&mut self) -> Result<DeviceState, BackendError> {
            Ok(self.state.clone())
        }
        fn set(&mut self, update: &DeviceUpdate) -> Result<(), BackendError> {
            self.requests += 1;
            if self.requests == self.fail_at {
                return Err(BackendError::Refused {
                    device: "flaky".into(),
                    errno: -5,
                });
            }
            for peer in &update.peers {
                assert!(peer.remove);
                self.state.peers.retain(|p| p.key != peer.key);
            }
            Ok(())
        }
    }

    fn peer(n: u8) -> PeerState {
        PeerState {
            key: Key([n; 32]),
            endpoint: None,
            allowed_ips: Vec::new(),
            last_handshake: None,
            rx_bytes: 0,
            tx_bytes: 0,
        }
    }

    #[test]
    fn a_removal_error_stops_the_pass_and_the_retry_finishes_it() {
        let mut backend = Flaky {
            state: DeviceState {
                peers: vec![peer(1), peer(2), peer(3)],
                ..DeviceState::default()
            },
            requests: 0,
            fail_at: 2,
        };
        let mut table = PeerTable::new(false);
        table.restore(&backend.state);
        assert_eq!(
            gc_pass(&mut table, &mut backend).unwrap(),
            0,
            "not before NodesSynced"
        );
        table.nodes_synced();
        assert!(gc_pass(&mut table, &mut backend).is_err());
        assert_eq!(backend.state.peers.len(), 2, "stopped at the error");
        assert_eq!(backend.requests, 2);
        assert_eq!(gc_pass(&mut table, &mut backend).unwrap(), 2);
        assert!(backend.state.peers.is_empty());
        assert!(table.pending_gc().is_empty());
    }

    #[actix_rt::test]
    async fn stop_ends_the_actor_on_its_own_arbiter() {
        let backend = Flaky {
            state: DeviceState::default(),
            requests: 0,
            fail_at: 0,
        };
        let actor = WireGuard::new(WireGuardConfig {
            backend: Box::new(backend),
            private_key: PrivateKey::generate(),
            encrypt_node: false,
            userspace: None,
            metrics: WireguardMetrics::default(),
            local_node: LocalNode::default(),
        })
        .unwrap()
        .start_own_arbiter();
        assert_eq!(actor.send(FlushNow).await.unwrap(), 0);
        actor.send(Stop).await.unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while actor.connected() {
            assert!(
                std::time::Instant::now() < deadline,
                "the actor did not stop"
            );
            actix_rt::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            actor.send(FlushNow).await.is_err(),
            "a stopped actor answers nothing"
        );
    }
}
