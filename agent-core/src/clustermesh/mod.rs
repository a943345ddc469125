//! The cluster mesh: remote clusters, their sync barrier and the state they contribute.

pub mod barrier;
pub mod barrier_actor;
pub mod cluster_ids;
pub mod config_dir;
pub mod events;
pub mod identity_actor;
pub mod identity_cache;
pub mod kinds;
pub mod mesh;
pub mod metrics;
pub mod remote_cluster;
pub mod remote_state;
pub mod status;

pub use barrier::{ClusterWait, MeshWait, SyncBarrier, WaitError, WaitOutcome};
pub use kinds::{Resource, SyncKind};
