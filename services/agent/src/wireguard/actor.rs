//! The `WireGuard` actor: a thin shell that feeds remote events into the [`PeerTable`] and
//! hands its plans to the [`Device`] supervisor in batches (one request per mailbox drain),
//! owning only the timers: the flush, the retry and the health probe.
//!
//! It acknowledges a batch's node and ipcache list-dones to the barrier once the device has
//! them; its own garbage collection waits for its own acknowledgements. Device calls block
//! (bounded by the backend's I/O timeouts), so the actor runs on its own arbiter, and no
//! other consumer's wait counts its acknowledgements: a stuck device delays only WireGuard.

use std::time::Duration;

use actix::{
    Actor, ActorContext as _, ActorFutureExt as _, Addr, Arbiter, AsyncContext as _, Context,
    Handler, Message, MessageResult, Recipient, WrapFuture as _,
};
use meshwork_clustermesh::Consumer;
use meshwork_clustermesh::barrier_actor::{BarrierUpdate, GetMeshWait};
use meshwork_clustermesh::events::RemoteEvents;
use meshwork_clustermesh::timeline::{Step, TimelineRecorder, Waiter};
use meshwork_types::{Change, RemoteEvent, SyncKind};
use meshwork_wireguard::device::{Device, Failure};
use meshwork_wireguard::local_node::LocalNode;
use meshwork_wireguard::metrics::WireguardMetrics;
use meshwork_wireguard::peers::PeerTable;
use meshwork_wireguard::status::EncryptStatus;

/// How often the device is probed (a vanished device is recreated).
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(1);
/// How long after a failed request it is retried.
pub const RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// WireGuard's own acknowledgements: what its garbage collection waits for.
const WIREGUARD: &[Consumer] = &[Consumer::WireGuard];

/// See the module docs.
pub struct WireGuard {
    table: PeerTable,
    device: Device,
    metrics: WireguardMetrics,
    local_node: LocalNode,
    barrier: Recipient<BarrierUpdate>,
    /// List-dones applied to the table, acknowledged once the device has them.
    unacked: Vec<BarrierUpdate>,
    flush_scheduled: bool,
    retry_scheduled: bool,
    /// The restart timeline ([`ArmGc`] brings it).
    timeline: TimelineRecorder,
    /// Garbage collections allowed (by their wait) and the restored peers pending then,
    /// recorded once a flush has run them.
    gc_due: Vec<(SyncKind, usize)>,
}

impl WireGuard {
    /// A shell over `device` (opened, with its peers `restored`), acknowledging to `barrier`.
    pub fn new(
        device: Device,
        restored: &meshwork_wireguard::backend::DeviceState,
        encrypt_node: bool,
        metrics: WireguardMetrics,
        local_node: LocalNode,
        barrier: Recipient<BarrierUpdate>,
    ) -> Self {
        let mut table = PeerTable::new(encrypt_node);
        table.restore(restored);
        let actor = Self {
            table,
            device,
            metrics,
            local_node,
            barrier,
            unacked: Vec::new(),
            flush_scheduled: false,
            retry_scheduled: false,
            timeline: TimelineRecorder::default(),
            gc_due: Vec::new(),
        };
        actor.update_gauges();
        actor
    }

    /// Starts the actor on an arbiter of its own (device calls block). The arbiter's thread
    /// ends when the actor stops ([`Stop`]).
    pub fn start_own_arbiter(self) -> Addr<Self> {
        Self::start_in_arbiter(&Arbiter::new().handle(), |_| self)
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

    fn flush(&mut self, ctx: &mut Context<Self>) {
        let synced = self.device.sync(&mut self.table);
        self.update_gauges();
        match synced {
            Ok(()) => {
                for ack in self.unacked.drain(..) {
                    self.barrier.do_send(ack);
                }
                let pending = self.table.pending_peers();
                for (kind, before) in self.gc_due.drain(..) {
                    // Only NodesSynced removes peers; IPIdentitiesSynced drops allowed IPs.
                    let removed = match kind {
                        SyncKind::Nodes => before.saturating_sub(pending),
                        _ => 0,
                    };
                    let removed = u64::try_from(removed).unwrap_or(u64::MAX);
                    self.timeline.record(Step::WireguardGc { kind, removed });
                }
            }
            Err(Failure::Gone) => self.probe(ctx),
            Err(Failure::Retry) => {
                if !self.retry_scheduled {
                    self.retry_scheduled = true;
                    ctx.run_later(RETRY_INTERVAL, |actor, ctx| {
                        actor.retry_scheduled = false;
                        actor.flush(ctx);
                    });
                }
            }
        }
    }

    fn probe(&mut self, ctx: &mut Context<Self>) {
        if self.device.probe(&mut self.table) {
            self.flush(ctx);
        }
    }
}

impl Actor for WireGuard {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(HEALTH_INTERVAL, Self::probe);
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        Arbiter::current().stop();
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
        let cluster = &batch.cluster.name;
        for event in batch.events.iter() {
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
                RemoteEvent::Service { .. } | RemoteEvent::ListDone(_) => {}
            }
        }
        self.unacked.extend(batch.applied_by(Consumer::WireGuard));
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

/// Every configured cluster is known to the barrier: wait for `NodesSynced` and
/// `IPIdentitiesSynced` of WireGuard's own acknowledgements (each bounded by the circuit
/// breaker) before collecting restored peers and restored allowed IPs.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ArmGc {
    /// Where the waits come from.
    pub barrier: Recipient<GetMeshWait>,
    /// Where each wait and collection is recorded (the restart timeline).
    pub timeline: TimelineRecorder,
}

impl Handler<ArmGc> for WireGuard {
    type Result = ();

