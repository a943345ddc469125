//! The kvstore layer: Cilium's etcd layout and watch-store semantics.
//!
//! - [`EtcdBackend`]: connection (TLS), paginated lists, watches, leases.
//! - [`WatchStore`]: the restartable watch store of one prefix, its entries in a
//!   [`store_table`].
//! - [`WatchStoreManager`]: starts per-prefix work gated by sync canaries, or at once.
//! - [`lease_writer::Writer`]: keys under leases, adopted across restarts.
//! - [`follow::follow_prefix`]: every change under a prefix, whoever made it.
//! - [`shared::SharedBackends`]: one client for every remote that names the same etcd.
//! - [`watch_hub`]: one etcd watch serving every watch of a backend under a root prefix.
//! - [`Decoder`]: typed, validated decoding of values (see [`meshwork_types`]).

pub mod config;
pub mod error;
pub mod etcd;
pub mod follow;
pub mod lease_writer;
pub mod manager;
pub mod metrics;
pub mod shared;
pub mod store_table;
pub mod watch_hub;
pub mod watch_store;

pub use config::EtcdConfig;
pub use error::KvstoreError;
pub use etcd::{ConditionalPut, EtcdBackend, KeyWrite, ListPage, TxnRead, Watch, WatchEvent};
pub use manager::WatchStoreManager;
pub use meshwork_types::{DecodeError, Decoder, KeyedValue, RawDecoder, keys};
pub use metrics::KvstoreMetrics;
pub use watch_store::{Observer, StoreStatus, WatchStore, WatchStoreOptions};
