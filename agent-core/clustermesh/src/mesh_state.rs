//! The lifecycle of the remote clusters, as a plain state machine: config-directory events
//! and finished operations in, [`Command`]s out. [`crate::mesh::ClusterMesh`] carries the
//! commands out.
//!
//! Rules (contract §2):
//! - a new cluster gets a new incarnation: fresh latches, then its connection loop;
//! - changed content restarts the loop of the same incarnation (stores and latches kept);
//! - an invalid file stops the loop and keeps everything the cluster contributed;
//! - a removed file drains the cluster; its ID is released once the drain is over;
//! - cluster IDs are unique across remote clusters, and only the current incarnation of a
//!   cluster may reserve one.
//!
//! Every operation that stops a loop takes time. Until it is done the cluster is busy: its
//! next events wait, so each lifecycle step runs atomically with respect to the next event of
//! the same cluster (a re-created file never races the drain of its predecessor). Waiting
//! events collapse to what matters: at most a removal, then the newest content.

use std::collections::BTreeMap;

use crate::cluster_ids::{ClusterIds, ReserveError};
use crate::config_dir::{ClusterConfigEvent, RemoteClusterConfig};
use crate::events::ClusterRef;

/// What to do about one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Create the latches of a new incarnation (before anything of it runs).
    AddLatches(ClusterRef),
    /// Start the loop, with the stores its incarnation kept (if any).
    Start {
        /// The cluster.
        cluster: ClusterRef,
        /// Its config.
        config: RemoteClusterConfig,
    },
    /// Stop the loop, then start it again with `config`, keeping its stores. Answer
    /// [`MeshState::done`] once running again.
    Restart {
        /// The cluster.
        cluster: ClusterRef,
        /// Its new config.
        config: RemoteClusterConfig,
    },
    /// Stop the loop and keep its stores (the file became invalid, or the agent stops).
    /// Answer [`MeshState::done`] once stopped.
    Stop(ClusterRef),
    /// The barrier forgets the cluster now; stop its loop, then drain what it contributed.
    /// Answer [`MeshState::done`] once drained.
    Drain(ClusterRef),
}

#[derive(Debug)]
struct Cluster {
    incarnation: u64,
    /// The last valid config (none while the file has only ever been invalid).
    config: Option<RemoteClusterConfig>,
    /// Why the file is unusable, while it is.
    invalid: Option<String>,
    /// A loop runs (or will once the operation in flight is done).
    running: bool,
    /// The operation in flight, if any.
    busy: Option<Op>,
    /// Events that arrived meanwhile.
    waiting: Vec<ClusterConfigEvent>,
}

/// An operation that takes time: the cluster's next events wait for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Restart,
    Stop,
    Drain,
}

/// A cluster as the status shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView<'a> {
    /// The cluster.
    pub cluster: ClusterRef,
    /// Its last valid config.
    pub config: Option<&'a RemoteClusterConfig>,
    /// Why its file is unusable, while it is.
    pub invalid: Option<&'a str>,
}

/// The remote clusters and their IDs; see the module docs.
#[derive(Debug)]
pub struct MeshState {
    clusters: BTreeMap<String, Cluster>,
    ids: ClusterIds,
    next_incarnation: u64,
    stopping: bool,
}

impl MeshState {
    /// No remote cluster yet; `local` (our own cluster, ID `local_id`) holds its ID so that
    /// no remote can take it (0 reserves nothing).
    pub fn new(local: &str, local_id: u32) -> Self {
        let mut ids = ClusterIds::default();
        if local_id != 0 {
            let _ = ids.reserve(local, local_id);
        }
        Self {
            clusters: BTreeMap::new(),
            ids,
            next_incarnation: 1,
            stopping: false,
        }
    }

    /// A change in the config directory.
    pub fn apply(&mut self, event: ClusterConfigEvent) -> Vec<Command> {
        let mut commands = Vec::new();
        if !self.stopping {
            self.handle(event, &mut commands);
        }
        commands
    }

