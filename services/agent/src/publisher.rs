//! Publishing this node and its endpoints to the cluster's meshwork-apiserver
//! (`--apiserver-addr`, `meshwork.apiserver.v1.Export`).
//!
//! The desired state (the endpoints, each with a revision) lives beside a task that keeps
//! one publishing session open: it sends the node, every endpoint and the end of its initial
//! state, then each change as it comes. A lost session reconnects with backoff and
//! republishes everything; the apiserver writes only what changed. Nothing here ever blocks
//! the datapath: changes are recorded and the task is woken.
//!
//! The apiserver sends back the cluster's services (shared or not) with their backends once
//! its initial state is complete, and again on every change ([`Publisher::local_services`]):
//! the node's local service state, kept across reconnects.
//!
//! An endpoint with labels and identity 0 gets its identity from the apiserver
//! ([`Publisher::identity`]): the apiserver answers a session's endpoints in order, so the
//! session matches each answer to the oldest endpoint it sent and has no answer for.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBuilder};
use meshwork_proto::agent::v1::ApiserverStatus;
use meshwork_proto::apiserver::v1 as pb;
use meshwork_proto::apiserver::v1::export_client::ExportClient;
use pb::publish_request::Request as Publish;
use pb::publish_response::Response as Answer;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tonic::transport::{ClientTlsConfig, Endpoint};

/// How long a connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why an identity could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// The apiserver refused the endpoint.
    #[error("the apiserver refused endpoint {id}: {message}")]
    Refused {
        /// The endpoint.
        id: u64,
        /// Its answer.
        message: String,
    },
    /// No answer in time (the apiserver is unreachable or slow).
    #[error("the apiserver at {addr} gave no identity for endpoint {id} within {waited:?}")]
    NoAnswer {
        /// The endpoint.
        id: u64,
        /// The apiserver.
        addr: String,
        /// How long it waited.
        waited: Duration,
    },
}

/// What the apiserver answered for an endpoint revision.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Identity(u32),
    Refused(String),
}

#[derive(Debug, Default)]
struct Desired {
    next_revision: u64,
    /// Every endpoint to publish, with the revision of its last change.
    endpoints: BTreeMap<u64, (u64, pb::Endpoint)>,
}

struct Shared {
    addr: String,
    tls: Option<ClientTlsConfig>,
    node: pb::Node,
    desired: Mutex<Desired>,
    changed: Notify,
    /// The newest answer per endpoint: (revision, outcome).
    answers: watch::Sender<BTreeMap<u64, (u64, Outcome)>>,
    status: watch::Sender<ApiserverStatus>,
    local_services: watch::Sender<Option<Arc<Vec<pb::ServiceStatus>>>>,
}

impl Shared {
    fn desired(&self) -> std::sync::MutexGuard<'_, Desired> {
        self.desired.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The publishing side of the agent; clones share it.
#[derive(Clone)]
pub struct Publisher {
    shared: Arc<Shared>,
    task: Arc<JoinHandle<()>>,
}

impl Publisher {
    /// Starts publishing `node` and `endpoints` (the restored ones) to the apiserver at
    /// `addr`, over `tls` when given.
    pub fn start(
        addr: &str,
        tls: Option<ClientTlsConfig>,
        node: pb::Node,
        endpoints: Vec<pb::Endpoint>,
    ) -> Self {
        let status = ApiserverStatus {
            address: addr.to_owned(),
            ..ApiserverStatus::default()
        };
        let shared = Arc::new(Shared {
            addr: addr.to_owned(),
            tls,
            node,
            desired: Mutex::new(Desired::default()),
            changed: Notify::new(),
            answers: watch::Sender::new(BTreeMap::new()),
            status: watch::Sender::new(status),
            local_services: watch::Sender::new(None),
        });
        let publisher = Self {
            task: Arc::new(tokio::spawn(run(Arc::clone(&shared)))),
            shared,
        };
        for endpoint in endpoints {
            publisher.put(endpoint);
        }
        publisher
    }

