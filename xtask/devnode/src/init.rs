//! PID 1 of a node container: the node's bpffs, its own cgroup2 (see [`crate::cgroup`]),
//! wireguard-go and routes, then `meshwork-agent`, restarted whenever it exits, so that an
//! agent restart leaves the node — its pods' namespaces, their veths and BPF programs, the
//! WireGuard device — as a real node keeps them. Orphans are reaped; SIGTERM stops the agent
//! and wireguard-go and exits.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use meshwork_cni::netlink::{Route, RtSocket};
use nix::mount::{MsFlags, mount};
use nix::sys::signal::{Signal, kill};
use nix::sys::statfs::{BPF_FS_MAGIC, statfs};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};

use crate::cgroup;

/// The agent binary.
pub const AGENT: &str = "/usr/bin/meshwork-agent";
/// wireguard-go.
const WIREGUARD_GO: &str = "/usr/bin/wireguard-go";
/// Where wireguard-go puts its UAPI sockets (this container's own).
const WIREGUARD_RUN: &str = "/run/wireguard";
/// The node's bpffs (the agent's default `--bpf-root`).
const BPF_ROOT: &str = "/sys/fs/bpf";
/// The node's cgroup2 (the agent's default `--cgroup-root`).
pub const CGROUP_ROOT: &str = "/run/meshwork/cgroupv2";
/// This helper's files: the agent's PID and the flags a restart added.
pub const STATE: &str = "/run/meshwork/devnode";
/// The running agent's PID.
pub const AGENT_PID: &str = "/run/meshwork/devnode/agent.pid";
/// Flags added to the agent's own, one per line (written by `restart-agent`).
pub const EXTRA_FLAGS: &str = "/run/meshwork/devnode/agent-flags";
/// How long the ENI scene may take to hand this node its instance.
const SCENE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long wireguard-go may take to open its UAPI socket.
const WIREGUARD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the agent and wireguard-go get to exit on SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// An agent that exits sooner than this after its start waits this long before the next.
const CRASH_BACKOFF: Duration = Duration::from_secs(1);

/// `meshwork-devnode node`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Start wireguard-go for this device before the agent (the agent's
    /// `--wireguard-device`), and bring it up.
    #[arg(long, value_name = "DEVICE")]
    wireguard: Option<String>,
    /// A route of the node: `CIDR=dev:DEVICE` or `CIDR=via:IP` (repeatable).
    #[arg(long = "route", value_name = "ROUTE")]
    routes: Vec<String>,
    /// Wait for this file (written by `eni-scene`) and pass what it holds to the agent as
    /// `--eni-instance-id`.
    #[arg(long, value_name = "FILE")]
    eni_instance_file: Option<PathBuf>,
    /// The agent's flags.
    #[arg(last = true)]
    agent_args: Vec<String>,
}

/// Runs the node until SIGTERM.
pub fn run(args: &Args) -> anyhow::Result<()> {
    // Signals are caught by handlers (tokio's), not blocked: a blocked mask would be
    // inherited by the agent, which would then never see its SIGTERM.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(supervise(args))
}

