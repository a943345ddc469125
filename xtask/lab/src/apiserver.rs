//! Launching a real `meshwork-apiserver` process for scenarios: its flags, its ports on
//! 127.0.0.1, and a start that waits until it says it runs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::Result;
use crate::process::LabProcess;
use crate::wait::free_port;

/// The line the apiserver logs once it serves.
pub const RUNNING: &str = "meshwork-apiserver running";
/// How long a start may take.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How one apiserver runs; the ports are chosen once, so a restart keeps its addresses.
#[derive(Debug, Clone)]
pub struct ApiserverOptions {
    /// The `meshwork-apiserver` binary.
    pub binary: PathBuf,
    /// `--cluster-name`.
    pub cluster: String,
    /// `--cluster-id`.
    pub cluster_id: u32,
    /// `--kvstore-endpoints`.
    pub etcd: String,
    /// `--grpc-serve-addr`'s port.
    pub grpc_port: u16,
    /// `--health-serve-addr`'s port.
    pub health_port: u16,
    /// `--prometheus-serve-addr`'s port.
    pub metrics_port: u16,
    /// More flags, as given.
    pub flags: Vec<String>,
    /// Where the logs go (`apiserver-<n>.log`, one per start).
    pub log_dir: PathBuf,
}

impl ApiserverOptions {
    /// An apiserver of `cluster`/`cluster_id` writing to the etcd at `etcd`, on free ports.
    pub fn new(
        binary: &Path,
        cluster: &str,
        cluster_id: u32,
        etcd: &str,
        log_dir: &Path,
    ) -> Result<Self> {
        Ok(Self {
            binary: binary.to_owned(),
            cluster: cluster.to_owned(),
            cluster_id,
            etcd: etcd.to_owned(),
            grpc_port: free_port()?,
            health_port: free_port()?,
            metrics_port: free_port()?,
            flags: Vec::new(),
            log_dir: log_dir.to_owned(),
        })
    }

    /// Adds flags.
    #[must_use]
    pub fn flags<I, S>(mut self, flags: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.flags.extend(flags.into_iter().map(Into::into));
        self
    }

    /// The gRPC address agents publish to.
    pub fn grpc_addr(&self) -> String {
        format!("127.0.0.1:{}", self.grpc_port)
    }

    fn command(&self) -> Command {
        let mut command = Command::new(&self.binary);
        command
            .args(["--cluster-name", &self.cluster])
            .args(["--cluster-id", &self.cluster_id.to_string()])
            .args(["--kvstore-endpoints", &self.etcd])
            .args(["--grpc-serve-addr", &self.grpc_addr()])
            .args([
                "--health-serve-addr",
                &format!("127.0.0.1:{}", self.health_port),
            ])
            .args([
                "--prometheus-serve-addr",
                &format!("127.0.0.1:{}", self.metrics_port),
            ])
            .args(&self.flags)
            .env("NO_COLOR", "1");
        command
    }
}

/// A running apiserver, stopped (SIGTERM, then SIGKILL) when dropped.
#[derive(Debug)]
pub struct ApiserverProcess {
    process: LabProcess,
}

impl ApiserverProcess {
    /// Starts it and waits (at most [`START_TIMEOUT`]) until it logs [`RUNNING`]; `start` is
    /// this start's number, naming its log.
    pub fn start(options: &ApiserverOptions, start: u32) -> Result<Self> {
        let log = format!("apiserver-{start}.log");
        let process = LabProcess::spawn_running(
            "meshwork-apiserver",
            options.command(),
            (&options.log_dir, &log),
            RUNNING,
            START_TIMEOUT,
        )?;
        Ok(Self { process })
    }

    /// The process.
    pub fn process(&mut self) -> &mut LabProcess {
        &mut self.process
    }

    /// The last lines of the log.
    pub fn log_tail(&self) -> String {
        self.process.log_tail()
    }

    /// Stops it: SIGTERM, up to `grace` to exit, then SIGKILL.
    pub fn stop(&mut self, grace: Duration) {
        self.process.stop(grace);
    }
}
