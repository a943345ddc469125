//! Private directories on the BPF filesystem for tests that pin maps and programs.
//!
//! bpffs is mounted at `/sys/fs/bpf` first if it is not. Each [`BpfRoot`] is a fresh directory `/sys/fs/bpf/mw<pid>-<n>` (the name carries the
//! owner's PID); it is removed with every pin below it on drop. [`BpfRoot::new`] first sweeps
//! directories whose owner process no longer exists.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::{LabError, Result};

/// Where bpffs is mounted on this machine.
pub const BPFFS: &str = "/sys/fs/bpf";
const PREFIX: &str = "mw";

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A directory on bpffs owned by this test; pass it as the agent's `--bpf-root`.
#[derive(Debug)]
pub struct BpfRoot {
    path: PathBuf,
}

impl BpfRoot {
    /// Creates a fresh directory under [`BPFFS`].
    pub fn new() -> Result<Self> {
        ensure_mounted()?;
        sweep_stale();
        let name = format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let path = Path::new(BPFFS).join(name);
        std::fs::create_dir(&path).map_err(LabError::io(format!("creating {}", path.display())))?;
        Ok(Self { path })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for BpfRoot {
    fn drop(&mut self) {
        // Unlinking a pin drops the kernel object once nothing else holds it.
        if let Err(err) = std::fs::remove_dir_all(&self.path) {
            tracing::warn!(path = %self.path.display(), %err, "could not remove a bpffs directory");
        }
    }
}

/// Mounts bpffs at [`BPFFS`] when nothing is mounted there yet, as Cilium's agent does; the
/// mount is left in place (it is shared machine state, like Cilium's).
pub fn ensure_mounted() -> Result<()> {
    if is_bpffs(Path::new(BPFFS)) {
        return Ok(());
    }
    tracing::info!("mounting bpffs at {BPFFS}");
    nix::mount::mount(
        Some("bpf"),
        BPFFS,
        Some("bpf"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|e| LabError::Io {
        context: format!("mounting bpffs at {BPFFS} (needs root)"),
        error: e.into(),
    })?;
    Ok(())
}

fn is_bpffs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::BPF_FS_MAGIC)
}

/// Removes `mw<pid>-*` directories whose owner process is gone.
fn sweep_stale() {
    let Ok(entries) = std::fs::read_dir(BPFFS) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// How many entries the map pinned at `pin` holds, as `bpftool map dump` (an observer
/// independent of the agent's own map code) sees them.
pub fn pinned_len(pin: &Path) -> Result<usize> {
    let dump = crate::process::run(
        std::process::Command::new("bpftool")
            .args(["map", "dump", "pinned"])
            .arg(pin)
            .arg("-j"),
    )?;
    let dump: serde_json::Value =
        serde_json::from_str(&dump).map_err(|err| LabError::CommandFailed {
            command: format!("bpftool map dump pinned {}", pin.display()),
            detail: format!("unreadable JSON: {err}"),
        })?;
    Ok(dump.as_array().map_or(0, Vec::len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[ignore = "needs root and bpffs: `cargo xtask test` runs it"]
    fn a_root_is_created_and_removed_with_its_contents() {
        let root = BpfRoot::new().unwrap();
        let path = root.path().to_owned();
        std::fs::create_dir_all(path.join("tc/globals")).unwrap();
        assert!(path.join("tc/globals").is_dir());
        drop(root);
        assert!(!path.exists());
    }
}
