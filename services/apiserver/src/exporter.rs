//! The apiserver's loop: one task owning the [`ClusterState`], the [`InitialSync`] and the
//! [`Writer`], fed by typed [`Command`]s (from the agents' sessions and the service
//! declarations) and by its timers. After each batch of commands it writes what changed;
//! a failed write is kept and tried again, so nothing is lost while etcd is away. It writes
//! the cluster config at start and whenever it differs, the heartbeat every
//! [`Settings::heartbeat_interval`], and the canaries once the initial state is complete.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meshwork_kvstore::follow::follow_prefix;
use meshwork_kvstore::{EtcdBackend, KvstoreError};
use meshwork_types::keys::{IDENTITY_ID_PREFIX, SERVICES_PREFIX};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, MissedTickBehavior};

use crate::control_keys;
use crate::declarations;
use crate::initial_sync::InitialSync;
use crate::metrics::ApiserverMetrics;
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
    /// How often the cluster config is read back and rewritten when it differs (Cilium:
    /// 5 min; a watch rewrites it at once when someone changes it).
    pub config_check_interval: Duration,
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
            config_check_interval: Duration::from_secs(5 * 60),
        }
    }
}

/// One agent session: its node and a number no other session of the node has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// The node it publishes.
    pub node: String,
    /// Unique per apiserver process.
    pub id: u64,
}

/// What the loop is asked to do.
#[derive(Debug)]
pub enum Command {
    /// A session published (or republished) its node; it becomes the node's session.
    PublishNode(Session, NodeSpec, oneshot::Sender<Result<(), Refused>>),
    /// Endpoints of the session's node, created or changed, in order; answered with the
    /// identity of each, up to and including the first one refused (the rest are not
    /// applied).
    PutEndpoints(
        Session,
        Vec<EndpointSpec>,
        oneshot::Sender<Vec<Result<u32, Refused>>>,
    ),
    /// An endpoint of the session's node deleted.
    DeleteEndpoint(Session, u64),
    /// The session has sent all it had at its start; answered once that is written.
    InitialStateComplete(Session, oneshot::Sender<()>),
    /// The session ended.
    SessionClosed(Session),
    /// A service declared; answered with its backends once its key is written.
    PutService(ServiceSpec, oneshot::Sender<usize>),
    /// A service deleted; answered whether it existed, once the delete is written.
    DeleteService(String, String, oneshot::Sender<bool>),
    /// Every declared service with its backend IPs.
    ListServices(oneshot::Sender<Vec<(ServiceSpec, Vec<IpAddr>)>>),
    /// Where the cluster's services can be followed ([`LocalServices`]).
    WatchLocalServices(oneshot::Sender<watch::Receiver<Option<LocalServices>>>),
    /// A node's entries deleted at once; answered whether it was known once the deletes are
    /// written, or `Err` while its agent is connected.
    DeleteNode(String, oneshot::Sender<Result<bool, NodeConnected>>),
    /// Write what is pending, then stop (deleting nothing); answered when stopped.
    Stop(oneshot::Sender<()>),
    /// Someone wrote or deleted the cluster config key: check it.
    ClusterConfigTouched,
}

/// A node cannot be deleted while its agent is connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the node's agent is connected: stop it first")]
pub struct NodeConnected;

/// Where the loop's readiness (the canaries written) can be watched.
pub type Ready = watch::Receiver<bool>;

/// Every declared service (shared or not) with its backend IPs: what each node's agent
/// programs as its local services. `None` until the initial state is complete, so no agent
/// ever sees a service with only the backends of the nodes that republished first.
pub type LocalServices = Arc<Vec<(ServiceSpec, Vec<IpAddr>)>>;

