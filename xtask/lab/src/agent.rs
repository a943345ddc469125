//! A real `meshwork-agent` process, as tests, benchmarks and the demo run it: the one
//! launcher, so each of them passes the same flags the same way and waits for the same sign
//! of life — the agent saying it runs, which it does once every listener is bound and served.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::process::LabProcess;
use crate::wait::Wait;
use crate::{LabError, Result};

/// How long an agent may take to start.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How often [`AgentProcess::wait_running`] looks at the log.
const START_POLL: Duration = Duration::from_millis(2);

/// What the agent logs once it runs.
pub const RUNNING: &str = "meshwork-agent running";

/// Where the agent logs [`RUNNING`] from (its log filter always lets that through).
const RUNNING_TARGET: &str = "meshwork_agent::builder";

/// Writes `<dir>/<cluster>`: the clustermesh config file of a remote cluster whose etcd is
/// at `endpoint`, as the agent reads it (creating `dir` if needed).
pub fn write_cluster_config(dir: &Path, cluster: &str, endpoint: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(LabError::io(format!("creating {}", dir.display())))?;
    let file = dir.join(cluster);
    std::fs::write(&file, format!("endpoints:\n- {endpoint}\n"))
        .map_err(LabError::io(format!("writing {}", file.display())))?;
    Ok(file)
}

/// How one agent process runs.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// The `meshwork-agent` binary.
    pub binary: PathBuf,
    /// `--cluster-name`.
    pub cluster: String,
    /// `--cluster-id`.
    pub cluster_id: u32,
    /// `--state-dir`; the API socket (`<state-dir>/agent.sock`) and the log live there too.
    pub state_dir: PathBuf,
    /// `--clustermesh-config`, if any.
    pub clustermesh_config: Option<PathBuf>,
    /// `--bpf-root`; `None` runs without the BPF datapath (`--enable-bpf-datapath=false`).
    pub bpf_root: Option<PathBuf>,
    /// The metrics port on 127.0.0.1; `None` serves no metrics.
    pub metrics_port: Option<u16>,
    /// More flags, as given.
    pub flags: Vec<OsString>,
    /// More environment.
    pub env: Vec<(String, String)>,
    /// The log file's name in the state dir.
    pub log_name: String,
}

impl AgentOptions {
    /// An agent of `cluster`/`cluster_id` from `binary` keeping its state in `state_dir`,
    /// without datapath, metrics or remote clusters until told otherwise.
    pub fn new(binary: &Path, cluster: &str, cluster_id: u32, state_dir: &Path) -> Self {
        Self {
            binary: binary.to_owned(),
            cluster: cluster.to_owned(),
            cluster_id,
            state_dir: state_dir.to_owned(),
            clustermesh_config: None,
            bpf_root: None,
            metrics_port: None,
            flags: Vec::new(),
            env: Vec::new(),
            log_name: "agent.log".to_owned(),
        }
    }

    /// Watches the clustermesh config directory `dir`.
    pub fn clustermesh_config(mut self, dir: &Path) -> Self {
        self.clustermesh_config = Some(dir.to_owned());
        self
    }

    /// Runs the BPF datapath with maps pinned under `root`.
    pub fn bpf_root(mut self, root: &Path) -> Self {
        self.bpf_root = Some(root.to_owned());
        self
    }

    /// Attaches socket-LB (`--bpf-lb-sock`) to `cgroup`, a child cgroup of the lab, never the
    /// machine's cgroup2 root.
    pub fn socket_lb(self, cgroup: &crate::cgroup::ChildCgroup) -> Self {
        let root = cgroup.path().as_os_str().to_owned();
        self.flags([
            OsString::from("--bpf-lb-sock=true"),
            OsString::from("--cgroup-root"),
            root,
        ])
    }

    /// Serves metrics on 127.0.0.1:`port`.
    pub fn metrics_port(mut self, port: u16) -> Self {
        self.metrics_port = Some(port);
        self
    }

    /// Adds flags.
    pub fn flags<I, S>(mut self, flags: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.flags.extend(flags.into_iter().map(Into::into));
        self
    }

    /// Sets an environment variable.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Names the log file (in the state dir): a restarted agent keeps its first run's log.
    pub fn log_name(mut self, name: &str) -> Self {
        self.log_name = name.to_owned();
        self
    }

    /// The API socket.
    pub fn socket(&self) -> PathBuf {
        self.state_dir.join("agent.sock")
    }

