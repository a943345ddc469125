//! Meshwork agent logic.
//!
//! - [`kvstore`]: the etcd backend, the restartable watch store and the canary-gated watch
//!   store manager — Cilium's `pkg/kvstore/store` semantics.
//! - [`types`]: Cilium's kvstore objects (node, service, identity, ipcache pair, cluster
//!   config), read the way Go reads JSON and written with Go's field names.

pub mod kvstore;
pub mod types;
