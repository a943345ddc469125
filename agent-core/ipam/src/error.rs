//! Why an allocation or a release failed; [`AllocateError::reason`] is the metrics label.

use std::net::Ipv4Addr;

use crate::checkpoint::CheckpointError;

/// Why no IP was handed out.
#[derive(Debug, thiserror::Error)]
pub enum AllocateError {
    /// The owner is empty.
    #[error("the owner is empty")]
    InvalidOwner,
    /// ENI mode, before the first consistent snapshot: nothing to allocate from.
    #[error("no usable snapshot from the operator yet")]
    NoSnapshot,
    /// Every IP the pool may hand out is held.
    #[error(
        "no free IP: the pool has {pool} IPs, {in_use} handed out, {in_handshake} in a release handshake"
    )]
    Exhausted {
        /// Addresses in the pool.
        pool: usize,
        /// Of them, handed out.
        in_use: usize,
        /// Of them, in a release handshake (never handed out).
        in_handshake: usize,
    },
    /// The snapshot's pool names an ENI it does not carry (Cilium's fatal "unable to find
    /// ENI"; a checked snapshot never does, so this is a bug, and nothing was recorded).
    #[error("unable to find ENI {eni} of pool IP {ip} in snapshot {generation}")]
    EniMissing {
        /// The pool IP.
        ip: Ipv4Addr,
        /// The ENI it names.
        eni: String,
        /// The snapshot.
        generation: String,
    },
    /// Cluster-pool: the router IP is held by a restored allocation of another owner.
    #[error("the router IP {ip} is held by {holder} (restored from the checkpoint)")]
    RouterIpTaken {
        /// The router IP.
        ip: Ipv4Addr,
        /// Who holds it.
        holder: String,
    },
    /// The checkpoint could not be written: nothing was handed out.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

impl AllocateError {
    /// A short label for metrics (`reason`).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidOwner => "invalid_owner",
            Self::NoSnapshot => "no_snapshot",
            Self::Exhausted { .. } => "exhausted",
            Self::EniMissing { .. } => "eni_missing",
            Self::RouterIpTaken { .. } => "router_ip_taken",
            Self::Checkpoint(_) => "checkpoint",
        }
    }

    /// Every label [`Self::reason`] can return (so a scrape shows zeros, not nothing).
    pub const REASONS: [&'static str; 6] = [
        "invalid_owner",
        "no_snapshot",
        "exhausted",
        "eni_missing",
        "router_ip_taken",
        "checkpoint",
    ];
}

/// Why a release failed.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    /// The owner is empty.
    #[error("the owner is empty")]
    InvalidOwner,
    /// The checkpoint could not be written: the IP stays allocated.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}