    /// The command line.
    pub fn command(&self) -> Command {
        let mut command = Command::new(&self.binary);
        command
            .args(["--cluster-name", &self.cluster])
            .args(["--cluster-id", &self.cluster_id.to_string()])
            .arg("--state-dir")
            .arg(&self.state_dir);
        if let Some(dir) = &self.clustermesh_config {
            command.arg("--clustermesh-config").arg(dir);
        }
        match &self.bpf_root {
            Some(root) => command.arg("--bpf-root").arg(root),
            None => command.arg("--enable-bpf-datapath=false"),
        };
        let metrics = self
            .metrics_port
            .map(|port| format!("127.0.0.1:{port}"))
            .unwrap_or_default();
        command
            .args(["--prometheus-serve-addr", &metrics])
            .args(&self.flags)
            // A plain-text log file.
            .env("NO_COLOR", "1");
        for (key, value) in &self.env {
            command.env(key, value);
        }
        // Whatever the filter, the line the launcher waits for is written.
        let filter = self
            .env
            .iter()
            .rev()
            .find(|(key, _)| key == "RUST_LOG")
            .map(|(_, value)| value.clone())
            .or_else(|| std::env::var("RUST_LOG").ok())
            .unwrap_or_else(|| "info".to_owned());
        command.env("RUST_LOG", format!("{filter},{RUNNING_TARGET}=info"));
        command
    }
}

/// The agent's `--ipam eni` flags: what an ENI test (the real operator over moto) sets.
#[derive(Debug, Clone, Default)]
pub struct EniIpam {
    /// `--operator-addr`: `http://HOST:PORT`, or `https://…` with [`EniIpam::tls`].
    pub operator_addr: String,
    /// `--eni-instance-id`.
    pub instance_id: String,
    /// `--node-name`: the CiliumNode registered (and the client certificate's CN with
    /// mTLS); `None` leaves the agent's default (the host name).
    pub node_name: Option<String>,
    /// `--eni-instance-type`.
    pub instance_type: Option<String>,
    /// `--eni-subnet-tags`.
    pub subnet_tags: Vec<(String, String)>,
    /// `--eni-security-group-tags`.
    pub security_group_tags: Vec<(String, String)>,
    /// `--eni-first-interface-index`.
    pub first_interface_index: Option<u32>,
    /// `--ipam-pre-allocate`.
    pub pre_allocate: Option<u32>,
    /// `--ipam-min-allocate`.
    pub min_allocate: Option<u32>,
    /// `--ipam-max-allocate`.
    pub max_allocate: Option<u32>,
    /// `--ipam-max-above-watermark`.
    pub max_above_watermark: Option<u32>,
    /// `--operator-tls-ca`, and the client pair `--operator-tls-cert`/`--operator-tls-key`.
    pub tls: Option<OperatorTls>,
}

/// The agent's TLS to the operator.
#[derive(Debug, Clone)]
pub struct OperatorTls {
    /// `--operator-tls-ca`.
    pub ca: PathBuf,
    /// `--operator-tls-cert` and `--operator-tls-key`, for mTLS.
    pub client: Option<(PathBuf, PathBuf)>,
}

impl EniIpam {
    /// ENI IPAM for `instance_id` from the operator at `operator_addr`, everything else the
    /// operator's defaults.
    pub fn new(operator_addr: &str, instance_id: &str) -> Self {
        Self {
            operator_addr: operator_addr.to_owned(),
            instance_id: instance_id.to_owned(),
            ..Self::default()
        }
    }

    /// The flags.
    pub fn flags(&self) -> Vec<OsString> {
        let mut flags: Vec<OsString> = vec![
            "--ipam".into(),
            "eni".into(),
            "--operator-addr".into(),
            self.operator_addr.clone().into(),
            "--eni-instance-id".into(),
            self.instance_id.clone().into(),
        ];
        let mut flag = |name: &str, value: OsString| {
            flags.push(format!("--{name}").into());
            flags.push(value);
        };
        let tags = |tags: &[(String, String)]| -> OsString {
            tags.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
                .into()
        };
        if let Some(node) = &self.node_name {
            flag("node-name", node.into());
        }
        if let Some(instance_type) = &self.instance_type {
            flag("eni-instance-type", instance_type.into());
        }
        if !self.subnet_tags.is_empty() {
            flag("eni-subnet-tags", tags(&self.subnet_tags));
        }
        if !self.security_group_tags.is_empty() {
            flag("eni-security-group-tags", tags(&self.security_group_tags));
        }
        for (name, value) in [
            ("eni-first-interface-index", self.first_interface_index),
            ("ipam-pre-allocate", self.pre_allocate),
            ("ipam-min-allocate", self.min_allocate),
            ("ipam-max-allocate", self.max_allocate),
            ("ipam-max-above-watermark", self.max_above_watermark),
        ] {
            if let Some(value) = value {
                flag(name, value.to_string().into());
            }
        }
        if let Some(tls) = &self.tls {
            flag("operator-tls-ca", tls.ca.clone().into());
            if let Some((cert, key)) = &tls.client {
                flag("operator-tls-cert", cert.clone().into());
                flag("operator-tls-key", key.clone().into());
            }
        }
        flags
    }
}

