//! Endpoints persisted under `<state-dir>/endpoints/<id>.json`, written atomically so a crash
//! never leaves half a file.

use std::io;
use std::path::{Path, PathBuf};

use super::spec::EndpointSpec;

/// Why the endpoint directory could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A filesystem step failed.
    #[error("{what} {path}: {error}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        error: io::Error,
    },
    /// A file is not a valid endpoint; it is left in place for inspection.
    #[error("{path} is not a valid endpoint: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// The endpoint directory.
#[derive(Debug, Clone)]
pub struct EndpointStore {
    dir: PathBuf,
}

impl EndpointStore {
    /// The store under `state_dir`.
    pub fn new(state_dir: &Path) -> Self {
        Self {
            dir: state_dir.join("endpoints"),
        }
    }

    fn path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Writes `spec` (replacing an earlier version).
    pub fn save(&self, spec: &EndpointSpec) -> Result<(), StoreError> {
        let io = |what, path: &Path| {
            let path = path.to_owned();
            move |source| StoreError::Io {
                what,
                path,
                error: source,
            }
        };
        std::fs::create_dir_all(&self.dir).map_err(io("creating", &self.dir))?;
        let path = self.path(spec.id);
        let tmp = path.with_extension("json.tmp");
        let json = serde_json::to_vec_pretty(spec).expect("an endpoint spec serializes");
        std::fs::write(&tmp, json).map_err(io("writing", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(io("renaming into", &path))
    }

    /// Removes endpoint `id`; a missing file is not an error.
    pub fn remove(&self, id: u64) -> Result<(), StoreError> {
        let path = self.path(id);
        match std::fs::remove_file(&path) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => Err(StoreError::Io {
                what: "removing",
                path,
                error: err,
            }),
            _ => Ok(()),
        }
    }

    /// Every persisted endpoint, sorted by ID, and the files that could not be read (kept on
    /// disk, reported, never deleted).
    pub fn load_all(&self) -> (Vec<EndpointSpec>, Vec<StoreError>) {
        let mut specs = Vec::new();
        let mut errors = Vec::new();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return (specs, errors),
            Err(source) => {
                errors.push(StoreError::Io {
                    what: "reading",
                    path: self.dir.clone(),
                    error: source,
                });
                return (specs, errors);
            }
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|ext| ext != "json") {
                continue;
            }
            match read(&path) {
                Ok(spec) => specs.push(spec),
                Err(err) => errors.push(err),
            }
        }
        specs.sort_by_key(|s| s.id);
        (specs, errors)
    }
}

fn read(path: &Path) -> Result<EndpointSpec, StoreError> {
    let bytes = std::fs::read(path).map_err(|source| StoreError::Io {
        what: "reading",
        path: path.to_owned(),
        error: source,
    })?;
    let invalid = |reason: String| StoreError::Invalid {
        path: path.to_owned(),
        reason,
    };
    let spec: EndpointSpec = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
    spec.validate().map_err(|e| invalid(e.to_string()))?;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::spec::test_spec;

    fn spec(id: u64) -> EndpointSpec {
        test_spec(id)
    }

    #[test]
    fn saved_endpoints_come_back_and_bad_files_are_kept_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let store = EndpointStore::new(dir.path());
        store.save(&spec(2)).unwrap();
        store.save(&spec(1)).unwrap();
        let bad = dir.path().join("endpoints/9.json");
        std::fs::write(&bad, b"{\"id\": 9").unwrap();
        let (specs, errors) = store.load_all();
        assert_eq!(specs, vec![spec(1), spec(2)]);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].to_string().contains("9.json"), "{}", errors[0]);
        assert!(bad.exists(), "a bad file is never deleted");
        store.remove(1).unwrap();
        store.remove(1).unwrap();
        assert_eq!(store.load_all().0, vec![spec(2)]);
    }
}
