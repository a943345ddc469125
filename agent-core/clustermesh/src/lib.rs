//! Meshwork's cluster mesh: remote clusters, their sync barrier and the identities they
//! contribute (contract §2–§4).
//!
//! - [`config_dir`]: the clustermesh config directory, read once and then watched.
//! - [`mesh_state`]: the lifecycle of the remote clusters (a plain state machine), carried
//!   out by the [`mesh::ClusterMesh`] actor over each cluster's [`remote_cluster`] loop.
//! - [`events`]: what the remote stores send their consumers, first list-dones in-band.
//! - [`barrier`]: the latches and the mesh-level waits, with its actor [`barrier_actor`].
//! - [`identity_cache`]: remote identities with Cilium's on-sync semantics, with its actor
//!   [`identity_actor`].
//! - [`status`]: what each remote cluster reports, in the API's shape by [`status_api`].
//! - [`timeline`]: when each step of the agent's current start happened, in the API's shape
//!   by [`timeline_api`].

pub mod barrier;
pub mod barrier_actor;
pub mod cluster_ids;
pub mod config_dir;
pub mod events;
pub mod identity_actor;
pub mod identity_cache;
pub mod mesh;
pub mod mesh_state;
pub mod metrics;
pub mod remote_cluster;
pub mod status;
pub mod status_api;
pub mod timeline;
pub mod timeline_api;

pub use barrier::{ClusterWait, Consumer, MeshWait, SyncBarrier, WaitError, WaitOutcome};
pub use meshwork_types::{Resource, SyncKind};
