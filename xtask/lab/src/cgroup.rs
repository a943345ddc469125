//! A child cgroup2 directory of the lab, for one node's client processes: where that node's
//! socket-LB programs attach. Programs attached at the cgroup2 root would run for every process
//! on the machine (machine-notes, cgroup2), so tests attach only here.
//!
//! The directory is `<cgroup2 mount>/meshwork-lab-<pid>-<n>-<name>`; a process joins it before
//! it execs ([`ChildCgroup::wrap`]). Dropping it kills what is still inside (processes the
//! test started there) and removes the directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::wait::Wait;
use crate::{LabError, Result};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A cgroup2 directory the lab made, below the machine's cgroup2 mount.
#[derive(Debug)]
pub struct ChildCgroup {
    path: PathBuf,
}

/// Where cgroup2 is mounted (`/sys/fs/cgroup/unified` on this hybrid host), from
/// `/proc/self/mountinfo`.
pub fn cgroup2_mount() -> Result<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(LabError::io("reading /proc/self/mountinfo"))?;
    mountinfo
        .lines()
        .find_map(|line| {
            // `… mount-point options … - fstype source super-options`
            let (fields, tail) = line.split_once(" - ")?;
            if tail.split(' ').next()? != "cgroup2" {
                return None;
            }
            Some(PathBuf::from(fields.split(' ').nth(4)?))
        })
        .ok_or_else(|| LabError::CommandFailed {
            command: "finding the cgroup2 mount".to_owned(),
            detail: "no cgroup2 file system is mounted".to_owned(),
        })
}

impl ChildCgroup {
    /// Makes a new child cgroup named after `name`.
    pub fn create(name: &str) -> Result<Self> {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = cgroup2_mount()?.join(format!("meshwork-lab-{}-{n}-{name}", std::process::id()));
        std::fs::create_dir(&path).map_err(LabError::io(format!(
            "creating the cgroup {}",
            path.display()
        )))?;
        Ok(Self { path })
    }

    /// The directory (what socket-LB attaches to).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `inner` rewrapped so that its process joins this cgroup before it execs (a shell writes
    /// its own PID to `cgroup.procs`, then execs `inner`): nothing it does escapes the cgroup.
    pub fn wrap(&self, inner: &Command) -> Command {
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg("echo $$ > \"$0/cgroup.procs\" && exec \"$@\"")
            .arg(&self.path)
            .arg(inner.get_program())
            .args(inner.get_args());
        crate::process::carry_env_and_dir(inner, &mut command);
        command
    }

    /// The PIDs inside.
    pub fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.path.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|line| line.trim().parse().ok())
            .collect()
    }
}

impl Drop for ChildCgroup {
    fn drop(&mut self) {
        // Only processes a test started here: nothing else joins a lab cgroup.
        for pid in self.pids() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let removed = Wait::new("the lab cgroup to be removed")
            .timeout(Duration::from_secs(5))
            .until(
                || std::fs::remove_dir(&self.path).is_ok() || !self.path.exists(),
                |gone| *gone,
            );
        if let Err(err) = removed {
            tracing::warn!(%err, path = %self.path.display(), "removing the lab cgroup");
        }
    }
}
