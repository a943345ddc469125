//! Launching a real `meshwork-apiserver kvstoremesh` process: its flags, its ports on
//! 127.0.0.1, and a start that waits until it says it runs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::Result;
use crate::process::LabProcess;
use crate::wait::free_port;

/// The line kvstoremesh logs once it serves.
pub const RUNNING: &str = "meshwork-apiserver kvstoremesh running";
/// How long a start may take.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How one kvstoremesh runs; the ports are chosen once, so a restart keeps its addresses.
#[derive(Debug, Clone)]
pub struct KvstoremeshOptions {
    /// The `meshwork-apiserver` binary.
    pub binary: PathBuf,
    /// `--cluster-name`.
    pub cluster: String,
    /// `--cluster-id`.
    pub cluster_id: u32,
    /// `--kvstore-endpoints`: the local etcd the cache is written to.
    pub etcd: String,
    /// `--clustermesh-config`: one file per remote.
    pub config_dir: PathBuf,
    /// `--health-serve-addr`'s port.
    pub health_port: u16,
    /// `--api-serve-addr`'s port.
    pub api_port: u16,
    /// `--prometheus-serve-addr`'s port; none serves no metrics.
    pub metrics_port: Option<u16>,
    /// More flags, as given.
    pub flags: Vec<String>,
    /// Where the logs go (`kvstoremesh-<n>.log`, one per start).
    pub log_dir: PathBuf,
}

impl KvstoremeshOptions {
    /// kvstoremesh of `cluster`/`cluster_id` caching the remotes of `config_dir` in the etcd
    /// at `etcd`, on free ports, without a metrics listener (see [`Self::with_metrics`]).
    pub fn new(
        binary: &Path,
        (cluster, cluster_id): (&str, u32),
        etcd: &str,
        config_dir: &Path,
        log_dir: &Path,
    ) -> Result<Self> {
        Ok(Self {
            binary: binary.to_owned(),
            cluster: cluster.to_owned(),
            cluster_id,
            etcd: etcd.to_owned(),
            config_dir: config_dir.to_owned(),
            health_port: free_port()?,
            api_port: free_port()?,
            metrics_port: None,
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

    /// Also serves `/metrics`, on a free port ([`Self::metrics_port`]).
    pub fn with_metrics(mut self) -> Result<Self> {
        self.metrics_port = Some(free_port()?);
        Ok(self)
    }

    /// The status API's address (`meshctl --kvstoremesh`).
    pub fn api_addr(&self) -> String {
        format!("127.0.0.1:{}", self.api_port)
    }

    fn command(&self) -> Command {
        let mut command = Command::new(&self.binary);
        command
            .arg("kvstoremesh")
            .args(["--cluster-name", &self.cluster])
            .args(["--cluster-id", &self.cluster_id.to_string()])
            .arg("--clustermesh-config")
            .arg(&self.config_dir)
            .args(["--kvstore-endpoints", &self.etcd])
            .args([
                "--health-serve-addr",
                &format!("127.0.0.1:{}", self.health_port),
            ])
            .args(["--api-serve-addr", &self.api_addr()])
            .args([
                "--prometheus-serve-addr",
                &self
                    .metrics_port
                    .map(|port| format!("127.0.0.1:{port}"))
                    .unwrap_or_default(),
            ])
            .args(&self.flags)
            .env("NO_COLOR", "1");
        command
    }
}

/// A running kvstoremesh, stopped (SIGTERM, then SIGKILL) when dropped.
#[derive(Debug)]
pub struct KvstoremeshProcess {
    process: LabProcess,
}

impl KvstoremeshProcess {
    /// Starts it and waits (at most [`START_TIMEOUT`]) until it logs [`RUNNING`]; `start` is
    /// this start's number, naming its log.
    pub fn start(options: &KvstoremeshOptions, start: u32) -> Result<Self> {
        let log = format!("kvstoremesh-{start}.log");
        let process = LabProcess::spawn_running(
            "kvstoremesh",
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
}
