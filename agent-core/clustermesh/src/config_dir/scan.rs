//! Reading the config directory once, synchronously.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

use super::ConfigDirError;

/// What a scan found under one file name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScannedFile {
    /// The file's bytes.
    Content(Vec<u8>),
    /// The entry exists but could not be read (the I/O error).
    Unreadable(String),
}

/// Lists `dir`: every entry that is — or links to — a regular file, by file name, skipping
/// dot entries. An entry that vanishes or dangles while we look is absent; one that cannot be
/// read is [`ScannedFile::Unreadable`]. Never blocks on a FIFO: only regular files are opened.
pub fn scan_dir(dir: &Path) -> Result<BTreeMap<String, ScannedFile>, ConfigDirError> {
    scan_with_link_targets(dir).map(|(files, _)| files)
}

/// [`scan_dir`], plus the targets of the symlinks that point outside `dir` itself (the watcher
/// watches them so an edit there is noticed, as Cilium's per-file watches do).
pub(super) fn scan_with_link_targets(
    dir: &Path,
) -> Result<(BTreeMap<String, ScannedFile>, BTreeSet<PathBuf>), ConfigDirError> {
    let entries = std::fs::read_dir(dir).map_err(|source| dir_error(dir, source))?;
    let dir_real = std::fs::canonicalize(dir).map_err(|source| dir_error(dir, source))?;
    let mut files = BTreeMap::new();
    let mut targets = BTreeSet::new();
    for entry in entries {
        let entry = entry.map_err(|source| dir_error(dir, source))?;
        // Not a cluster name either way; `to_string_lossy` keeps such a name visible as invalid.
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        // `metadata` follows symlinks, so `..data/<name>` links count as the file they reach.
        let file = match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => match std::fs::read(&path) {
                Ok(bytes) => ScannedFile::Content(bytes),
                Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
                Err(err) => ScannedFile::Unreadable(err.to_string()),
            },
            Ok(_) => continue,
            Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
            Err(err) => ScannedFile::Unreadable(err.to_string()),
        };
        if entry.file_type().is_ok_and(|t| t.is_symlink())
            && let Ok(target) = std::fs::canonicalize(&path)
            && target.parent() != Some(dir_real.as_path())
        {
            targets.insert(target);
        }
        files.insert(name, file);
    }
    Ok((files, targets))
}

fn dir_error(dir: &Path, source: io::Error) -> ConfigDirError {
    let dir = dir.to_path_buf();
    match source.kind() {
        io::ErrorKind::NotFound => ConfigDirError::NotFound { dir },
        io::ErrorKind::NotADirectory => ConfigDirError::NotADirectory { dir },
        _ => ConfigDirError::Read { dir, error: source },
    }
}
