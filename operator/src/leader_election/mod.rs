//! Leader election on a `coordination.k8s.io/v1` Lease, so that of the operator's replicas
//! exactly one allocates and serves at a time (Cilium's operator does the same, with
//! client-go's leader election, on the Lease `cilium-operator-resource-lock`). Used only when
//! the CiliumNodes live in Kubernetes (`--kube`); in kvstore mode the operator runs alone, as
//! before.
//!
//! The rules are client-go's:
//! - a candidate reads the Lease every retry period; with no Lease it creates one naming
//!   itself; a Lease held by another is left alone until `leaseDurationSeconds` have passed,
//!   by the candidate's own clock, since it last saw the record change; then (or when the
//!   holder is empty: released) it takes it over, counting one more transition;
//! - the leader renews the same way; a write carries the resourceVersion read, so of two
//!   candidates writing at once one gets 409 and stays a candidate;
//! - a leader that has not renewed within the renew deadline has lost, and must stop at
//!   once: the renew deadline is shorter than the lease duration, so it stops before any
//!   other candidate can take over;
//! - a leader that stops gives the lease up (empty holder), so the next one takes over at
//!   its next try.
//!
//! Layers: [`state::Elector`] decides (plain, time passed in), [`lease::LeaseApi`] is the
//! lock ([`lease::KubeLease`] over kube's `Api<Lease>`), [`driver::run`] is the thin loop.

pub mod driver;
pub mod lease;
pub mod state;

#[cfg(test)]
mod tests;

use std::time::Duration;

pub use driver::{Ended, Role, run};
pub use lease::{KubeLease, LeaseApi, LeaseError};
pub use state::{Elector, Observed, Record, Step};

/// The Lease's name, after Cilium's `cilium-operator-resource-lock`.
pub const LEASE_NAME: &str = "meshwork-operator-resource-lock";

/// client-go's jitter factor: the renew deadline must leave room for a retry period this
/// much longer.
const JITTER_FACTOR: f64 = 1.2;

/// The election's three durations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How long a holder's lease lasts after it was last seen renewed.
    pub lease_duration: Duration,
    /// How long a leader keeps leading without a successful renewal.
    pub renew_deadline: Duration,
    /// How often a candidate tries, and a leader renews.
    pub retry_period: Duration,
}

impl Default for Timing {
    /// Cilium's operator defaults: 15 s, 10 s, 2 s.
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Durations the election cannot run safely with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimingError {
    /// The lease must outlast the renew deadline: a leader must stop before another may
    /// take over.
    #[error(
        "--leader-election-lease-duration ({lease:?}) must be longer than --leader-election-renew-deadline ({renew:?})"
    )]
    LeaseNotAboveRenew {
        /// The lease duration.
        lease: Duration,
        /// The renew deadline.
        renew: Duration,
    },
    /// The renew deadline must leave room for a retry (client-go's 1.2 × the retry period).
    #[error(
        "--leader-election-renew-deadline ({renew:?}) must be longer than 1.2 × --leader-election-retry-period ({retry:?})"
    )]
    RenewNotAboveRetry {
        /// The renew deadline.
        renew: Duration,
        /// The retry period.
        retry: Duration,
    },
    /// A whole number of seconds of at least one is written into the Lease.
    #[error("--leader-election-lease-duration ({0:?}) must be at least 1s")]
    LeaseTooShort(Duration),
}

impl Timing {
    /// Refuses durations client-go refuses: lease > renew deadline > 1.2 × retry period > 0.
    pub fn validate(&self) -> Result<(), TimingError> {
        if self.lease_duration < Duration::from_secs(1) {
            return Err(TimingError::LeaseTooShort(self.lease_duration));
        }
        if self.lease_duration <= self.renew_deadline {
            return Err(TimingError::LeaseNotAboveRenew {
                lease: self.lease_duration,
                renew: self.renew_deadline,
            });
        }
        if self.retry_period.is_zero()
            || self.renew_deadline.as_secs_f64() <= JITTER_FACTOR * self.retry_period.as_secs_f64()
        {
            return Err(TimingError::RenewNotAboveRetry {
                renew: self.renew_deadline,
                retry: self.retry_period,
            });
        }
        Ok(())
    }
}

/// The election's flags, named as Cilium's operator names them.
#[derive(Debug, Clone, clap::Args)]
pub struct LeaderElectionArgs {
    /// How long a leader's lease lasts after its last renewal: a replica takes over this
    /// long after it last saw the leader renew (with `--kube` only).
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub leader_election_lease_duration: Duration,
    /// How long the leader keeps leading without renewing; then it stops and exits.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub leader_election_renew_deadline: Duration,
    /// How often a replica tries to take the lease, and the leader renews it.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub leader_election_retry_period: Duration,
    /// The namespace the operator runs in, where its Lease
    /// (`meshwork-operator-resource-lock`) lives (default: the kube client's namespace —
    /// in a pod, its service account's).
    #[arg(long, env = "MESHWORK_K8S_NAMESPACE", value_name = "NAMESPACE")]
    pub k8s_namespace: Option<String>,
}

impl LeaderElectionArgs {
    /// The three durations.
    pub fn timing(&self) -> Timing {
        Timing {
            lease_duration: self.leader_election_lease_duration,
            renew_deadline: self.leader_election_renew_deadline,
            retry_period: self.leader_election_retry_period,
        }
    }
}

/// A candidate identity unique across replicas and restarts, as client-go makes it: the
/// host name (a pod's name) and a random UUID from the kernel.
pub fn identity() -> String {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .map(|text| text.trim().to_owned())
            .unwrap_or_default()
    };
    let host = read("/proc/sys/kernel/hostname");
    let uuid = read("/proc/sys/kernel/random/uuid");
    format!("{host}_{uuid}")
}
