//! The allocations' checkpoint: `<state-dir>/ipam.json`, written atomically (a temporary
//! file beside it, fsynced, renamed over it, the directory fsynced) before any change is
//! applied, and read at start so that the same owners keep the same IPs and no IP leaks
//! across a restart.
//!
//! A missing file is an empty checkpoint (the first start). Anything else that cannot be
//! read — empty, not JSON, an unknown version, two owners of one IP, a checkpoint of the
//! other IPAM mode — is an error naming the file, never an empty start: pods may hold those
//! IPs, and handing them out again would give two pods one address. The operator decides
//! (fix or remove the file).
//!
//! Format (version 1):
//!
//! ```json
//! {"version":1,"mode":"eni","allocations":[{"owner":"router","ip":"10.0.1.7","prefix_len":32,
//!  "gateway":"10.0.1.1","eni":{"id":"eni-1","mac":"02:..","number":1,"vpc_cidrs":["10.0.0.0/16"]},
//!  "generation":"42"}]}
//! ```

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::allocation::{Allocation, Mode};

/// The checkpoint's file name in the agent's state dir.
pub const CHECKPOINT_FILE: &str = "ipam.json";

/// The format written.
const VERSION: u32 = 1;

/// The checkpoint could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Reading failed (other than a missing file).
    #[error("reading the IPAM checkpoint {path}: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        error: io::Error,
    },
    /// The file holds no checkpoint the agent can use.
    #[error(
        "the IPAM checkpoint {path} is corrupt: {why} (pods may hold its IPs: fix or remove the file)"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// It was written in the other IPAM mode.
    #[error(
        "the IPAM checkpoint {path} was written with --ipam {found}, the agent runs --ipam {expected} (pods may hold its IPs: remove the file once they are gone)"
    )]
    Mode {
        /// The file.
        path: PathBuf,
        /// Its mode.
        found: Mode,
        /// The agent's.
        expected: Mode,
    },
    /// Writing failed: the change was not applied.
    #[error("writing the IPAM checkpoint {path}: {error}")]
    Write {
        /// The file (or its temporary file).
        path: PathBuf,
        /// The OS error.
        error: io::Error,
    },
}

#[derive(Serialize)]
struct FileOut<'a> {
    version: u32,
    mode: Mode,
    allocations: Vec<&'a Allocation>,
}

#[derive(Deserialize)]
struct FileIn {
    version: u32,
    mode: Mode,
    allocations: Vec<Allocation>,
}

/// The checkpoint file of one agent.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    path: PathBuf,
}

impl Checkpoint {
    /// `<state_dir>/ipam.json`.
    pub fn in_dir(state_dir: &Path) -> Self {
        Self::at(state_dir.join(CHECKPOINT_FILE))
    }

    /// The checkpoint at `path`.
    pub fn at(path: PathBuf) -> Self {
        Self { path }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The allocations it holds, checked; none when the file does not exist.
    pub fn load(&self, mode: Mode) -> Result<Vec<Allocation>, CheckpointError> {
        let bytes = match std::fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => {
                return Err(CheckpointError::Read {
                    path: self.path.clone(),
                    error,
                });
            }
        };
        let corrupt = |why: String| CheckpointError::Corrupt {
            path: self.path.clone(),
            why,
        };
        if bytes.is_empty() {
            // The rename makes a half-written file impossible: an empty one is damage.
            return Err(corrupt("the file is empty".to_owned()));
        }
        let file: FileIn = serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
        if file.version != VERSION {
            return Err(corrupt(format!(
                "version {} (this agent reads version {VERSION})",
                file.version
            )));
        }
        if file.mode != mode {
            return Err(CheckpointError::Mode {
                path: self.path.clone(),
                found: file.mode,
                expected: mode,
            });
        }
        let mut owners = BTreeSet::new();
        let mut ips = BTreeSet::new();
        for allocation in &file.allocations {
            if allocation.owner.is_empty() {
                return Err(corrupt(format!("{} has an empty owner", allocation.ip)));
            }
            if !owners.insert(allocation.owner.as_str()) {
                return Err(corrupt(format!(
                    "owner {:?} appears twice",
                    allocation.owner
                )));
            }
            if !ips.insert(allocation.ip) {
                return Err(corrupt(format!("{} is held by two owners", allocation.ip)));
            }
        }
        Ok(file.allocations)
    }

