//! The userspace fallback: when the kernel has no WireGuard, the agent runs a userspace
//! implementation (wireguard-go) for its device, like Cilium's `--wireguard-userspace-fallback`.
//!
//! The process is started in its own process group and is not stopped with the agent: the
//! device (and so encrypted traffic) outlives an agent restart, and the next agent finds it
//! answering on its socket and reuses it.

use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::uapi::{UapiBackend, socket_path};

/// How long a started implementation may take to answer on its socket.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the userspace implementation could not be had.
#[derive(Debug, thiserror::Error)]
pub enum UserspaceError {
    /// Spawning failed.
    #[error("starting {program} for {device}: {error}")]
    Spawn {
        /// The program.
        program: String,
        /// The device.
        device: String,
        /// The error.
        error: std::io::Error,
    },
    /// It exited or did not answer in time.
    #[error("{program} for {device} did not come up: {detail}")]
    NotUp {
        /// The program.
        program: String,
        /// The device.
        device: String,
        /// What happened.
        detail: String,
    },
}

/// How [`Userspace::ensure`] got a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    /// One already answered (e.g. started by the previous agent).
    Reused,
    /// This agent started one, with this PID.
    Started(u32),
}

/// Supervises the userspace implementation of one device.
#[derive(Debug)]
pub struct Userspace {
    program: PathBuf,
    device: String,
    child: Option<Child>,
}

impl Userspace {
    /// `program` (default `wireguard-go` from `PATH`) for `device`.
    pub fn new(program: Option<PathBuf>, device: &str) -> Self {
        Self {
            program: program.unwrap_or_else(|| PathBuf::from("wireguard-go")),
            device: device.to_owned(),
            child: None,
        }
    }

    /// The PID of the process this agent started, while it runs.
    pub fn pid(&mut self) -> Option<u32> {
        self.reap();
        self.child.as_ref().map(Child::id)
    }

    fn reap(&mut self) {
        if let Some(child) = &mut self.child
            && !matches!(child.try_wait(), Ok(None))
        {
            self.child = None;
        }
    }

    /// Makes sure the device answers: reuses a running implementation, else starts one and
    /// waits (bounded by [`START_TIMEOUT`]) until its socket answers.
    pub fn ensure(&mut self) -> Result<Ensured, UserspaceError> {
        self.reap();
        let probe = UapiBackend::new(&self.device);
        if probe.is_up() {
            return Ok(Ensured::Reused);
        }
        let program = self.program.display().to_string();
        let not_up = |detail: String| UserspaceError::NotUp {
            program: program.clone(),
            device: self.device.clone(),
            detail,
        };
        // A socket left by a crashed process answers nobody; remove it so the new one binds.
        let socket = socket_path(&self.device);
        if socket.exists() {
            let _ = std::fs::remove_file(&socket);
        }
        let mut command = Command::new(&self.program);
        command
            .args(["-f", &self.device])
            .env("WG_PROCESS_FOREGROUND", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // Own process group: a Ctrl-C for the agent must not take the device down.
            .process_group(0);
        let mut child = command.spawn().map_err(|source| UserspaceError::Spawn {
            program: program.clone(),
            device: self.device.clone(),
            error: source,
        })?;
        let pid = child.id();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if probe.is_up() {
                self.child = Some(child);
                tracing::info!(device = %self.device, pid, "started the userspace WireGuard device");
                return Ok(Ensured::Started(pid));
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(not_up(format!("exited with {status}")));
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(not_up(format!("no answer within {START_TIMEOUT:?}")));
            }
            // Polling a local socket: the condition waited for has no event to block on.
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
