//! The loop that runs an [`Elector`] against a [`LeaseApi`]: one read (and at most one
//! write) every retry period, the role published on a `watch` channel, the lease given up
//! when stopped while leading.

use k8s_openapi::jiff::Timestamp;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::lease::{LeaseApi, LeaseError};
use super::state::{Elector, Step};

/// A candidate's role, as the driver publishes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Not leading; `holder` is who does, when known.
    Candidate {
        /// The current holder, if another candidate holds the lease.
        holder: Option<String>,
    },
    /// Leading: this candidate holds the lease.
    Leader,
    /// Led, then went a renew deadline without renewing: whatever it does as the leader
    /// must stop now. Final.
    Lost,
}

/// How [`run`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Stopped by its token; the lease was given up if this candidate held it.
    Stopped,
    /// Leadership was lost ([`Role::Lost`]).
    Lost,
}

/// Runs the election until `stop` is cancelled or leadership is lost, publishing every
/// change of role on `role`. Each attempt (read, then create or update) is bounded: by the
/// renew deadline of the current leadership while leading (so a hung request cannot keep a
/// stale leader acting), by one renew deadline otherwise.
pub async fn run<A: LeaseApi>(
    api: &A,
    elector: &mut Elector,
    stop: &CancellationToken,
    role: &watch::Sender<Role>,
) -> Ended {
    let timing = elector.timing();
    loop {
        let started = Instant::now();
        let deadline = elector
            .leading_until(started)
            .unwrap_or(started + timing.renew_deadline);
        let attempt = tokio::time::timeout_at(deadline, attempt(api, elector, started));
        let outcome = tokio::select! {
            biased;
            () = stop.cancelled() => return stopped(api, elector, role).await,
            outcome = attempt => outcome,
        };
        let now = Instant::now();
        if elector.lost(now) {
            tracing::warn!(
                identity = elector.identity(),
                "leader election lost: no renewal within the renew deadline"
            );
            role.send_replace(Role::Lost);
            return Ended::Lost;
        }
        let next = match outcome {
            Ok(Ok(Attempt::Holding)) => Role::Leader,
            Ok(Ok(Attempt::HeldBy(holder))) => Role::Candidate {
                holder: Some(holder),
            },
            Ok(Err(err)) => {
                tracing::info!(%err, "leader election attempt failed; retrying");
                current_candidate(role)
            }
            Err(_) => {
                tracing::info!("leader election attempt timed out; retrying");
                current_candidate(role)
            }
        };
        role.send_if_modified(|current| {
            if *current == next {
                return false;
            }
            if next == Role::Leader {
                tracing::info!(
                    identity = elector.identity(),
                    "leader election won: leading"
                );
            }
            *current = next;
            true
        });
        tokio::select! {
            biased;
            () = stop.cancelled() => return stopped(api, elector, role).await,
            () = tokio::time::sleep(timing.retry_period) => {}
        }
    }
}

/// What one attempt found.
enum Attempt {
    /// This candidate holds the lease (created, took it over, or renewed it).
    Holding,
    /// Another holds an unexpired lease.
    HeldBy(String),
}

/// One read and, if the elector says so, one write; `now` is when the attempt began.
async fn attempt<A: LeaseApi>(
    api: &A,
    elector: &mut Elector,
    now: Instant,
) -> Result<Attempt, LeaseError> {
    let current = api.get().await?;
    match elector.step(current.as_ref(), now, Timestamp::now()) {
        Step::Wait { holder } => Ok(Attempt::HeldBy(holder)),
        Step::Create(record) => {
            api.create(&record).await?;
            elector.written(record, now);
            Ok(Attempt::Holding)
        }
        Step::Update {
            record,
            resource_version,
        } => {
            api.update(&record, &resource_version).await?;
            elector.written(record, now);
            Ok(Attempt::Holding)
        }
    }
}

/// The candidate role, keeping the holder last seen.
fn current_candidate(role: &watch::Sender<Role>) -> Role {
    match &*role.borrow() {
        Role::Candidate { holder } => Role::Candidate {
            holder: holder.clone(),
        },
        Role::Leader | Role::Lost => Role::Candidate { holder: None },
    }
}

/// Stopped: give the lease up if this candidate holds it, so the next one takes over at its
/// next try instead of a lease duration later.
async fn stopped<A: LeaseApi>(api: &A, elector: &mut Elector, role: &watch::Sender<Role>) -> Ended {
    let now = Instant::now();
    if let Some(release) = elector.release(now, Timestamp::now()) {
        let deadline = elector.leading_until(now).unwrap_or(now);
        let given_up = tokio::time::timeout_at(deadline, async {
            match api.get().await? {
                Some(current) if current.record.holder == elector.identity() => {
                    api.update(&release, &current.resource_version).await
                }
                // Someone else holds it already, or it is gone: nothing of ours to give up.
                _ => Ok(()),
            }
        })
        .await;
        match given_up {
            Ok(Ok(())) => tracing::info!("leader election: lease released"),
            Ok(Err(err)) => tracing::warn!(%err, "leader election: releasing the lease failed"),
            Err(_) => tracing::warn!("leader election: releasing the lease timed out"),
        }
    }
    role.send_replace(Role::Candidate { holder: None });
    Ended::Stopped
}
