//! Meshwork agent logic.
//!
//! - [`clustermesh`]: remote clusters, the sync barrier, the remote state they feed.
//! - [`datapath`]: the BPF endpoint program, the pinned maps, the writer and the endpoints.
//! - [`kvstore`]: the etcd backend, the restartable watch store and the canary-gated watch
//!   store manager — Cilium's `pkg/kvstore/store` semantics.
//! - [`wireguard`]: peers for remote nodes over a WireGuard device, kept across restarts.
//! - [`types`]: Cilium's kvstore objects (node, service, identity, ipcache pair, cluster
//!   config), read the way Go reads JSON and written with Go's field names.

pub mod clustermesh;
pub mod datapath;
pub mod kvstore;
pub mod types;
pub mod wireguard;
