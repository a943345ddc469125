//! The apiserver's loop: one task owning the [`ClusterState`], the [`InitialSync`] and the
//! [`Writer`], fed by typed [`Command`]s (from the agents' sessions and the service
//! declarations) and by its timers. After each batch of commands it writes what changed;
//! a failed write is kept and tried again, so nothing is lost while etcd is away. It writes
//! the cluster config at start and whenever it differs, the heartbeat every
//! [`Settings::heartbeat_interval`], and the canaries once the initial state is complete.

use std::time::{Duration, SystemTime};

use meshwork_kvstore::{EtcdBackend, KvstoreError};
use meshwork_types::keys::{IDENTITY_ID_PREFIX, NODES_PREFIX};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, MissedTickBehavior};

use crate::control_keys;
use crate::initial_sync::InitialSync;
use crate::state::{ClusterState, EndpointSpec, KeyChange, NodeSpec, Refused, ServiceSpec};
use crate::writer::Writer;

/// How the apiserver runs (its flags).
#[derive(Debug, Clone)]
pub struct Settings {
    /// `--cluster-name`.
    pub cluster: String,
    /// `--cluster-id`.
    pub cluster_id: u32,
    /// `--max-connected-clusters`.
    pub max_connected_clusters: u32,
    /// `--kvstore-lease-ttl`.
    pub lease_ttl: Duration,
    /// `--initial-sync-timeout`.
    pub initial_sync_timeout: Duration,
    /// `--node-gc-grace`.
    pub node_gc_grace: Duration,
    /// `--identity-gc-interval`.
    pub identity_gc_interval: Duration,
    /// How often the heartbeat is written (Cilium: 1 min).
    pub heartbeat_interval: Duration,
}

impl Settings {
    /// Cilium's defaults for cluster `cluster` with ID `cluster_id`.
    pub fn new(cluster: &str, cluster_id: u32) -> Self {
        Self {
            cluster: cluster.to_owned(),
            cluster_id,
            max_connected_clusters: 255,
            lease_ttl: Duration::from_secs(15 * 60),
            initial_sync_timeout: Duration::from_secs(60),
            node_gc_grace: Duration::from_secs(15 * 60),
            identity_gc_interval: Duration::from_secs(15 * 60),
            heartbeat_interval: Duration::from_secs(60),
        }
    }
}

/// What the loop is asked to do.
#[derive(Debug)]
pub enum Command {
    /// An agent's session published (or republished) its node.
    PublishNode(NodeSpec, oneshot::Sender<Result<(), Refused>>),
    /// An endpoint of a node, created or changed; answered with its identity.
    PutEndpoint(String, EndpointSpec, oneshot::Sender<Result<u32, Refused>>),
    /// An endpoint of a node deleted.
    DeleteEndpoint(String, u64),
    /// A node's agent has sent all it had at the session's start.
    InitialStateComplete(String),
    /// A node's session ended.
    SessionClosed(String),
    /// A service declared.
    PutService(ServiceSpec, oneshot::Sender<usize>),
    /// A service deleted; answered whether it existed.
    DeleteService(String, String, oneshot::Sender<bool>),
}

/// Where the loop's readiness (the canaries written) can be watched.
pub type Ready = watch::Receiver<bool>;

/// The loop; see the module docs.
pub struct Exporter {
    settings: Settings,
    state: ClusterState,
    writer: Writer,
    sync: InitialSync,
    /// Changes a failed write left, tried again first.
    pending: Vec<KeyChange>,
    canaries_written: bool,
    ready: watch::Sender<bool>,
    commands: mpsc::Receiver<Command>,
}

impl Exporter {
    /// Adopts what a previous apiserver wrote to `backend` and returns the loop, where to
    /// send it commands and its readiness. Identities found are kept; canaries found mean
    /// the mesh already reads this cluster, so it is ready at once.
    pub async fn start(
        backend: EtcdBackend,
        settings: Settings,
    ) -> Result<(Self, mpsc::Sender<Command>, Ready), KvstoreError> {
        let now = Instant::now();
        let (writer, found) = Writer::adopt(backend, &settings.cluster, settings.lease_ttl).await?;
        let mut state = ClusterState::new(
            &settings.cluster,
            settings.cluster_id,
            settings.max_connected_clusters,
        );
        let identity_prefix = format!("{IDENTITY_ID_PREFIX}/");
        let node_prefix = format!("{NODES_PREFIX}/{}/", settings.cluster);
        let mut adopted_nodes = Vec::new();
        for (key, value) in &found {
            if let Some(id) = key
                .strip_prefix(&identity_prefix)
                .and_then(|id| id.parse().ok())
            {
                state.restore_identity(id, &String::from_utf8_lossy(value), now);
            } else if let Some(node) = key.strip_prefix(&node_prefix) {
                adopted_nodes.push(node.to_owned());
            }
        }
        // The restored identities are written already.
        let _ = state.take_changes();
        let canaries_written = control_keys::canaries(&settings.cluster, SystemTime::now())
            .iter()
            .all(|(key, _)| found.contains_key(key));
        tracing::info!(
            keys = found.len(),
            nodes = adopted_nodes.len(),
            identities = state.identity_count(),
            canaries = canaries_written,
            "adopted what the previous apiserver wrote"
        );
        let sync = InitialSync::new(now, settings.initial_sync_timeout, adopted_nodes);
        let (ready, ready_rx) = watch::channel(canaries_written);
        let (tx, commands) = mpsc::channel(1024);
        let exporter = Self {
            settings,
            state,
            writer,
            sync,
            pending: Vec::new(),
            canaries_written,
            ready,
            commands,
        };
        Ok((exporter, tx, ready_rx))
    }

