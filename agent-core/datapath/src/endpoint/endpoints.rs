//! The local endpoints and the device work they need, as a plain state machine: specs in,
//! [`Job`]s out, one at a time, in order. Jobs load the verifier and talk to the kernel, so
//! the agent's `EndpointManager` runs each one off its own thread ([`Job::run`]) and reports
//! the outcome back with [`Endpoints::finished`]; meanwhile the table answers status at once.
//!
//! A restored endpoint keeps its old program until it regenerates; one deleted while it
//! waits is simply never regenerated. A detach is a job too, queued behind a regeneration of
//! the same endpoint, so a program is never attached after its endpoint was deleted.

use std::collections::{BTreeMap, VecDeque};
use std::time::SystemTime;

use super::spec::EndpointSpec;
use crate::maps::PinDir;
use crate::program::{self, AttachPoint, ProgramError};

/// Where an endpoint is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndpointState {
    /// Restored (or just put); its old program runs until it regenerates.
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

/// Device work for one endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Job {
    /// Load a fresh program bound to the current maps and attach it.
    Regenerate {
        /// The endpoint's spec (as of when the job was queued).
        spec: EndpointSpec,
        /// Which put of the endpoint the job regenerates (see [`Endpoints::put`]).
        version: u64,
    },
    /// Detach a deleted endpoint's program.
    Detach {
        /// The endpoint.
        id: u64,
        /// Where its program was.
        at: AttachPoint,
    },
}

impl Job {
    /// The endpoint the job is for.
    pub fn id(&self) -> u64 {
        match self {
            Self::Regenerate { spec, .. } => spec.id,
            Self::Detach { id, .. } => *id,
        }
    }

    /// Does the work (blocking: ELF load, the verifier, netlink).
    pub fn run(&self, pins: &PinDir) -> Result<(), ProgramError> {
        match self {
            Self::Regenerate { spec, .. } => {
                program::load_and_attach(pins, &spec.attach_point(), &spec.allowed_identities)
            }
            Self::Detach { at, .. } => program::detach(at),
        }
    }
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct Endpoints {
    endpoints: BTreeMap<u64, (EndpointStatus, u64)>,
    queue: VecDeque<Job>,
    running: bool,
    next_version: u64,
}

impl Endpoints {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds restored endpoints; they wait until [`Self::regenerate`] names them.
    pub fn restore(&mut self, specs: impl IntoIterator<Item = EndpointSpec>) {
        for spec in specs {
            self.insert(spec, true);
        }
    }

    fn insert(&mut self, spec: EndpointSpec, restored: bool) -> u64 {
        self.next_version += 1;
        let version = self.next_version;
        let status = EndpointStatus {
            spec,
            state: EndpointState::WaitingForSync,
            generation: 0,
            regenerated_at: None,
            restored,
        };
        self.endpoints.insert(status.spec.id, (status, version));
        version
    }

    /// Queues the regeneration of each of `ids` still present (restored endpoints whose
    /// wait is over; one deleted meanwhile is skipped).
    pub fn regenerate(&mut self, ids: impl IntoIterator<Item = u64>) {
        for id in ids {
            if let Some((status, version)) = self.endpoints.get(&id) {
                self.queue.push_back(Job::Regenerate {
                    spec: status.spec.clone(),
                    version: *version,
                });
            }
        }
    }

    /// Creates or replaces an endpoint and queues its regeneration, which it answers.
    pub fn put(&mut self, spec: EndpointSpec) -> Job {
        let id = spec.id;
        let restored = self.endpoints.get(&id).is_some_and(|(s, _)| s.restored);
        let version = self.insert(spec.clone(), restored);
        let job = Job::Regenerate { spec, version };
        self.queue.push_back(job.clone());
        job
    }

    /// Deletes an endpoint and queues the detach of its program. Answers that job and the
    /// regenerations of the endpoint that were still queued (dropped now); `None` when the
    /// endpoint did not exist.
    pub fn delete(&mut self, id: u64) -> Option<(Job, Vec<Job>)> {
        let (status, _) = self.endpoints.remove(&id)?;
        let (dropped, kept): (VecDeque<Job>, _) = std::mem::take(&mut self.queue)
            .into_iter()
            .partition(|job| matches!(job, Job::Regenerate { spec, .. } if spec.id == id));
        self.queue = kept;
        let detach = Job::Detach {
            id,
            at: status.spec.attach_point(),
        };
        self.queue.push_back(detach.clone());
        Some((detach, dropped.into()))
    }