    /// Publishes `endpoint` (created or changed); returns its revision.
    pub fn put(&self, endpoint: pb::Endpoint) -> u64 {
        let revision = {
            let mut desired = self.shared.desired();
            desired.next_revision += 1;
            let revision = desired.next_revision;
            desired.endpoints.insert(endpoint.id, (revision, endpoint));
            let count = desired.endpoints.len();
            self.shared
                .status
                .send_modify(|s| s.endpoints = u32::try_from(count).unwrap_or(u32::MAX));
            revision
        };
        self.shared.changed.notify_one();
        revision
    }

    /// Stops publishing endpoint `id`.
    pub fn remove(&self, id: u64) {
        let removed = {
            let mut desired = self.shared.desired();
            let removed = desired.endpoints.remove(&id).is_some();
            let count = desired.endpoints.len();
            self.shared
                .status
                .send_modify(|s| s.endpoints = u32::try_from(count).unwrap_or(u32::MAX));
            removed
        };
        if removed {
            self.shared.changed.notify_one();
        }
    }

    /// Publishes `endpoint` and waits (at most `timeout`) for the identity the apiserver
    /// allocates for its labels.
    pub async fn identity(
        &self,
        endpoint: pb::Endpoint,
        timeout: Duration,
    ) -> Result<u32, IdentityError> {
        let id = endpoint.id;
        let mut answers = self.shared.answers.subscribe();
        let revision = self.put(endpoint);
        let answered =
            answers.wait_for(|answers| answers.get(&id).is_some_and(|(r, _)| *r >= revision));
        let outcome = match tokio::time::timeout(timeout, answered).await {
            Ok(Ok(answers)) => answers[&id].1.clone(),
            _ => {
                return Err(IdentityError::NoAnswer {
                    id,
                    addr: self.shared.addr.clone(),
                    waited: timeout,
                });
            }
        };
        match outcome {
            Outcome::Identity(identity) => Ok(identity),
            Outcome::Refused(message) => Err(IdentityError::Refused { id, message }),
        }
    }

    /// The cluster's services as the apiserver last sent them: `None` until its initial
    /// state is complete, then each new set replaces the one before.
    pub fn local_services(&self) -> watch::Receiver<Option<Arc<Vec<pb::ServiceStatus>>>> {
        self.shared.local_services.subscribe()
    }

    /// How publishing goes, for the agent's status.
    pub fn status(&self) -> ApiserverStatus {
        self.shared.status.borrow().clone()
    }

    /// Stops publishing (the session ends; the apiserver keeps the node's entries for its
    /// grace).
    pub fn stop(&self) {
        self.task.abort();
    }
}

/// Keeps a session open, reconnecting with backoff.
async fn run(shared: Arc<Shared>) {
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(30))
        .with_jitter()
        .without_max_times();
    let mut delays = backoff.build();
    loop {
        let started = tokio::time::Instant::now();
        let ended = session(&shared).await;
        shared.status.send_modify(|s| {
            s.connected = false;
            s.initial_state_written = false;
            s.last_error = Some(ended.message().to_owned());
        });
        // A session that lasted resets the backoff: this failure is news, not a pattern.
        if started.elapsed() > Duration::from_secs(30) {
            delays = backoff.build();
        }
        let delay = delays.next().unwrap_or(Duration::from_secs(30));
        tracing::warn!(addr = %shared.addr, status = %ended, ?delay, "publishing to the apiserver failed; reconnecting");
        tokio::time::sleep(delay).await;
    }
}