    /// Replaces the file with `allocations`, atomically and durably: when this returns
    /// `Ok`, a crash at any later point restores exactly them.
    pub fn save<'a>(
        &self,
        mode: Mode,
        allocations: impl IntoIterator<Item = &'a Allocation>,
    ) -> Result<(), CheckpointError> {
        let file = FileOut {
            version: VERSION,
            mode,
            allocations: allocations.into_iter().collect(),
        };
        let bytes = serde_json::to_vec(&file).expect("allocations serialize");
        let mut tmp_name = self.path.as_os_str().to_owned();
        tmp_name.push(".tmp");
        let tmp = PathBuf::from(tmp_name);
        let failed = |path: &Path| {
            let path = path.to_owned();
            move |error| CheckpointError::Write { path, error }
        };
        let mut out = File::create(&tmp).map_err(failed(&tmp))?;
        out.write_all(&bytes).map_err(failed(&tmp))?;
        out.sync_all().map_err(failed(&tmp))?;
        drop(out);
        std::fs::rename(&tmp, &self.path).map_err(failed(&self.path))?;
        // The rename itself is durable only once the directory is.
        let dir = match self.path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        File::open(dir)
            .and_then(|dir| dir.sync_all())
            .map_err(failed(dir))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allocation(owner: &str, ip: &str) -> Allocation {
        Allocation {
            owner: owner.to_owned(),
            pod: String::new(),
            ip: ip.parse().unwrap(),
            prefix_len: 24,
            gateway: "10.0.0.1".parse().unwrap(),
            eni: None,
            generation: String::new(),
        }
    }

    #[test]
    fn a_missing_file_is_empty_and_a_saved_one_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let checkpoint = Checkpoint::in_dir(dir.path());
        assert!(checkpoint.load(Mode::ClusterPool).unwrap().is_empty());
        let saved = [
            allocation("router", "10.0.0.1"),
            allocation("c1/eth0", "10.0.0.2"),
        ];
        checkpoint.save(Mode::ClusterPool, &saved).unwrap();
        assert_eq!(checkpoint.load(Mode::ClusterPool).unwrap(), saved);
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [CHECKPOINT_FILE]);
    }

    #[test]
    fn a_damaged_file_is_an_error_naming_it_never_an_empty_start() {
        let dir = tempfile::tempdir().unwrap();
        let checkpoint = Checkpoint::in_dir(dir.path());
        let path = checkpoint.path().display().to_string();
        let two_owners = r#"{"version":1,"mode":"cluster-pool","allocations":[
            {"owner":"a","ip":"10.0.0.2","prefix_len":24,"gateway":"10.0.0.1"},
            {"owner":"b","ip":"10.0.0.2","prefix_len":24,"gateway":"10.0.0.1"}]}"#;
        for (content, why) in [
            ("", "the file is empty"),
            (
                "{\"version\":1,\"mode\":\"cluster-pool\",\"allocations\":[",
                "EOF",
            ),
            (
                r#"{"version":2,"mode":"cluster-pool","allocations":[]}"#,
                "version 2",
            ),
            (two_owners, "10.0.0.2 is held by two owners"),
        ] {
            std::fs::write(checkpoint.path(), content).unwrap();
            let err = checkpoint.load(Mode::ClusterPool).unwrap_err();
            assert!(matches!(err, CheckpointError::Corrupt { .. }), "{err}");
            let message = err.to_string();
            assert!(
                message.contains(&path) && message.contains(why),
                "{message}"
            );
        }
        std::fs::write(
            checkpoint.path(),
            r#"{"version":1,"mode":"eni","allocations":[]}"#,
        )
        .unwrap();
        let err = checkpoint.load(Mode::ClusterPool).unwrap_err().to_string();
        assert!(
            err.contains(&path)
                && err.contains("--ipam eni")
                && err.contains("--ipam cluster-pool"),
            "{err}"
        );
    }

    #[test]
    fn a_failed_write_is_an_error_and_leaves_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let checkpoint = Checkpoint::in_dir(dir.path());
        checkpoint
            .save(Mode::ClusterPool, &[allocation("a", "10.0.0.2")])
            .unwrap();
        // The temporary file's name taken by a directory: creating it fails.
        std::fs::create_dir(dir.path().join("ipam.json.tmp")).unwrap();
        let err = checkpoint
            .save(Mode::ClusterPool, &[allocation("b", "10.0.0.3")])
            .unwrap_err();
        assert!(matches!(err, CheckpointError::Write { .. }), "{err}");
        assert_eq!(
            checkpoint.load(Mode::ClusterPool).unwrap(),
            [allocation("a", "10.0.0.2")]
        );
    }
}
