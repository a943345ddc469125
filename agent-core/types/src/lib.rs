//! Cilium's kvstore objects, read the way Go reads JSON and written the way Go writes it.
//!
//! | object | key (below its prefix) | type | decoder |
//! |---|---|---|---|
//! | node | `<cluster>/<node>` under [`NODES_PREFIX`](crate::keys::NODES_PREFIX) | [`Node`] | [`NodeDecoder`] |
//! | service | `<cluster>/<namespace>/<name>` under [`SERVICES_PREFIX`](crate::keys::SERVICES_PREFIX) | [`ClusterService`] | [`ServiceDecoder`] |
//! | identity | `<numeric id>` under [`IDENTITY_ID_PREFIX`](crate::keys::IDENTITY_ID_PREFIX) | [`Identity`] ([`Labels`]) | [`IdentityDecoder`] |
//! | ipcache | `<ip>` or `<ip>/<len>` under [`IPCACHE_DEFAULT_PREFIX`](crate::keys::IPCACHE_DEFAULT_PREFIX) | [`IpIdentityPair`] | [`IpCacheDecoder`] |
//! | cluster config | `<cluster>` under [`CLUSTER_CONFIG_PREFIX`](crate::keys::CLUSTER_CONFIG_PREFIX) | [`ClusterConfig`] | [`ClusterConfigDecoder`] |
//!
//! The key prefixes are in [`keys`]; [`Decoder`] turns a stored value into one of these
//! types; [`Resource`] and [`SyncKind`] name what a remote cluster syncs and what callers wait
//! for.
//!
//! The decoders validate what a remote cluster sends (its name, its ID, keys matching values)
//! so that a remote can never write entries for another cluster. [`go_json`] holds the
//! Go-compatible JSON machinery.

mod base64;
mod cluster_config;
mod decoder;
pub mod events;
pub mod go_json;
mod identity;
mod ipcache;
mod ipcache_entry;
mod ipcache_key;
mod ipcache_scan;
pub mod keys;
mod kinds;
mod labels;
mod names;
mod net;
mod node;
mod node_scan;
mod plain_scan;
mod service;
#[cfg(test)]
mod shortcut_corpus;

pub use cluster_config::{
    CLUSTER_NAME_MAX_LEN, ClusterConfig, ClusterConfigCapabilities, ClusterConfigDecoder,
    ClusterConfigError, DEFAULT_MAX_CONNECTED_CLUSTERS, EXTENDED_MAX_CONNECTED_CLUSTERS,
    validate_cluster_id, validate_cluster_name, validate_max_connected_clusters,
};
pub use decoder::{DecodeError, Decoder, KeyedValue, RawDecoder};
pub use events::{Change, RemoteEvent};
pub use identity::{
    Identity, IdentityDecoder, MINIMAL_NUMERIC_IDENTITY, cluster_id_shift, identity_range,
};
pub use ipcache::{IpCacheDecoder, IpIdentityPair, NamedPort};
pub use ipcache_entry::{IpCacheEntry, IpCacheEntryDecoder};
pub use kinds::{Resource, SyncKind};
pub use labels::{
    LABEL_SOURCE_K8S, LABEL_SOURCE_RESERVED, LABEL_SOURCE_UNSPEC, Label, LabelRef, Labels,
    POLICY_LABEL_CLUSTER,
};
pub use names::validate_node_name;
pub use net::{IpMask, IpPrefix, PrefixError};
pub use node::{Address, AddressType, Node, NodeDecoder};
pub use service::{
    BackendZone, ClusterService, ForZone, L4Addr, L4Type, PortConfiguration, ServiceDecoder,
};