/// The loop; see the module docs.
pub struct Exporter {
    settings: Settings,
    state: ClusterState,
    writer: Writer,
    sync: InitialSync,
    /// Changes a failed write left, tried again first.
    pending: Vec<KeyChange>,
    /// Shared-service keys held back until the initial state is complete: a service's
    /// backends come from every node, so one written while the nodes republish one by one
    /// would shrink and grow again for a remote reader.
    held_services: Vec<KeyChange>,
    /// Service declarations to store (`Some`) or remove (`None`) before the next write.
    declarations: Vec<(String, Option<Vec<u8>>)>,
    /// The current session of each connected node.
    sessions: HashMap<String, u64>,
    /// Answers sent after the next successful write (the caller learns its change landed).
    after_write: Vec<Box<dyn FnOnce() + Send>>,
    /// Answered once the loop has stopped.
    stopping: Option<oneshot::Sender<()>>,
    /// The cluster config key was written or deleted since the last check.
    config_touched: bool,
    canaries_written: bool,
    ready: watch::Sender<bool>,
    local_services: watch::Sender<Option<LocalServices>>,
    commands: mpsc::Receiver<Command>,
    /// For the loop's own helpers: weak, so the loop still ends when every caller is gone.
    myself: mpsc::WeakSender<Command>,
    metrics: ApiserverMetrics,
}

