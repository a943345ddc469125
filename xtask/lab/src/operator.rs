//! Launching a real `meshwork-operator` process in kvstore mode: the CiliumNodes in an etcd,
//! EC2 at a (patched moto) endpoint, its gRPC and metrics ports on 127.0.0.1, and a start that
//! waits until it serves `meshwork.ipam.v1.NodeIpam`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::Result;
use crate::process::LabProcess;
use crate::wait::free_port;

/// The line the operator logs once its gRPC listener is bound.
pub const SERVING: &str = "serving meshwork.ipam.v1.NodeIpam";
/// How long a start may take.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How one operator runs; the ports are chosen once, so a restart keeps its addresses.
#[derive(Debug, Clone)]
pub struct OperatorOptions {
    /// The `meshwork-operator` binary.
    pub binary: PathBuf,
    /// `--ec2-endpoint`.
    pub ec2: String,
    /// `--kvstore-endpoints`: where the CiliumNodes live.
    pub etcd: String,
    /// `--grpc-serve-addr`'s port.
    pub grpc_port: u16,
    /// `--prometheus-serve-addr`'s port.
    pub metrics_port: u16,
    /// More flags, as given.
    pub flags: Vec<String>,
    /// Where the logs go (`operator-<n>.log`, one per start).
    pub log_dir: PathBuf,
}

impl OperatorOptions {
    /// An operator of the lab's cluster driving EC2 at `ec2` and the CiliumNodes in the etcd
    /// at `etcd`, on free ports.
    pub fn new(binary: &Path, ec2: &str, etcd: &str, log_dir: &Path) -> Result<Self> {
        Ok(Self {
            binary: binary.to_owned(),
            ec2: ec2.to_owned(),
            etcd: etcd.to_owned(),
            grpc_port: free_port()?,
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

    /// The gRPC address agents take as `--operator-addr`.
    pub fn grpc_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    fn command(&self) -> Command {
        let mut command = Command::new(&self.binary);
        command
            .args(["--cluster-name", "lab", "--aws-region", "us-east-1"])
            .args(["--ec2-endpoint", &self.ec2])
            .args(["--kvstore-endpoints", &self.etcd])
            .args([
                "--grpc-serve-addr",
                &format!("127.0.0.1:{}", self.grpc_port),
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

/// A running operator, stopped (SIGTERM, then SIGKILL) when dropped.
#[derive(Debug)]
pub struct OperatorProcess {
    process: LabProcess,
}

impl OperatorProcess {
    /// Starts it and waits (at most [`START_TIMEOUT`]) until it logs [`SERVING`]; `start` is
    /// this start's number, naming its log.
    pub fn start(options: &OperatorOptions, start: u32) -> Result<Self> {
        let log = format!("operator-{start}.log");
        let process = LabProcess::spawn_running(
            "meshwork-operator",
            options.command(),
            (&options.log_dir, &log),
            SERVING,
            START_TIMEOUT,
        )?;
        Ok(Self { process })
    }

    /// The process (to kill it mid-allocation, say).
    pub fn process(&mut self) -> &mut LabProcess {
        &mut self.process
    }

    /// The last lines of the log.
    pub fn log_tail(&self) -> String {
        self.process.log_tail()
    }
}
