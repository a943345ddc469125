//! `DatapathWriter`: the actor that owns the ipcache map. It writes remote entries as the
//! stores deliver them and local endpoint entries as the endpoint manager declares them,
//! flushing once per batch.

use std::collections::BTreeMap;
use std::net::IpAddr;

use actix::{Actor, Addr, Context, Handler, Message, MessageResult, Recipient};

use super::ipcache_writer::{FlushError, IpCacheWriter, Owner, WriterStats};
use super::lb_writer::{LbStats, LbWriter};
use super::maps::IpCacheMap;
use crate::clustermesh::barrier_actor::{GetMeshWait, SyncBarrierActor};
use crate::clustermesh::events::{RemoteEvent, RemoteEvents};
use crate::clustermesh::kinds::SyncKind;
use crate::clustermesh::remote_state::Settle;

/// The actor; see the module docs.
pub struct DatapathWriter {
    writer: IpCacheWriter,
    map: IpCacheMap,
    lb: Option<LbWriter>,
    last_error: Option<String>,
}

impl DatapathWriter {
    /// A writer of `map` (freshly recreated at start) for the node whose IP is `local_node`.
    pub fn new(map: IpCacheMap, local_node: Option<IpAddr>) -> Self {
        Self {
            writer: IpCacheWriter::new(local_node),
            map,
            lb: None,
            last_error: None,
        }
    }

    /// Also programs global services (acknowledging them to the barrier) and the tunnel map.
    pub fn with_lb(mut self, lb: LbWriter) -> Self {
        self.lb = Some(lb);
        self
    }

    fn flush(&mut self) {
        match self.writer.flush(&self.map) {
            Ok(()) => {}
            Err(err @ FlushError::MapFull { .. }) => {
                // Reported, not retried: a full map needs an operator, not a busy loop.
                tracing::error!(%err, "ipcache map full; entries dropped until space frees up");
                self.last_error = Some(err.to_string());
            }
            Err(err) => {
                tracing::error!(%err, "ipcache write failed");
                self.last_error = Some(err.to_string());
            }
        }
    }
}

impl Actor for DatapathWriter {
    type Context = Context<Self>;
}

impl Handler<RemoteEvents> for DatapathWriter {
    type Result = ();

    fn handle(&mut self, batch: RemoteEvents, _: &mut Context<Self>) {
        if let Some(lb) = &mut self.lb {
            lb.apply(&batch);
        }
        let cluster = &batch.cluster;
        for event in &batch.events {
            if let RemoteEvent::IpCache { change, .. } = event
                && let Err(err) = self.writer.apply_remote(cluster, change)
            {
                tracing::warn!(cluster = %cluster, %err, "ipcache entry rejected");
            }
        }
        self.flush();
    }
}

/// Sets the ipcache entries of a local endpoint (replacing its earlier ones).
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

impl Handler<SetLocalEndpoint> for DatapathWriter {
    type Result = ();

    fn handle(&mut self, msg: SetLocalEndpoint, _: &mut Context<Self>) {
        for ip in self.writer.set_local(msg.id, &msg.ips, msg.identity) {
            tracing::warn!(endpoint = msg.id, %ip, "local ipcache entry rejected");
        }
        self.flush();
    }
}

/// Removes a deleted endpoint's entries.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct RemoveLocalEndpoint(pub u64);

impl Handler<RemoveLocalEndpoint> for DatapathWriter {
    type Result = ();

    fn handle(&mut self, RemoveLocalEndpoint(id): RemoveLocalEndpoint, _: &mut Context<Self>) {
        self.writer.remove_owner(&Owner::Endpoint(id));
        self.flush();
    }
}

/// A mesh-wide wait completed (after its entries reached this actor): restored state of
/// that kind may be pruned now.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct RemoteSynced(pub SyncKind);

/// Tells `writer` [`RemoteSynced`] for services and for nodes, each once the mesh-wide wait of
/// that kind is over (every cluster synced, or the circuit breaker fired) and the synced
/// entries have reached the writer ([`Settle`]): restored services, backends and tunnel
/// entries are pruned then, never before.
pub fn prune_restored_when_synced(
    writer: &Addr<DatapathWriter>,
    barrier: &Addr<SyncBarrierActor>,
    settle: &Recipient<Settle>,
) {
    for kind in [SyncKind::Services, SyncKind::Nodes] {
        let (writer, barrier, settle) = (writer.clone(), barrier.clone(), settle.clone());
        actix::spawn(async move {
            let Ok(wait) = barrier.send(GetMeshWait(kind)).await else {
                return;
            };
            // No deadline of its own: the barrier's circuit breaker bounds it.
            let _ = wait.wait(None).await;
            let _ = settle.send(Settle).await;
            writer.do_send(RemoteSynced(kind));
        });
    }
}

impl Handler<RemoteSynced> for DatapathWriter {
    type Result = ();

    fn handle(&mut self, RemoteSynced(kind): RemoteSynced, _: &mut Context<Self>) {
        let Some(lb) = &mut self.lb else { return };
        match kind {
            SyncKind::Services => lb.services_synced(),
            SyncKind::Nodes => lb.nodes_synced(),
            SyncKind::IpIdentities => {}
        }
    }
}

/// What the writer has done, for status and metrics.
#[derive(Debug, Clone, Default)]
pub struct WriterReport {
    /// Entries the map holds.
    pub entries: usize,
    /// Counters.
    pub stats: WriterStats,
    /// The last write error, if any.
    pub last_error: Option<String>,
    /// Rejections by reason, sorted.
    pub rejected: BTreeMap<&'static str, u64>,
    /// The service and tunnel maps, when programmed.
    pub lb: Option<LbStats>,
}

/// Asks for a [`WriterReport`].
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "WriterReport")]
pub struct GetWriterReport;

impl Handler<GetWriterReport> for DatapathWriter {
    type Result = MessageResult<GetWriterReport>;

    fn handle(&mut self, _: GetWriterReport, _: &mut Context<Self>) -> Self::Result {
        let stats = self.writer.stats().clone();
        MessageResult(WriterReport {
            entries: self.writer.len(),
            rejected: stats.rejected.iter().map(|(k, v)| (*k, *v)).collect(),
            stats,
            last_error: self.last_error.clone(),
            lb: self.lb.as_ref().map(LbWriter::stats),
        })
    }
}
