//! kvstoremesh (cilium-semantics §9): every remote cluster of the mesh, cached in the local
//! etcd under `cilium/cache/<type>/v1/<cluster>/…`, so that the agents of this cluster hold
//! one etcd connection — their own — instead of one per remote.
//!
//! Each remote is connected with the agent's own machinery
//! ([`meshwork_clustermesh::mesh::ClusterMesh`] over [`stores::CacheStores`]): the config
//! directory, TLS, cluster-config validation, unique cluster IDs, sync canaries, backoff.
//! Every entry goes through the agent's decoder before it is cached, so a hostile entry never
//! reaches the cache; what is cached is the remote's value, byte for byte.
//!
//! - [`keys`]: where a remote's entries, canaries and config are cached.
//! - [`mirror`]: the validating decoder and the store observer that turn a remote's
//!   changes into [`keys::CacheOp`]s.
//! - [`stores`]: the four stores of one remote.
//! - [`writer`]: the one task writing the cache (leases, the first list's clean-up, the
//!   canaries, the removal drain).
//! - [`readiness`]: when the cache is ready (Cilium's per-cluster and global timeouts).
//! - [`service`]: the whole, started; [`api`]: its status API (`meshwork.kvstoremesh.v1`).

pub mod api;
pub mod keys;
pub mod metrics;
pub mod mirror;
pub mod readiness;
pub mod service;
pub mod stores;
pub mod writer;