/// Sets the node up, then runs its children until SIGTERM or SIGINT.
async fn supervise(args: &Args) -> anyhow::Result<()> {
    // Registered before any child exists, so that no exit goes unnoticed.
    let mut child = signal(SignalKind::child()).context("catching SIGCHLD")?;
    let mut terminate = signal(SignalKind::terminate()).context("catching SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("catching SIGINT")?;
    for dir in [STATE, WIREGUARD_RUN, "/run/netns"] {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {dir}"))?;
    }
    mount_bpffs()?;
    net_sysctls_writable()?;
    let processes = cgroup::mount_private(Path::new(CGROUP_ROOT))?;
    println!(
        "devnode: cgroup2 at {CGROUP_ROOT} is this container's own ({processes} process(es), \
         all of this container): socket-LB may attach there"
    );
    let wireguard = match &args.wireguard {
        Some(device) => Some(start_wireguard(device)?),
        None => None,
    };
    add_routes(&args.routes)?;
    let mut agent_args = args.agent_args.clone();
    if let Some(file) = &args.eni_instance_file {
        agent_args.push("--eni-instance-id".to_owned());
        agent_args.push(wait_for_instance(file)?);
    }
    let mut node = Supervisor {
        agent_args,
        agent: None,
        wireguard,
    };
    node.start_agent()?;
    loop {
        tokio::select! {
            _ = child.recv() => node.reap()?,
            _ = terminate.recv() => return node.stop(),
            _ = interrupt.recv() => return node.stop(),
        }
    }
}

/// Mounts the node's bpffs at [`BPF_ROOT`] unless one is there.
fn mount_bpffs() -> anyhow::Result<()> {
    if statfs(BPF_ROOT).is_ok_and(|fs| fs.filesystem_type() == BPF_FS_MAGIC) {
        return Ok(());
    }
    mount(
        Some("bpf"),
        BPF_ROOT,
        Some("bpf"),
        MsFlags::empty(),
        None::<&str>,
    )
    .with_context(|| format!("mounting bpffs at {BPF_ROOT}"))
}

/// Makes `/proc/sys/net` writable (Docker mounts `/proc/sys` read-only): the node's own
/// network namespace's settings, where the plugin turns on `proxy_arp` for each pod's veth.
/// The rest of `/proc/sys` (the machine's kernel settings) stays read-only.
fn net_sysctls_writable() -> anyhow::Result<()> {
    const NET: &str = "/proc/sys/net";
    mount(Some(NET), NET, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .with_context(|| format!("bind-mounting {NET}"))?;
    mount(
        None::<&str>,
        NET,
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_BIND,
        None::<&str>,
    )
    .with_context(|| format!("remounting {NET} read-write"))
}

/// Starts `wireguard-go -f DEVICE`, waits for its UAPI socket and brings the device up; its
/// PID.
fn start_wireguard(device: &str) -> anyhow::Result<Pid> {
    let child = Command::new(WIREGUARD_GO)
        .args(["-f", device])
        .spawn()
        .with_context(|| format!("starting {WIREGUARD_GO}"))?;
    let pid = Pid::from_raw(i32::try_from(child.id())?);
    let socket = Path::new(WIREGUARD_RUN).join(format!("{device}.sock"));
    let started = Instant::now();
    while !socket.exists() {
        if started.elapsed() > WIREGUARD_TIMEOUT {
            bail!("wireguard-go opened no {} in time", socket.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut rt = RtSocket::open()?;
    let link = rt
        .link(device)?
        .with_context(|| format!("no link {device} after wireguard-go started"))?;
    rt.set_up(&link)?;
    println!("devnode: wireguard-go {device} up (pid {pid})");
    Ok(pid)
}

/// Adds each `CIDR=dev:DEVICE` or `CIDR=via:IP` route (replacing one to the same place).
fn add_routes(routes: &[String]) -> anyhow::Result<()> {
    let mut rt = RtSocket::open()?;
    for text in routes {
        let (cidr, target) = text
            .split_once('=')
            .with_context(|| format!("route {text:?} is not CIDR=dev:DEVICE or CIDR=via:IP"))?;
        let (dst, prefix_len) = cidr
            .split_once('/')
            .with_context(|| format!("{cidr:?} is not a CIDR"))?;
        let mut route = Route {
            dst: dst
                .parse()
                .with_context(|| format!("{dst:?} is not an IP"))?,
            prefix_len: prefix_len.parse()?,
            gateway: None,
            oif: None,
            link_scope: false,
        };
        if let Some(device) = target.strip_prefix("dev:") {
            let link = rt
                .link(device)?
                .with_context(|| format!("no link {device}"))?;
            route.oif = Some(link.index);
            route.link_scope = true;
        } else if let Some(via) = target.strip_prefix("via:") {
            route.gateway = Some(via.parse::<IpAddr>()?);
        } else {
            bail!("route {text:?}: the target is dev:DEVICE or via:IP");
        }
        rt.add_route(&route, true)
            .with_context(|| format!("adding route {text}"))?;
        println!("devnode: route {text}");
    }
    Ok(())
}

/// Waits for `file` to hold an instance ID; the ID.
fn wait_for_instance(file: &Path) -> anyhow::Result<String> {
    let started = Instant::now();
    loop {
        let id = std::fs::read_to_string(file).unwrap_or_default();
        let id = id.trim();
        if id.starts_with("i-") {
            println!("devnode: EC2 instance {id} (from {})", file.display());
            return Ok(id.to_owned());
        }
        if started.elapsed() > SCENE_TIMEOUT {
            bail!(
                "no instance ID in {} after {SCENE_TIMEOUT:?}",
                file.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The node's children.
struct Supervisor {
    agent_args: Vec<String>,
    /// The agent's PID and when it started.
    agent: Option<(Pid, Instant)>,
    wireguard: Option<Pid>,
}

impl Supervisor {
    /// Starts the agent with its flags and those a restart added.
    fn start_agent(&mut self) -> anyhow::Result<()> {
        let extra: Vec<String> = std::fs::read_to_string(EXTRA_FLAGS)
            .unwrap_or_default()
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty())
            .map(str::to_owned)
            .collect();
        let child = Command::new(AGENT)
            .args(&self.agent_args)
            .args(&extra)
            .spawn()
            .with_context(|| format!("starting {AGENT}"))?;
        let pid = Pid::from_raw(i32::try_from(child.id())?);
        std::fs::write(AGENT_PID, format!("{pid}\n"))
            .with_context(|| format!("writing {AGENT_PID}"))?;
        println!("devnode: meshwork-agent started (pid {pid}, extra flags {extra:?})");
        self.agent = Some((pid, Instant::now()));
        Ok(())
    }

    /// Reaps every exited child; restarts the agent if it was one.
    fn reap(&mut self) -> anyhow::Result<()> {
        while let Some((pid, how)) = reap_one() {
            if let Some((agent, since)) = self.agent
                && agent == pid
            {
                println!("devnode: meshwork-agent (pid {pid}) {how}; starting it again");
                self.agent = None;
                if since.elapsed() < CRASH_BACKOFF {
                    std::thread::sleep(CRASH_BACKOFF);
                }
                self.start_agent()?;
            } else if self.wireguard == Some(pid) {
                println!("devnode: wireguard-go (pid {pid}) {how}; the agent supervises it now");
                self.wireguard = None;
            }
        }
        Ok(())
    }

    /// SIGTERM to the agent and wireguard-go, SIGKILL after [`STOP_GRACE`]; then exits.
    fn stop(&mut self) -> anyhow::Result<()> {
        let mut left: Vec<Pid> = self.agent.take().map(|(pid, _)| pid).into_iter().collect();
        left.extend(self.wireguard.take());
        for pid in &left {
            let _ = kill(*pid, Signal::SIGTERM);
        }
        let started = Instant::now();
        while !left.is_empty() {
            while let Some((pid, _)) = reap_one() {
                left.retain(|p| *p != pid);
            }
            if started.elapsed() > STOP_GRACE {
                for pid in &left {
                    let _ = kill(*pid, Signal::SIGKILL);
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        println!("devnode: stopped");
        Ok(())
    }
}

/// Reaps one exited child, if any: its PID and how it ended.
fn reap_one() -> Option<(Pid, String)> {
    match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
        Ok(WaitStatus::Exited(pid, code)) => Some((pid, format!("exited with {code}"))),
        Ok(WaitStatus::Signaled(pid, signal, _)) => Some((pid, format!("killed by {signal}"))),
        // Stopped and continued children are reported only when asked for: never here.
        Ok(_) | Err(_) => None,
    }
}