impl Exporter {
    /// Adopts what a previous apiserver wrote to `backend` and returns the loop, where to
    /// send it commands and its readiness. Identities found are kept; canaries found mean
    /// the mesh already reads this cluster, so it is ready at once.
    pub async fn start(
        backend: EtcdBackend,
        settings: Settings,
        metrics: ApiserverMetrics,
    ) -> Result<(Self, mpsc::Sender<Command>, Ready), KvstoreError> {
        let now = Instant::now();
        let (writer, found) =
            crate::writer::adopt(backend, &settings.cluster, settings.lease_ttl).await?;
        let mut state = ClusterState::new(
            &settings.cluster,
            settings.cluster_id,
            settings.max_connected_clusters,
        );
        let identity_prefix = format!("{IDENTITY_ID_PREFIX}/");
        for (key, value) in &found {
            if let Some(id) = key
                .strip_prefix(&identity_prefix)
                .and_then(|id| id.parse().ok())
            {
                state.restore_identity(id, &String::from_utf8_lossy(value), now);
            }
        }
        let adopted_nodes = state.adopt(&found, now);
        // The restored identities are written already.
        let _ = state.take_changes();
        // The declared services: their keys are derived again (and held until the initial
        // state is complete, so they settle where they were).
        for spec in declarations::load(writer.backend(), &settings.cluster).await? {
            state.put_service(spec);
        }
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
            held_services: Vec::new(),
            declarations: Vec::new(),
            sessions: HashMap::new(),
            after_write: Vec::new(),
            stopping: None,
            config_touched: false,
            canaries_written,
            ready,
            local_services: watch::Sender::new(None),
            commands,
            myself: tx.downgrade(),
            metrics,
        };
        Ok((exporter, tx, ready_rx))
    }

    /// Runs until [`Command::Stop`] or until every command sender is gone. Deletes nothing
    /// on the way out: the keys stay under their leases for the next apiserver to adopt.
    pub async fn run(mut self) {
        self.write_cluster_config().await;
        let watching = tokio::spawn(watch_cluster_config(
            self.writer.backend().clone(),
            self.cluster_config().0,
            self.myself.clone(),
        ));
        let mut config_check = tokio::time::interval(self.settings.config_check_interval);
        config_check.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut heartbeat = tokio::time::interval(self.settings.heartbeat_interval);
        heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut keep_alive = tokio::time::interval(self.settings.lease_ttl / 3);
        keep_alive.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // Often enough that a short grace (tests) is honoured closely.
        let gc_every = (self
            .settings
            .node_gc_grace
            .min(self.settings.identity_gc_interval)
            / 4)
        .clamp(Duration::from_millis(100), Duration::from_secs(30));
        let mut gc = tokio::time::interval(gc_every);
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
                _ = config_check.tick() => self.check_cluster_config().await,
                _ = keep_alive.tick() => match self.writer.keep_alive().await {
                    Ok(rewritten) => {
                        self.metrics.lease_renewals.inc();
                        self.metrics.lease_rewrites.inc_by(rewritten as u64);
                    }
                    Err(err) => {
                        self.metrics.write_errors.inc();
                        tracing::warn!(%err, "keeping the leases alive failed; retrying");
                    }
                },
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
                _ = retry.tick(), if !self.pending.is_empty() || !self.declarations.is_empty() => {}
                () = &mut sync_deadline, if !deadline_passed => deadline_passed = true,
            }
            if std::mem::take(&mut self.config_touched) {
                self.check_cluster_config().await;
            }
            self.flush().await;
            if let Some(stopped) = self.stopping.take() {
                watching.abort();
                tracing::info!(
                    pending = self.pending.len(),
                    "apiserver loop stopped; nothing deleted"
                );
                let _ = stopped.send(());
                return;
            }
        }
        watching.abort();
        tracing::info!("apiserver loop stopped; nothing deleted");
    }

    fn cluster_config(&self) -> (String, Vec<u8>) {
        control_keys::cluster_config(
            &self.settings.cluster,
            self.settings.cluster_id,
            self.settings.max_connected_clusters,
        )
    }

    /// Reads the cluster config back; when it is missing or different (someone else wrote
    /// it), it is written again at once.
    async fn check_cluster_config(&mut self) {
        let (key, value) = self.cluster_config();
        match self.writer.backend().get(&key).await {
            Ok(Some((stored, _))) if stored == value => {}
            Ok(_) => {
                tracing::warn!(%key, "the cluster config is missing or changed; writing it again");
                self.writer.forget(&key);
                self.pending.push((key, Some(value)));
            }
            Err(err) => tracing::warn!(%err, "reading the cluster config back failed"),
        }
    }

    fn handle(&mut self, command: Command) {
        let now = Instant::now();
        match command {
            Command::PublishNode(session, spec, reply) => {
                let result = self.state.publish_node(spec);
                if result.is_ok() {
                    self.sessions.insert(session.node.clone(), session.id);
                    self.sync.session_opened(&session.node, now);
                }
                let _ = reply.send(result);
            }
            Command::PutEndpoints(session, endpoints, reply) => {
                if self.current(&session) {
                    let mut answers = Vec::with_capacity(endpoints.len());
                    for endpoint in endpoints {
                        let answer = self.state.put_endpoint(&session.node, endpoint, now);
                        let refused = answer.is_err();
                        answers.push(answer);
                        if refused {
                            break;
                        }
                    }
                    let _ = reply.send(answers);
                }
            }
            Command::DeleteEndpoint(session, id) => {
                if self.current(&session) {
                    self.state.delete_endpoint(&session.node, id, now);
                }
            }
            Command::InitialStateComplete(session, reply) => {
                if self.current(&session) {
                    self.sync.session_complete(&session.node);
                    self.state.claim_adopted(&session.node);
                    self.answer_after_write(reply, ());
                }
            }
            Command::SessionClosed(session) => {
                if self.current(&session) {
                    self.sessions.remove(&session.node);
                    self.sync.session_closed(&session.node);
                    self.state.disconnect(&session.node, now);
                }
            }
            Command::PutService(spec, reply) => {
                let key = declarations::key(&self.settings.cluster, &spec.namespace, &spec.name);
                self.declarations
                    .push((key, Some(declarations::encode(&spec))));
                let backends = self.state.put_service(spec);
                self.answer_after_write(reply, backends);
            }
            Command::DeleteService(namespace, name, reply) => {
                let existed = self.state.delete_service(&namespace, &name);
                if existed {
                    let key = declarations::key(&self.settings.cluster, &namespace, &name);
                    self.declarations.push((key, None));
                }
                self.answer_after_write(reply, existed);
            }
            Command::ListServices(reply) => {
                let _ = reply.send(self.state.services());
            }
            Command::WatchLocalServices(reply) => {
                let _ = reply.send(self.local_services.subscribe());
            }
            Command::Stop(reply) => self.stopping = Some(reply),
            Command::ClusterConfigTouched => self.config_touched = true,
            Command::DeleteNode(node, reply) => {
                if self.sessions.contains_key(&node) {
                    let _ = reply.send(Err(NodeConnected));
                } else {
                    let existed = self.state.delete_node(&node, now);
                    self.sync.node_deleted(&node);
                    self.answer_after_write(reply, Ok(existed));
                }
            }
        }
    }

    fn answer_after_write<T: Send + 'static>(&mut self, reply: oneshot::Sender<T>, value: T) {
        self.after_write.push(Box::new(move || {
            let _ = reply.send(value);
        }));
    }

    /// Whether `session` is its node's current one (a replaced session is ignored).
    fn current(&self, session: &Session) -> bool {
        self.sessions.get(&session.node) == Some(&session.id)
    }

    /// Writes what changed (after what a failed write left), then the canaries once the
    /// initial state is complete and written.
    async fn flush(&mut self) {
        // A service that is not shared changes no key: its declaration tells.
        let declared = !self.declarations.is_empty();
        if let Err(err) = self.store_declarations().await {
            tracing::warn!(%err, "storing a service declaration failed; retrying");
            self.metrics.write_errors.inc();
            return;
        }
        let mut changes = std::mem::take(&mut self.held_services);
        changes.append(&mut self.pending);
        changes.extend(self.state.take_changes());
        self.publish_local_services(declared || !changes.is_empty());
        if !self.sync.is_complete(Instant::now()) {
            let services = format!("{SERVICES_PREFIX}/{}/", self.settings.cluster);
            let (held, now): (Vec<KeyChange>, Vec<KeyChange>) = changes
                .into_iter()
                .partition(|(key, _)| key.starts_with(&services));
            self.held_services = held;
            changes = now;
        }
        if !changes.is_empty()
            && let Err(err) = self.writer.apply(&changes).await
        {
            tracing::warn!(%err, changes = changes.len(), "writing to etcd failed; retrying");
            self.metrics.write_errors.inc();
            self.pending = changes;
            return;
        }
        self.update_gauges();
        for answer in self.after_write.drain(..) {
            answer();
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

    /// Hands the agents the cluster's services once the initial state is complete, and again
    /// when `changed` (some key changed: an endpoint, a node or a declaration) altered them.
    fn publish_local_services(&mut self, changed: bool) {
        if !self.sync.is_complete(Instant::now())
            || (!changed && self.local_services.borrow().is_some())
        {
            return;
        }
        let services = self.state.services();
        self.local_services.send_if_modified(|current| {
            if current.as_ref().is_some_and(|c| **c == services) {
                return false;
            }
            *current = Some(Arc::new(services));
            true
        });
    }

    /// Stores or removes the queued service declarations, in order; what fails is kept.
    async fn store_declarations(&mut self) -> Result<(), KvstoreError> {
        let queued = std::mem::take(&mut self.declarations);
        let mut queued = queued.into_iter();
        while let Some((key, value)) = queued.next() {
            let backend = self.writer.backend();
            let stored = match &value {
                Some(value) => backend.put(&key, value.clone()).await.map(drop),
                None => backend.delete(&key).await.map(drop),
            };
            if let Err(err) = stored {
                self.declarations.push((key, value));
                self.declarations.extend(queued);
                return Err(err);
            }
        }
        Ok(())
    }

    fn update_gauges(&self) {
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.metrics.nodes.set(gauge(self.state.node_count()));
        self.metrics
            .endpoints
            .set(gauge(self.state.endpoint_count()));
        self.metrics
            .identities
            .set(gauge(self.state.identity_count()));
        self.metrics.services.set(gauge(self.state.service_count()));
    }

    async fn write_cluster_config(&mut self) {
        let (key, value) = self.cluster_config();
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

/// Tells the loop whenever `key` is written or deleted (by anyone, this apiserver included:
/// the loop reads it back and finds its own write equal). A failed watch is watched again;
/// the watch ends with the loop.
async fn watch_cluster_config(
    backend: EtcdBackend,
    key: String,
    commands: mpsc::WeakSender<Command>,
) {
    // A prefix watch: `c1` also matches `c10`, so events are matched exactly.
    let watched = key.clone();
    follow_prefix(backend, watched, move |touched| {
        let (key, commands) = (key.clone(), commands.clone());
        async move {
            if touched != key.as_bytes() {
                return true;
            }
            match commands.upgrade() {
                Some(commands) => commands.send(Command::ClusterConfigTouched).await.is_ok(),
                None => false,
            }
        }
    })
    .await;
}