    fn handle(&mut self, ArmGc { barrier, timeline }: ArmGc, ctx: &mut Context<Self>) {
        self.timeline = timeline;
        for kind in [SyncKind::Nodes, SyncKind::IpIdentities] {
            let barrier = barrier.clone();
            let timeline = self.timeline.clone();
            let waited = async move {
                let wait = barrier
                    .send(GetMeshWait::only(kind, WIREGUARD))
                    .await
                    .ok()?;
                // No caller deadline: the breaker (--clustermesh-sync-timeout) bounds it.
                let outcome = wait.wait(None).await;
                timeline.wait_returned(Waiter::WireguardGc, kind, &outcome);
                outcome.ok()
            };
            ctx.spawn(waited.into_actor(self).map(move |outcome, actor, ctx| {
                if outcome.is_none() {
                    return;
                }
                tracing::info!(
                    wait = kind.cilium_name(),
                    "remote state synced: WireGuard garbage collection may run"
                );
                match kind {
                    SyncKind::Nodes => actor.table.nodes_synced(),
                    _ => actor.table.ipcache_synced(),
                }
                actor.gc_due.push((kind, actor.table.pending_peers()));
                actor.schedule_flush(ctx);
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
        MessageResult(self.device.status(&self.table, &self.local_node))
    }
}

/// Applies every pending change now; answers how many peers the device then holds as far as
/// the actor knows (benchmarks and tests wait on it).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "usize")]
pub struct FlushAndCount;

impl Handler<FlushAndCount> for WireGuard {
    type Result = usize;

    fn handle(&mut self, _: FlushAndCount, ctx: &mut Context<Self>) -> usize {
        self.flush(ctx);
        self.table.applied_len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use actix::Actor as _;
    use meshwork_clustermesh::events::ClusterRef;
    use meshwork_types::{Address, AddressType, Node, Resource};
    use meshwork_wireguard::backend::{Backend, BackendError, DeviceState, DeviceUpdate};
    use meshwork_wireguard::key::PrivateKey;

    use super::*;

    /// A device that refuses requests while `refusing` is set.
    struct Switchable {
        refusing: Arc<Mutex<bool>>,
    }

    impl Backend for Switchable {
        fn device(&self) -> &str {
            "test"
        }
        fn kind(&self) -> &'static str {
            "test"
        }
        fn get(&mut self) -> Result<DeviceState, BackendError> {
            Ok(DeviceState::default())
        }
        fn set(&mut self, _: &DeviceUpdate) -> Result<(), BackendError> {
            if *self.refusing.lock().unwrap() {
                return Err(BackendError::Refused {
                    device: "test".into(),
                    errno: -5,
                });
            }
            Ok(())
        }
    }

    /// Records the barrier updates it gets.
    #[derive(Default)]
    struct Acks(Arc<Mutex<Vec<BarrierUpdate>>>);

    impl Actor for Acks {
        type Context = Context<Self>;
    }

    impl Handler<BarrierUpdate> for Acks {
        type Result = ();
        fn handle(&mut self, update: BarrierUpdate, _: &mut Context<Self>) {
            self.0.lock().unwrap().push(update);
        }
    }

    /// Answers what arrived before it (the mailbox is FIFO: an acknowledgement sent earlier
    /// is in).
    #[derive(Message)]
    #[rtype(result = "Vec<BarrierUpdate>")]
    struct Seen;

    impl Handler<Seen> for Acks {
        type Result = MessageResult<Seen>;
        fn handle(&mut self, _: Seen, _: &mut Context<Self>) -> Self::Result {
            MessageResult(self.0.lock().unwrap().clone())
        }
    }

    fn node_with_key() -> Arc<Node> {
        Arc::new(Node {
            name: "n1".to_owned(),
            cluster: "c2".to_owned(),
            ip_addresses: vec![Address {
                address_type: AddressType::InternalIp,
                ip: Some("10.213.0.2".parse().unwrap()),
            }],
            cluster_id: 2,
            wireguard_pub_key: PrivateKey::generate().public_key().to_base64(),
            ..Node::default()
        })
    }

    #[actix_rt::test]
    async fn list_dones_are_acknowledged_once_the_device_has_them_and_stop_ends_the_actor() {
        let refusing = Arc::new(Mutex::new(false));
        let backend = Switchable {
            refusing: Arc::clone(&refusing),
        };
        let (device, restored) =
            Device::open(Box::new(backend), PrivateKey::generate(), None).unwrap();
        let barrier = Acks::default().start();
        let actor = WireGuard::new(
            device,
            &restored,
            false,
            WireguardMetrics::default(),
            LocalNode::default(),
            barrier.clone().recipient(),
        )
        .start_own_arbiter();

        *refusing.lock().unwrap() = true;
        actor.do_send(RemoteEvents::new(
            ClusterRef::new("c2", 1),
            vec![
                RemoteEvent::Node {
                    change: Change::Upsert(node_with_key()),
                },
                RemoteEvent::ListDone(Resource::Nodes),
            ],
        ));
        assert_eq!(actor.send(FlushAndCount).await.unwrap(), 0);
        assert!(
            barrier.send(Seen).await.unwrap().is_empty(),
            "nothing is acknowledged while the device refuses"
        );
        *refusing.lock().unwrap() = false;
        assert_eq!(actor.send(FlushAndCount).await.unwrap(), 1);
        let acked = barrier.send(Seen).await.unwrap();
        assert!(
            matches!(
                acked.as_slice(),
                [BarrierUpdate::Applied {
                    resource: Resource::Nodes,
                    consumer: Consumer::WireGuard,
                    incarnation: 1,
                    ..
                }]
            ),
            "{acked:?}"
        );

        actor.send(Stop).await.unwrap();
        assert!(
            actor.send(FlushAndCount).await.is_err(),
            "a stopped actor answers nothing"
        );
    }
}
