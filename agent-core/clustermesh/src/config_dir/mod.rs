//! The remote cluster config directory (`--clustermesh-config DIR`, contract §2).
//!
//! One file per remote cluster; the file name is the cluster name. As in Cilium
//! (`pkg/clustermesh/common/config.go`), an entry counts only if it is a regular file (a
//! symlink to one counts: Kubernetes secret volumes are `name -> ..data/name`) whose content
//! contains `endpoints:`; its content is hashed so an identical rewrite is not a change, and a
//! file named like the local cluster is ignored. Dot entries (`..data`, `..2024_…`, editor swap
//! files) are skipped.
//!
//! The content is the etcd client config (`endpoints`, `trusted-ca-file`, `cert-file`,
//! `key-file`, the deprecated `ca-file`, `insecure-transport`), read as Go's `sigs.k8s.io/yaml`
//! reads it: keys match case-insensitively, unknown keys are ignored. Relative file paths are
//! resolved against the config directory (Cilium hands them to etcd's Go client, which
//! resolves them against the agent's working directory).
//!
//! Three layers:
//! - [`ConfigDirState`]: the state machine, no IO — a directory scan in, [`ClusterConfigEvent`]s
//!   out;
//! - [`scan_dir`]: reads the directory once, synchronously;
//! - [`ConfigDirWatcher`]: the actix actor that watches the directory with `notify` and sends
//!   the events to a [`Recipient`](actix::Recipient). [`ConfigDirWatcher::read_initial`] is the
//!   synchronous first read the agent does before it starts anything else, so every configured
//!   cluster is known before any wait.
//!
//! An invalid file (bad YAML, no usable endpoint, a bad cluster name, an unreadable file) is
//! still a configured cluster: it is reported as [`ClusterConfigEvent::Invalid`], counts in the
//! total, and gets an [`ClusterConfigEvent::Upsert`] once it becomes valid.

mod parse;
mod scan;
mod state;
mod watcher;

#[cfg(test)]
mod tests;

use std::path::PathBuf;

use meshwork_kvstore::EtcdConfig;

pub use scan::{ScannedFile, scan_dir};
pub use state::ConfigDirState;
pub use watcher::{ConfigDirWatcher, DEFAULT_DEBOUNCE, StopWatching};

/// A remote cluster's connection config, read from its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteClusterConfig {
    /// The cluster name (the file name).
    pub name: String,
    /// How to reach the cluster's etcd; file paths are absolute when the directory was given
    /// as an absolute path.
    pub etcd: EtcdConfig,
    /// Hash of the file content; equal hashes mean an identical file. Stable only within one
    /// process (never persist it).
    pub hash: u64,
}

/// A change in the config directory.
#[derive(Debug, Clone, PartialEq, Eq, actix::Message)]
#[rtype(result = "()")]
pub enum ClusterConfigEvent {
    /// A new cluster, or new content for a known one (valid or previously invalid): connect,
    /// or reconnect the same cluster object.
    Upsert {
        /// The cluster name.
        name: String,
        /// Its new config.
        config: RemoteClusterConfig,
    },
    /// The cluster's file went away (or no longer contains `endpoints:`): remove the cluster
    /// and drain what it contributed. Also sent for a cluster only ever seen as invalid.
    Remove {
        /// The cluster name.
        name: String,
    },
    /// The cluster's file is configured but unusable. The cluster stays configured (it counts
    /// in the total and shows `error` in its status) until the file is fixed or removed.
    Invalid {
        /// The cluster name.
        name: String,
        /// What is wrong, naming the file.
        error: String,
    },
}

impl ClusterConfigEvent {
    /// The cluster the event is about.
    pub fn name(&self) -> &str {
        match self {
            Self::Upsert { name, .. } | Self::Remove { name } | Self::Invalid { name, .. } => name,
        }
    }
}

/// The config directory cannot be read at all.
#[derive(Debug, thiserror::Error)]
pub enum ConfigDirError {
    /// The directory does not exist. Cilium refuses to start in that case too (its fsnotify
    /// watch on the path fails), rather than waiting for the directory to appear.
    #[error("clustermesh config directory {} does not exist", dir.display())]
    NotFound {
        /// The directory.
        dir: PathBuf,
    },
    /// The path exists but is not a directory.
    #[error("clustermesh config path {} is not a directory", dir.display())]
    NotADirectory {
        /// The path.
        dir: PathBuf,
    },
    /// Listing the directory failed.
    #[error("reading clustermesh config directory {}: {error}", dir.display())]
    Read {
        /// The directory.
        dir: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
}
