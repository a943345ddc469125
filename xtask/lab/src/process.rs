//! Child processes the lab started, stopped by PID when their handle drops.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::{LabError, Result, wait};

/// A process the lab started. Dropping it sends SIGTERM, waits up to five seconds, then
/// SIGKILLs — only this PID, never by name.
///
/// The child also gets `PR_SET_PDEATHSIG(SIGKILL)`, so it dies with the thread that started it
/// if that thread's process is killed outright (a test timeout). Because the signal follows the
/// starting *thread*, start lab processes from a long-lived thread (a test's own thread, the
/// demo's main thread), not from a short-lived blocking-pool thread.
#[derive(Debug)]
pub struct LabProcess {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl LabProcess {
    /// Spawns `command` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut command: Command, log: &Path) -> Result<Self> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .map_err(LabError::io(format!("opening log {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(LabError::io("duplicating the log handle"))?;
        command
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err));
        set_parent_death_signal(&mut command);
        let child = command
            .spawn()
            .map_err(LabError::io(format!("starting {name}")))?;
        tracing::debug!(name, pid = child.id(), "lab process started");
        Ok(Self {
            name: name.to_owned(),
            child: Some(child),
            log: log.to_owned(),
        })
    }

    /// Spawns `command` as [`Self::spawn`] does, logging to `<log_dir>/<log_name>` (this
    /// start's own file; the directory is made if missing), then waits (at most `timeout`)
    /// until its log holds `running`; fails with the log's tail if it exits or times out
    /// first.
    pub fn spawn_running(
        name: &str,
        command: Command,
        (log_dir, log_name): (&Path, &str),
        running: &str,
        timeout: Duration,
    ) -> Result<Self> {
        std::fs::create_dir_all(log_dir)
            .map_err(LabError::io(format!("creating {}", log_dir.display())))?;
        let log = &log_dir.join(log_name);
        let mut process = Self::spawn(name, command, log)?;
        let up = wait::Wait::new(format!("{name} to run"))
            .timeout(timeout)
            .until(
                || {
                    process.check_running()?;
                    Ok(std::fs::read_to_string(log)
                        .unwrap_or_default()
                        .contains(running))
                },
                |up: &Result<bool>| !matches!(up, Ok(false)),
            );
        match up {
            Ok(Ok(_)) => Ok(process),
            Ok(Err(exited)) => Err(exited),
            Err(timeout) => Err(LabError::CommandFailed {
                command: name.to_owned(),
                detail: format!("{timeout}; log:\n{}", process.log_tail()),
            }),
        }
    }

    /// The process ID.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The log file that receives the process's output.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The last lines of the log, for error messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// How the process exited; `None` while it runs.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Fails with the log tail if the process has exited.
    pub fn check_running(&mut self) -> Result<()> {
        if self.is_running() {
            Ok(())
        } else {
            Err(LabError::CommandFailed {
                command: self.name.clone(),
                detail: format!("exited early; log:\n{}", self.log_tail()),
            })
        }
    }

    /// Sends `signal` to the process (by PID).
    pub fn signal(&self, signal: Signal) -> Result<()> {
        let pid = Pid::from_raw(i32::try_from(self.pid()).unwrap_or(0));
        kill(pid, signal).map_err(|e| LabError::Io {
            context: format!("signalling {} ({pid})", self.name),
            error: e.into(),
        })
    }

    /// Stops the process: SIGTERM, up to `grace` to exit, then SIGKILL. Idempotent.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if matches!(child.try_wait(), Ok(None)) {
            let pid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(0));
            let _ = kill(pid, Signal::SIGTERM);
            let exited = wait::until("process exit", grace, Duration::from_millis(10), || {
                child.try_wait().ok().flatten()
            });
            if exited.is_err() {
                let _ = child.kill();
            }
        }
        let _ = child.wait();
        tracing::debug!(name = %self.name, "lab process stopped");
    }

    /// Kills the process at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for LabProcess {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

#[allow(unsafe_code)]
fn set_parent_death_signal(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs between fork and exec and only calls prctl(2), which is
    // async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Runs a short command to completion; fails with its stderr when it exits non-zero.
pub fn run(command: &mut Command) -> Result<String> {
    let description = format!("{command:?}");
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(LabError::io(format!("running {description}")))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(LabError::CommandFailed {
            command: description,
            detail: format!(
                "{}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        })
    }
}

/// Gives `command` the environment changes and working directory of `inner`, when a wrapper
/// (a namespace, a cgroup) runs `inner`'s program.
pub fn carry_env_and_dir(inner: &Command, command: &mut Command) {
    for (key, value) in inner.get_envs() {
        match value {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
    if let Some(dir) = inner.get_current_dir() {
        command.current_dir(dir);
    }
}