/// One session, until it fails.
async fn session(shared: &Shared) -> Status {
    let scheme = if shared.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let endpoint = match Endpoint::from_shared(format!("{scheme}://{}", shared.addr)) {
        Ok(endpoint) => endpoint.connect_timeout(CONNECT_TIMEOUT),
        Err(err) => {
            return Status::invalid_argument(format!("--apiserver-addr {:?}: {err}", shared.addr));
        }
    };
    let endpoint = match &shared.tls {
        Some(tls) => match endpoint.tls_config(tls.clone()) {
            Ok(endpoint) => endpoint,
            Err(err) => return Status::invalid_argument(format!("the apiserver's TLS: {err}")),
        },
        None => endpoint,
    };
    let channel = endpoint.connect().await;
    let channel = match channel {
        Ok(channel) => channel,
        Err(err) => return Status::unavailable(format!("connecting to {}: {err}", shared.addr)),
    };
    let (requests, rx) = mpsc::channel(256);
    let send = |request| pb::PublishRequest {
        request: Some(request),
    };
    if requests
        .send(send(Publish::Node(shared.node.clone())))
        .await
        .is_err()
    {
        return Status::internal("the session's queue closed");
    }
    let mut answers = match ExportClient::new(channel)
        .publish(ReceiverStream::new(rx))
        .await
    {
        Ok(response) => response.into_inner(),
        Err(status) => return status,
    };
    shared.status.send_modify(|s| {
        s.connected = true;
        s.sessions += 1;
    });
    tracing::info!(addr = %shared.addr, node = %shared.node.name, "publishing to the apiserver");
    let mut sent: BTreeMap<u64, u64> = BTreeMap::new();
    let mut unanswered: VecDeque<(u64, u64)> = VecDeque::new();
    let mut complete_sent = false;
    loop {
        // Send what changed since the last round: upserts by revision, then deletes.
        let changes = {
            let desired = shared.desired();
            let upserts: Vec<(u64, u64, pb::Endpoint)> = desired
                .endpoints
                .iter()
                .filter(|(id, (revision, _))| sent.get(id) != Some(revision))
                .map(|(id, (revision, endpoint))| (*id, *revision, endpoint.clone()))
                .collect();
            let deletes: Vec<u64> = sent
                .keys()
                .filter(|id| !desired.endpoints.contains_key(id))
                .copied()
                .collect();
            (upserts, deletes)
        };
        for (id, revision, endpoint) in changes.0 {
            if requests
                .send(send(Publish::Endpoint(endpoint)))
                .await
                .is_err()
            {
                return Status::internal("the session's queue closed");
            }
            sent.insert(id, revision);
            unanswered.push_back((id, revision));
        }
        for id in changes.1 {
            if requests
                .send(send(Publish::DeletedEndpoint(id)))
                .await
                .is_err()
            {
                return Status::internal("the session's queue closed");
            }
            sent.remove(&id);
        }
        if !complete_sent {
            if requests
                .send(send(Publish::InitialStateComplete(true)))
                .await
                .is_err()
            {
                return Status::internal("the session's queue closed");
            }
            complete_sent = true;
        }
        tokio::select! {
            () = shared.changed.notified() => {}
            answer = answers.message() => match answer {
                Ok(Some(pb::PublishResponse { response: Some(Answer::Identity(identity)) })) => {
                    if let Some((id, revision)) = unanswered.pop_front() {
                        debug_assert_eq!(id, identity.endpoint_id);
                        shared.answers.send_modify(|a| {
                            a.insert(id, (revision, Outcome::Identity(identity.identity)));
                        });
                    }
                }
                Ok(Some(pb::PublishResponse { response: Some(Answer::InitialStateWritten(_)) })) => {
                    shared.status.send_modify(|s| s.initial_state_written = true);
                }
                Ok(Some(pb::PublishResponse { response: Some(Answer::LocalServices(local)) })) => {
                    shared.local_services.send_replace(Some(Arc::new(local.services)));
                }
                Ok(Some(_)) => {}
                Ok(None) => return Status::unavailable("the apiserver ended the session"),
                Err(status) => {
                    refuse_oldest(shared, &mut unanswered, &status);
                    return status;
                }
            },
        }
    }
}

/// A session that ends with INVALID_ARGUMENT (or FAILED_PRECONDITION, RESOURCE_EXHAUSTED)
/// ended on the oldest endpoint not yet answered: it is dropped from what is published, so
/// the next session does not fail on it again, and whoever waits for its identity hears why.
fn refuse_oldest(shared: &Shared, unanswered: &mut VecDeque<(u64, u64)>, status: &Status) {
    use tonic::Code;
    if !matches!(
        status.code(),
        Code::InvalidArgument | Code::FailedPrecondition | Code::ResourceExhausted
    ) {
        return;
    }
    let Some((id, revision)) = unanswered.pop_front() else {
        return;
    };
    {
        let mut desired = shared.desired();
        if desired
            .endpoints
            .get(&id)
            .is_some_and(|(r, _)| *r == revision)
        {
            desired.endpoints.remove(&id);
        }
    }
    tracing::warn!(endpoint = id, %status, "the apiserver refused an endpoint; it is not published");
    shared.answers.send_modify(|a| {
        a.insert(
            id,
            (revision, Outcome::Refused(status.message().to_owned())),
        );
    });
}
