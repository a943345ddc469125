//! The config directory state machine: directory scans in, cluster events out. No IO.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};

use super::parse::{FileError, is_config_file, parse_config};
use super::{ClusterConfigEvent, RemoteClusterConfig, ScannedFile};
use meshwork_types::validate_cluster_name;

/// The clusters configured in the directory, as last reported.
///
/// Feed it every scan with [`apply`](Self::apply); it returns what changed since the previous
/// one. Like Cilium it tracks one content hash per file name: unchanged content is no event,
/// changed content is an `Upsert` (valid) or an `Invalid`, a file that disappears — or stops
/// containing `endpoints:` — is a `Remove`.
#[derive(Debug, Clone)]
pub struct ConfigDirState {
    dir: PathBuf,
    local_cluster: String,
    tracked: BTreeMap<String, Tracked>,
    /// Hash of the local cluster's own file, so it is logged once per change, not per scan.
    local_seen: Option<u64>,
}

#[derive(Debug, Clone, Copy)]
struct Tracked {
    hash: u64,
    valid: bool,
}

impl ConfigDirState {
    /// An empty state for `dir` (relative paths in the files resolve against it) in the cluster
    /// named `local_cluster`, whose own file is ignored.
    pub fn new(dir: impl Into<PathBuf>, local_cluster: impl Into<String>) -> Self {
        Self {
            dir: dir.into(),
            local_cluster: local_cluster.into(),
            tracked: BTreeMap::new(),
            local_seen: None,
        }
    }

    /// The config directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The local cluster name.
    pub fn local_cluster(&self) -> &str {
        &self.local_cluster
    }

    /// Every configured cluster, valid or not, in name order.
    pub fn clusters(&self) -> impl Iterator<Item = &str> {
        self.tracked.keys().map(String::as_str)
    }

    /// The configured clusters whose file is currently invalid.
    pub fn invalid_clusters(&self) -> impl Iterator<Item = &str> {
        self.tracked
            .iter()
            .filter(|(_, t)| !t.valid)
            .map(|(name, _)| name.as_str())
    }

    /// How many clusters are configured (invalid ones included).
    pub fn len(&self) -> usize {
        self.tracked.len()
    }

    /// Whether no cluster is configured.
    pub fn is_empty(&self) -> bool {
        self.tracked.is_empty()
    }

    /// Takes a full scan of the directory and returns the changes since the previous scan:
    /// `Upsert`s and `Invalid`s in name order, then `Remove`s in name order.
    pub fn apply(&mut self, scan: &BTreeMap<String, ScannedFile>) -> Vec<ClusterConfigEvent> {
        let mut events = Vec::new();
        let mut present = BTreeSet::new();
        let mut local_hash = None;
        for (name, file) in scan {
            let hash = match file {
                ScannedFile::Content(bytes) if is_config_file(bytes) => content_hash(0, bytes),
                ScannedFile::Content(_) => continue,
                // Unknown content: the error text stands in, so a persisting error is one event.
                ScannedFile::Unreadable(error) => content_hash(1, error.as_bytes()),
            };
            if *name == self.local_cluster {
                local_hash = Some(hash);
                continue;
            }
            present.insert(name.as_str());
            if self.tracked.get(name).is_some_and(|t| t.hash == hash) {
                continue;
            }
            let event = match self.evaluate(name, file) {
                Ok(etcd) => {
                    tracing::debug!(cluster = %name, "added or updated cluster configuration");
                    let config = RemoteClusterConfig {
                        name: name.clone(),
                        etcd,
                        hash,
                    };
                    ClusterConfigEvent::Upsert {
                        name: name.clone(),
                        config,
                    }
                }
                Err(err) => {
                    let error = format!("{}: {err}", self.dir.join(name).display());
                    tracing::warn!(cluster = %name, %error, "invalid cluster configuration");
                    ClusterConfigEvent::Invalid {
                        name: name.clone(),
                        error,
                    }
                }
            };
            let valid = matches!(event, ClusterConfigEvent::Upsert { .. });
            self.tracked.insert(name.clone(), Tracked { hash, valid });
            events.push(event);
        }
        if local_hash.is_some() && local_hash != self.local_seen {
            tracing::debug!(cluster = %self.local_cluster, "ignoring configuration for own cluster");
        }
        self.local_seen = local_hash;
        self.tracked.retain(|name, _| {
            let keep = present.contains(name.as_str());
            if !keep {
                tracing::debug!(cluster = %name, "removed cluster configuration");
                events.push(ClusterConfigEvent::Remove { name: name.clone() });
            }
            keep
        });
        events
    }

    fn evaluate(
        &self,
        name: &str,
        file: &ScannedFile,
    ) -> Result<meshwork_kvstore::EtcdConfig, FileError> {
        validate_cluster_name(name)?;
        match file {
            ScannedFile::Content(bytes) => parse_config(&self.dir, bytes),
            ScannedFile::Unreadable(error) => Err(FileError::Unreadable(error.clone())),
        }
    }
}

/// A per-process hash of a file's content; `tag` keeps content and read errors apart.
fn content_hash(tag: u8, bytes: &[u8]) -> u64 {
    let mut hasher = DefaultHasher::new();
    tag.hash(&mut hasher);
    bytes.hash(&mut hasher);
    hasher.finish()
}
