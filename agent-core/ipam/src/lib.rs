//! The agent's IPAM: pod IPs handed out from the operator's ENI snapshots (`--ipam eni`) or
//! from the node's pod CIDR (`--ipam cluster-pool`), every allocation checkpointed before it
//! is returned (§7 and §11 of the behaviour contract).
//!
//! Plain state machines: no actors, no gRPC, no async; time is passed in as an
//! [`Instant`](std::time::Instant). The only IO is the checkpoint file.
//!
//! - [`cidr`]: IPv4 networks (the pod CIDR, ENI subnets, VPC CIDRs).
//! - [`snapshot`]: the agent's view of one operator snapshot, and its consistency check.
//! - [`allocation`]: one handed-out IP, as returned and as checkpointed.
//! - [`checkpoint`]: the allocations' file in the state dir, written atomically.
//! - [`eni_pool`]: the ENI allocator over the newest consistent snapshot, the readiness
//!   latch and the release handshake's answers.
//! - [`cluster_pool`]: host-local allocation from `--ipv4-alloc-cidr`.
//! - [`error`]: why an allocation or a release failed.
//!
//! Both pools keep their allocations in a ledger (crate-private) that writes the checkpoint
//! before a change is applied: an IP is returned only once it is on disk, and a restarted
//! agent gives every owner the IP it had.

pub mod allocation;
pub mod checkpoint;
pub mod cidr;
pub mod cluster_pool;
pub mod eni_pool;
pub mod error;
mod ledger;
pub mod snapshot;

pub use allocation::{Allocated, Allocation, EniAttachment, Mode, ROUTER_OWNER};
pub use checkpoint::{CHECKPOINT_FILE, Checkpoint, CheckpointError};
pub use cidr::{CidrError, Ipv4Cidr};
pub use cluster_pool::{ClusterPool, ClusterPoolError};
pub use eni_pool::{EniPool, EniStatus, Offer, ReleaseAnswer, Report, UsedIp};
pub use error::{AllocateError, ReleaseError};
pub use snapshot::{Eni, Inconsistent, ReleaseState, Snapshot, Watermarks};