    /// Runs until every command sender is gone. Deletes nothing on the way out: the keys
    /// stay under their leases for the next apiserver to adopt.
    pub async fn run(mut self) {
        self.write_cluster_config().await;
        let mut heartbeat = tokio::time::interval(self.settings.heartbeat_interval);
        heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut keep_alive = tokio::time::interval(self.settings.lease_ttl / 3);
        keep_alive.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut gc = tokio::time::interval(Duration::from_secs(30));
        gc.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut retry = tokio::time::interval(Duration::from_secs(1));
        let sync_deadline = tokio::time::sleep_until(self.sync.deadline());
        tokio::pin!(sync_deadline);
        let mut deadline_passed = false;
        loop {
            tokio::select! {
                command = self.commands.recv() => {
                    let Some(command) = command else { break };
                    self.handle(command);
                    // Take what else is queued before writing: one write for a burst.
                    while let Ok(command) = self.commands.try_recv() {
                        self.handle(command);
                    }
                }
                _ = heartbeat.tick() => self.queue_heartbeat(),
                _ = keep_alive.tick() => {
                    if let Err(err) = self.writer.keep_alive().await {
                        tracing::warn!(%err, "keeping the leases alive failed; retrying");
                    }
                }
                _ = gc.tick() => {
                    let gone = self.state.collect_garbage(
                        Instant::now(),
                        self.settings.node_gc_grace,
                        self.settings.identity_gc_interval,
                    );
                    if !gone.is_empty() {
                        tracing::info!(?gone, "nodes gone for the grace deleted");
                    }
                }
                _ = retry.tick(), if !self.pending.is_empty() => {}
                () = &mut sync_deadline, if !deadline_passed => deadline_passed = true,
            }
            self.flush().await;
        }
        tracing::info!("apiserver loop stopped; nothing deleted");
    }

    fn handle(&mut self, command: Command) {
        let now = Instant::now();
        match command {
            Command::PublishNode(spec, reply) => {
                let name = spec.name.clone();
                let result = self.state.publish_node(spec);
                if result.is_ok() {
                    self.sync.session_opened(&name, now);
                }
                let _ = reply.send(result);
            }
            Command::PutEndpoint(node, endpoint, reply) => {
                let _ = reply.send(self.state.put_endpoint(&node, endpoint, now));
            }
            Command::DeleteEndpoint(node, id) => {
                self.state.delete_endpoint(&node, id, now);
            }
            Command::InitialStateComplete(node) => self.sync.session_complete(&node),
            Command::SessionClosed(node) => {
                self.sync.session_closed(&node);
                self.state.disconnect(&node, now);
            }
            Command::PutService(spec, reply) => {
                let _ = reply.send(self.state.put_service(spec));
            }
            Command::DeleteService(namespace, name, reply) => {
                let _ = reply.send(self.state.delete_service(&namespace, &name));
            }
        }
    }

    /// Writes what changed (after what a failed write left), then the canaries once the
    /// initial state is complete and written.
    async fn flush(&mut self) {
        let mut changes = std::mem::take(&mut self.pending);
        changes.extend(self.state.take_changes());
        if !changes.is_empty()
            && let Err(err) = self.writer.apply(&changes).await
        {
            tracing::warn!(%err, changes = changes.len(), "writing to etcd failed; retrying");
            self.pending = changes;
            return;
        }
        if !self.canaries_written && self.sync.is_complete(Instant::now()) {
            let canaries: Vec<KeyChange> =
                control_keys::canaries(&self.settings.cluster, SystemTime::now())
                    .into_iter()
                    .map(|(k, v)| (k, Some(v)))
                    .collect();
            match self.writer.apply(&canaries).await {
                Ok(_) => {
                    self.canaries_written = true;
                    self.ready.send_replace(true);
                    tracing::info!("initial state complete: sync canaries written");
                }
                Err(err) => tracing::warn!(%err, "writing the canaries failed; retrying"),
            }
        }
    }

    async fn write_cluster_config(&mut self) {
        let (key, value) = control_keys::cluster_config(
            &self.settings.cluster,
            self.settings.cluster_id,
            self.settings.max_connected_clusters,
        );
        self.pending.push((key, Some(value)));
        // Without a lease, for older readers; written once, never again.
        let (marker, value) = control_keys::has_cluster_config();
        if let Err(err) = self.writer.backend().create_if_absent(&marker, value).await {
            tracing::warn!(%err, "writing {marker} failed");
        }
        self.flush().await;
    }

    fn queue_heartbeat(&mut self) {
        let (key, value) = control_keys::heartbeat(SystemTime::now());
        self.pending.push((key, Some(value)));
    }
}
