//! The `ClusterMesh` actor: owns the remote clusters. It turns config-directory events into
//! `RemoteCluster` actors, keeps cluster IDs unique, tells the barrier which clusters exist,
//! and answers status for the local API and the metrics.

use std::collections::BTreeMap;

use actix::{
    Actor, ActorFutureExt, Addr, AsyncContext, Context, Handler, Message, ResponseActFuture,
    ResponseFuture, WrapFuture,
};

use super::barrier_actor::BarrierUpdate;
use super::cluster_ids::{ClusterIds, IdInUse, ReserveClusterId};
use super::config_dir::ClusterConfigEvent;
use super::remote_cluster::runner::MeshSettings;
use super::remote_cluster::stores::Sinks;
use super::remote_cluster::{Disconnect, GetStatus, Reconfigure, RemoteCluster, Remove, Shutdown};
use super::status::ClusterStatus;
use crate::kvstore::KvstoreMetrics;

struct Entry {
    actor: Option<Addr<RemoteCluster>>,
    /// Why the config file is unusable, while it is.
    invalid: Option<String>,
}

/// The mesh of remote clusters.
pub struct ClusterMesh {
    settings: MeshSettings,
    sinks: Sinks,
    metrics: KvstoreMetrics,
    clusters: BTreeMap<String, Entry>,
    ids: ClusterIds,
}

impl ClusterMesh {
    /// A mesh for the local cluster `settings.local_cluster` with ID `local_id` (reserved, so
    /// no remote can take it; 0 reserves nothing).
    pub fn new(
        settings: MeshSettings,
        local_id: u32,
        sinks: Sinks,
        metrics: KvstoreMetrics,
    ) -> Self {
        let mut ids = ClusterIds::default();
        if local_id != 0 {
            let _ = ids.reserve(&settings.local_cluster, local_id);
        }
        Self {
            settings,
            sinks,
            metrics,
            clusters: BTreeMap::new(),
            ids,
        }
    }

    fn start_cluster(
        &mut self,
        config: super::config_dir::RemoteClusterConfig,
        ctx: &mut Context<Self>,
    ) -> Addr<RemoteCluster> {
        RemoteCluster::new(
            config,
            self.settings.clone(),
            self.sinks.clone(),
            ctx.address().recipient(),
            self.metrics.clone(),
        )
        .start()
    }
}

impl Actor for ClusterMesh {
    type Context = Context<Self>;
}

impl Handler<ClusterConfigEvent> for ClusterMesh {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, event: ClusterConfigEvent, ctx: &mut Context<Self>) -> Self::Result {
        let name = event.name().to_owned();
        match event {
            ClusterConfigEvent::Upsert { config, .. } => {
                let entry = self.clusters.remove(&name);
                let actor = match entry.and_then(|e| e.actor) {
                    Some(actor) => {
                        actor.do_send(Reconfigure(config));
                        actor
                    }
                    None => {
                        self.sinks
                            .barrier
                            .do_send(BarrierUpdate::ClusterAdded(name.clone()));
                        self.start_cluster(config, ctx)
                    }
                };
                self.clusters.insert(
                    name,
                    Entry {
                        actor: Some(actor),
                        invalid: None,
                    },
                );
            }
            ClusterConfigEvent::Invalid { error, .. } => {
                tracing::error!(cluster = %name, %error, "invalid clustermesh config file");
                let entry = self.clusters.entry(name.clone()).or_insert_with(|| {
                    self.sinks
                        .barrier
                        .do_send(BarrierUpdate::ClusterAdded(name.clone()));
                    Entry {
                        actor: None,
                        invalid: None,
                    }
                });
                // As in Cilium the connection closes until the file is fixed; what the cluster
                // contributed stays (removing the file is what drains it).
                if let Some(actor) = &entry.actor {
                    actor.do_send(Disconnect);
                }
                entry.invalid = Some(error);
            }
            ClusterConfigEvent::Remove { .. } => {
                if let Some(entry) = self.clusters.remove(&name) {
                    let barrier = self.sinks.barrier.clone();
                    return Box::pin(
                        async move {
                            if let Some(actor) = entry.actor {
                                let _ = actor.send(Remove).await;
                            }
                            barrier.do_send(BarrierUpdate::ClusterRemoved(name.clone()));
                            name
                        }
                        .into_actor(self)
                        .map(|name, mesh, _| mesh.ids.release(&name)),
                    );
                }
            }
        }
        Box::pin(actix::fut::ready(()))
    }
}

impl Handler<ReserveClusterId> for ClusterMesh {
    type Result = Result<(), IdInUse>;

    fn handle(&mut self, msg: ReserveClusterId, _: &mut Context<Self>) -> Self::Result {
        self.ids.reserve(&msg.cluster, msg.id)
    }
}

/// Asks for every remote cluster's status, sorted by name.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Vec<ClusterStatus>")]
pub struct GetMeshStatus;

impl Handler<GetMeshStatus> for ClusterMesh {
    type Result = ResponseFuture<Vec<ClusterStatus>>;

    fn handle(&mut self, _: GetMeshStatus, _: &mut Context<Self>) -> Self::Result {
        let entries: Vec<(String, Option<Addr<RemoteCluster>>, Option<String>)> = self
            .clusters
            .iter()
            .map(|(name, e)| (name.clone(), e.actor.clone(), e.invalid.clone()))
            .collect();
        Box::pin(async move {
            let mut statuses = Vec::with_capacity(entries.len());
            for (name, actor, invalid) in entries {
                let mut status = match actor {
                    Some(actor) => actor.send(GetStatus).await.unwrap_or_default(),
                    None => ClusterStatus::default(),
                };
                status.name = name;
                if invalid.is_some() {
                    status.last_error = invalid;
                }
                statuses.push(status);
            }
            statuses
        })
    }
}

/// The agent stops: every remote cluster stops without draining.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct ShutdownMesh;

impl Handler<ShutdownMesh> for ClusterMesh {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: ShutdownMesh, _: &mut Context<Self>) -> Self::Result {
        let actors: Vec<Addr<RemoteCluster>> = self
            .clusters
            .values()
            .filter_map(|e| e.actor.clone())
            .collect();
        let barrier = self.sinks.barrier.clone();
        Box::pin(async move {
            for actor in actors {
                let _ = actor.send(Shutdown).await;
            }
            barrier.do_send(BarrierUpdate::StopAll);
        })
    }
}