impl AgentOptions {
    /// Hands out pod IPs from `cidr` (`--ipam cluster-pool --ipv4-alloc-cidr CIDR`); the
    /// agent serves `meshwork.agent.v1.Ipam` on its socket.
    pub fn ipam_cluster_pool(self, cidr: &str) -> Self {
        self.flags(["--ipam", "cluster-pool", "--ipv4-alloc-cidr", cidr])
    }

    /// Hands out pod IPs from the operator's ENIs (`--ipam eni` and `eni`'s flags). The
    /// agent says it runs at once; its health turns SERVING once its pool is ready.
    pub fn ipam_eni(self, eni: &EniIpam) -> Self {
        self.flags(eni.flags())
    }
}

/// A running agent process, stopped (SIGTERM, then SIGKILL) when dropped.
#[derive(Debug)]
pub struct AgentProcess {
    process: LabProcess,
    socket: PathBuf,
    /// Where this run's part of the (appended) log starts.
    log_offset: u64,
}

impl AgentProcess {
    /// Starts the agent and waits until it says it runs ([`RUNNING`]); fails with the log's
    /// tail if it exits first or takes longer than [`START_TIMEOUT`].
    pub fn start(options: &AgentOptions) -> Result<Self> {
        let mut agent = Self::spawn(options)?;
        agent.wait_running()?;
        Ok(agent)
    }

    /// Starts the agent without waiting: many agents then start at once, each waited for
    /// with [`Self::wait_running`]. Call it from the thread that outlives the agent (the
    /// process dies with the thread that spawned it).
    pub fn spawn(options: &AgentOptions) -> Result<Self> {
        std::fs::create_dir_all(&options.state_dir).map_err(LabError::io(format!(
            "creating {}",
            options.state_dir.display()
        )))?;
        let log = options.state_dir.join(&options.log_name);
        // The log is appended to: only what this run writes counts.
        let log_offset = std::fs::metadata(&log).map_or(0, |m| m.len());
        Ok(Self {
            process: LabProcess::spawn("meshwork-agent", options.command(), &log)?,
            socket: options.socket(),
            log_offset,
        })
    }

    /// Waits until the agent says it runs ([`RUNNING`]); fails with the log's tail if it
    /// exits first or takes longer than [`START_TIMEOUT`].
    pub fn wait_running(&mut self) -> Result<()> {
        let log = self.process.log().to_owned();
        let offset = usize::try_from(self.log_offset).unwrap_or(0);
        // Benchmarks time an agent from its start, and it runs about 5 ms after it: looking
        // every 20 ms (the default) added up to 20 ms to what they measure.
        let up = Wait::new("the agent to run")
            .timeout(START_TIMEOUT)
            .every(START_POLL)
            .until(
                || {
                    self.process.check_running()?;
                    let log = std::fs::read(&log).unwrap_or_default();
                    let ours = log.get(offset..).unwrap_or_default();
                    Ok(String::from_utf8_lossy(ours).contains(RUNNING))
                },
                |up: &Result<bool>| !matches!(up, Ok(false)),
            );
        match up {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(exited)) => Err(exited),
            Err(timeout) => Err(LabError::CommandFailed {
                command: "meshwork-agent".to_owned(),
                detail: format!("{timeout}; log:\n{}", self.log_tail()),
            }),
        }
    }

    /// The API socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The process.
    pub fn process(&mut self) -> &mut LabProcess {
        &mut self.process
    }

    /// The process ID.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The log file.
    pub fn log(&self) -> &Path {
        self.process.log()
    }

    /// The last lines of the log.
    pub fn log_tail(&self) -> String {
        self.process.log_tail()
    }

    /// Stops the agent: SIGTERM, up to `grace` to exit, then SIGKILL.
    pub fn stop(&mut self, grace: Duration) {
        self.process.stop(grace);
    }
}
