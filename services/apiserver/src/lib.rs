//! `meshwork-apiserver`: one per cluster, the only writer of its cluster's etcd
//! (cilium-semantics §8). Agents publish their node and endpoints to it; it writes them in
//! Cilium's layout.
//!
//! - [`identities`]: numeric identities for label sets, in the cluster's range.
//! - [`state`]: what the cluster exports, as desired etcd keys (a plain state machine).
//! - [`initial_sync`]: when the initial state is complete and the canaries may be written.
//! - [`control_keys`]: the cluster config, heartbeat and canary keys.
//! - [`writer`]: writes keys under leases, skipping unchanged values, and adopts what a
//!   previous apiserver wrote.
//! - [`declarations`]: the declared services, kept in etcd across restarts.
//! - [`exporter`]: the loop that owns them, fed by typed commands and its timers.
//! - [`validate`]: the gRPC requests checked and turned into the state's specs.
//! - [`grpc`]: `meshwork.apiserver.v1.Export`, turning sessions and calls into commands.
//! - [`metrics`]: the `meshwork_apiserver_*` metrics.
//! - [`cli`]: the binary's command line (here so a manifest's args parse as the binary
//!   parses them).
//! - [`etcd_init`]: Cilium's etcd users and roles for the cluster.

pub mod cli;
pub mod control_keys;
pub mod declarations;
pub mod etcd_init;
pub mod exporter;
pub mod grpc;
pub mod identities;
pub mod initial_sync;
pub mod metrics;
pub mod state;
pub mod validate;
pub mod writer;
