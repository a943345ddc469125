//! The Meshwork lab: real components for tests, benchmarks and `cargo xtask demo`.
//!
//! Everything here starts a real thing — an etcd server, a patched moto server, a network
//! namespace, a wireguard-go device — and stops and removes it when its handle is dropped,
//! also while a test unwinds from a panic. Child processes additionally carry
//! `PR_SET_PDEATHSIG`, so a test process killed outright does not leave servers behind.
//!
//! Network safety: every address used by the lab is on 127.0.0.0/8 or inside a network
//! namespace the lab made; see [`net`] for the root-namespace `unreachable` routes that are
//! installed before any namespace address exists.

pub mod agent;
pub mod apiserver;
pub mod bpffs;
pub mod cgroup;
pub mod cilium;
pub mod eni_scene;
pub mod error;
pub mod etcd;
pub mod etcd_cluster;
pub mod kvstoremesh;
pub mod moto;
pub mod net;
pub mod operator;
pub mod paths;
pub mod podman;
pub mod proc_stat;
pub mod process;
pub mod prometheus;
pub mod python_client;
pub mod ramfs;
pub mod wait;
pub mod wireguard;

pub use error::{LabError, Result};