    fn handle(&mut self, event: ClusterConfigEvent, commands: &mut Vec<Command>) {
        let name = event.name().to_owned();
        if let Some(cluster) = self.clusters.get_mut(&name)
            && cluster.busy.is_some()
        {
            if matches!(event, ClusterConfigEvent::Remove { .. }) {
                cluster.waiting.clear();
            } else {
                cluster
                    .waiting
                    .retain(|e| matches!(e, ClusterConfigEvent::Remove { .. }));
            }
            cluster.waiting.push(event);
            return;
        }
        match event {
            ClusterConfigEvent::Upsert { config, .. } => {
                let cluster = self.entry(&name, commands);
                let cref = ClusterRef::new(name.as_str(), cluster.incarnation);
                cluster.invalid = None;
                cluster.config = Some(config.clone());
                if cluster.running {
                    cluster.busy = Some(Op::Restart);
                    commands.push(Command::Restart {
                        cluster: cref,
                        config,
                    });
                } else {
                    cluster.running = true;
                    commands.push(Command::Start {
                        cluster: cref,
                        config,
                    });
                }
            }
            ClusterConfigEvent::Invalid { error, .. } => {
                let cluster = self.entry(&name, commands);
                cluster.invalid = Some(error);
                // As in Cilium the connection closes until the file is fixed; what the cluster
                // contributed stays (removing the file is what drains it).
                if std::mem::take(&mut cluster.running) {
                    cluster.busy = Some(Op::Stop);
                    commands.push(Command::Stop(ClusterRef::new(
                        name.as_str(),
                        cluster.incarnation,
                    )));
                }
            }
            ClusterConfigEvent::Remove { .. } => {
                if let Some(cluster) = self.clusters.get_mut(&name) {
                    cluster.busy = Some(Op::Drain);
                    cluster.running = false;
                    commands.push(Command::Drain(ClusterRef::new(
                        name.as_str(),
                        cluster.incarnation,
                    )));
                }
            }
        }
    }

    /// The cluster named `name`, made (a new incarnation, with its latches) if unknown.
    fn entry(&mut self, name: &str, commands: &mut Vec<Command>) -> &mut Cluster {
        let next = &mut self.next_incarnation;
        self.clusters.entry(name.to_owned()).or_insert_with(|| {
            let incarnation = *next;
            *next += 1;
            commands.push(Command::AddLatches(ClusterRef::new(name, incarnation)));
            Cluster {
                incarnation,
                config: None,
                invalid: None,
                running: false,
                busy: None,
                waiting: Vec::new(),
            }
        })
    }

    /// The operation issued for `cluster` is done; the events that waited for it follow.
    pub fn done(&mut self, cluster: &ClusterRef) -> Vec<Command> {
        let mut commands = Vec::new();
        let name = &*cluster.name;
        let Some(entry) = self
            .clusters
            .get_mut(name)
            .filter(|c| c.incarnation == cluster.incarnation)
        else {
            return commands;
        };
        let drained = entry.busy.take() == Some(Op::Drain);
        let waiting = std::mem::take(&mut entry.waiting);
        if drained {
            self.clusters.remove(name);
            self.ids.release(name);
        }
        if self.stopping {
            self.stop_running(&mut commands);
            return commands;
        }
        for event in waiting {
            self.handle(event, &mut commands);
        }
        commands
    }

    /// The agent stops: every loop stops, nothing is drained, and later events are ignored.
    pub fn shutdown(&mut self) -> Vec<Command> {
        self.stopping = true;
        let mut commands = Vec::new();
        self.stop_running(&mut commands);
        commands
    }

    fn stop_running(&mut self, commands: &mut Vec<Command>) {
        for (name, cluster) in &mut self.clusters {
            if cluster.busy.is_none() && std::mem::take(&mut cluster.running) {
                cluster.busy = Some(Op::Stop);
                commands.push(Command::Stop(ClusterRef::new(
                    name.as_str(),
                    cluster.incarnation,
                )));
            }
        }
    }

    /// Whether the agent stops and no loop runs or is being stopped any more.
    pub fn is_stopped(&self) -> bool {
        self.stopping
            && self
                .clusters
                .values()
                .all(|c| !c.running && c.busy.is_none())
    }

    /// Reserves `id` for `cluster`, if it is the current incarnation of a configured cluster.
    pub fn reserve(&mut self, cluster: &ClusterRef, id: u32) -> Result<(), ReserveError> {
        let current = self
            .clusters
            .get(&*cluster.name)
            .is_some_and(|c| c.incarnation == cluster.incarnation && c.busy != Some(Op::Drain));
        if !current {
            return Err(ReserveError::NotConfigured(cluster.name.to_string()));
        }
        Ok(self.ids.reserve(&cluster.name, id)?)
    }

    /// Every reserved cluster ID (the local cluster's included), by ID.
    pub fn reserved_ids(&self) -> BTreeMap<u32, String> {
        self.ids.reserved()
    }

    /// Every configured cluster, by name.
    pub fn clusters(&self) -> impl Iterator<Item = ClusterView<'_>> {
        self.clusters.iter().map(|(name, c)| ClusterView {
            cluster: ClusterRef::new(name.as_str(), c.incarnation),
            config: c.config.as_ref(),
            invalid: c.invalid.as_deref(),
        })
    }
}

#[cfg(test)]
#[path = "mesh_state_tests.rs"]
mod tests;