    /// The next job to run, if none runs now.
    pub fn next_job(&mut self) -> Option<Job> {
        if self.running {
            return None;
        }
        let job = self.queue.pop_front()?;
        self.running = true;
        Some(job)
    }

    /// The job that ran last is done with `outcome`. A regeneration of an endpoint deleted
    /// or replaced meanwhile changes nothing.
    pub fn finished(&mut self, job: &Job, outcome: &Result<(), ProgramError>) {
        self.running = false;
        let Job::Regenerate { spec, version } = job else {
            return;
        };
        let Some((status, current)) = self.endpoints.get_mut(&spec.id) else {
            return;
        };
        if current != version {
            return;
        }
        match outcome {
            Ok(()) => {
                status.state = EndpointState::Ready;
                status.generation += 1;
                status.regenerated_at = Some(SystemTime::now());
                tracing::info!(
                    endpoint = spec.id,
                    generation = status.generation,
                    "endpoint regenerated"
                );
            }
            Err(err) => {
                tracing::error!(endpoint = spec.id, %err, "endpoint regeneration failed");
                status.state = EndpointState::Failed(err.to_string());
            }
        }
    }

    /// The endpoints by ID.
    pub fn list(&self) -> Vec<EndpointStatus> {
        self.endpoints.values().map(|(s, _)| s.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::spec::test_spec;

    fn spec(id: u64) -> EndpointSpec {
        test_spec(id)
    }

    fn states(endpoints: &Endpoints) -> Vec<(u64, EndpointState, u64)> {
        endpoints
            .list()
            .into_iter()
            .map(|s| (s.spec.id, s.state, s.generation))
            .collect()
    }

    fn failed() -> Result<(), ProgramError> {
        Err(ProgramError::Missing("a test failure"))
    }

    #[test]
    fn jobs_run_one_at_a_time_in_order_and_only_for_present_endpoints() {
        let mut endpoints = Endpoints::new();
        endpoints.restore([spec(1), spec(2), spec(3)]);
        assert_eq!(endpoints.next_job(), None, "restored endpoints wait");
        assert!(
            endpoints
                .delete(2)
                .is_some_and(|(_, dropped)| dropped.is_empty())
        );
        endpoints.regenerate([1, 2, 3]);
        let first = endpoints.next_job().unwrap();
        assert_eq!(first.id(), 2, "the detach was queued first");
        assert!(matches!(first, Job::Detach { .. }));
        assert_eq!(endpoints.next_job(), None, "one job at a time");
        endpoints.finished(&first, &Ok(()));
        let second = endpoints.next_job().unwrap();
        assert_eq!(second.id(), 1);
        endpoints.finished(&second, &Ok(()));
        let third = endpoints.next_job().unwrap();
        endpoints.finished(&third, &failed());
        assert_eq!(endpoints.next_job(), None);
        assert_eq!(
            states(&endpoints),
            [
                (1, EndpointState::Ready, 1),
                (
                    3,
                    EndpointState::Failed("the endpoint object has no a test failure".to_owned()),
                    0
                )
            ]
        );
    }

    #[test]
    fn a_regeneration_overtaken_by_a_put_or_a_delete_changes_nothing() {
        let mut endpoints = Endpoints::new();
        let old = endpoints.put(spec(1));
        let running = endpoints.next_job().unwrap();
        assert_eq!(running, old);
        let new = endpoints.put(EndpointSpec {
            identity: 2,
            ..spec(1)
        });
        assert_ne!(old, new);
        endpoints.finished(&running, &Ok(()));
        assert_eq!(states(&endpoints), [(1, EndpointState::WaitingForSync, 0)]);
        let next = endpoints.next_job().unwrap();
        assert_eq!(next, new);
        // Deleted while it regenerates: the detach runs after it; a queued put is dropped.
        endpoints.put(spec(1));
        let (detach, dropped) = endpoints.delete(1).unwrap();
        assert_eq!(dropped.len(), 1);
        endpoints.finished(&next, &Ok(()));
        assert!(states(&endpoints).is_empty());
        assert_eq!(endpoints.next_job(), Some(detach));
        assert!(endpoints.delete(1).is_none());
    }
}
