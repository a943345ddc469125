//! A ramfs mount for many etcd data directories. etcd preallocates a 64 MB WAL segment with
//! `fallocate`; ramfs has no `fallocate`, so etcd falls back to `ftruncate` and the segment
//! stays sparse: 250 etcds of 1,200 keys each held 177 MiB in all (bench mesh-scale), not
//! 64 MB of RAM each (tmpfs) or 120 MB of disk each (machine-notes, etcd). ramfs has no size
//! limit: only for small data sets.

use std::path::Path;

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use tempfile::TempDir;

use crate::{LabError, Result};

/// A ramfs mounted on a fresh temp dir; unmounted (lazily) and removed when dropped.
#[derive(Debug)]
pub struct Ramfs {
    dir: TempDir,
}

impl Ramfs {
    /// Mounts a new ramfs.
    pub fn mount() -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("meshwork-ramfs-")
            .tempdir()
            .map_err(LabError::io("creating the ramfs mount point"))?;
        mount(
            Some("ramfs"),
            dir.path(),
            Some("ramfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=0700"),
        )
        .map_err(|e| LabError::Io {
            context: format!("mounting ramfs on {}", dir.path().display()),
            error: e.into(),
        })?;
        Ok(Self { dir })
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Bytes held in the mount (the allocated size of every file, sparse WALs included).
    pub fn used_bytes(&self) -> u64 {
        fn walk(dir: &Path) -> u64 {
            use std::os::unix::fs::MetadataExt as _;
            let Ok(entries) = std::fs::read_dir(dir) else {
                return 0;
            };
            entries
                .flatten()
                .map(|entry| match entry.metadata() {
                    Ok(meta) if meta.is_dir() => walk(&entry.path()),
                    Ok(meta) => meta.blocks() * 512,
                    Err(_) => 0,
                })
                .sum()
        }
        walk(self.path())
    }
}

impl Drop for Ramfs {
    fn drop(&mut self) {
        // Lazily: a process still holding a file there lets go of it when it exits.
        if let Err(err) = umount2(self.dir.path(), MntFlags::MNT_DETACH) {
            tracing::warn!(%err, path = %self.dir.path().display(), "unmounting the lab ramfs");
        }
    }
}
