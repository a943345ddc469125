//! Network namespaces made by the lab: naming, running programs inside, teardown, stale sweep.

use std::collections::HashSet;
use std::fs::File;
use std::io::{Seek as _, SeekFrom, Write as _};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nix::sched::CloneFlags;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::LabNet;
use super::cidr::Cidr;
use super::partition::{LinkDown, NftPartition};
use super::veth::Veth;
use crate::process::LabProcess;
use crate::{LabError, Result, paths, process, wait};

/// Where `ip netns` keeps its namespace mounts.
pub const NETNS_DIR: &str = "/run/netns";

/// The TCP port reachability probes connect to. Nothing needs to listen there: a refused
/// connection (a RST) proves the address answered as much as an accepted one.
pub const PROBE_PORT: u16 = 9;

/// Names of namespaces this process has created and not yet deleted (shields them from the
/// stale sweep when a PID is reused).
static LIVE: Mutex<Option<HashSet<String>>> = Mutex::new(None);
static COUNTER: AtomicU32 = AtomicU32::new(0);

/// The prefix of every namespace this process creates: `mw<pid>-`.
pub fn own_prefix() -> String {
    format!("mw{}-", std::process::id())
}

/// The PID embedded in a lab namespace name (`mw<pid>-…`), or `None` for foreign names.
pub fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("mw")?;
    let (pid, _) = rest.split_once('-')?;
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

/// Names of all namespaces in [`NETNS_DIR`].
pub fn list_netns() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .collect()
}

/// Deletes lab namespaces (`mw<pid>-*`) left behind by processes that no longer exist — and
/// by this process's PID's previous owner — killing (by PID) whatever still runs inside them.
/// Foreign namespaces are never touched. Returns the names deleted.
pub fn sweep_stale() -> Vec<String> {
    let me = std::process::id();
    let mut swept = Vec::new();
    for name in list_netns() {
        let Some(pid) = owner_pid(&name) else {
            continue;
        };
        let stale = if pid == me {
            !live_names(|live| live.contains(&name))
        } else {
            !Path::new(&format!("/proc/{pid}")).exists()
        };
        if stale {
            let path = Path::new(NETNS_DIR).join(&name);
            stop_processes_in(&path, Duration::from_millis(500));
            if delete_netns(&name).is_ok() {
                tracing::info!(netns = %name, "deleted a stale lab namespace");
                swept.push(name);
            }
        }
    }
    swept
}

fn live_names<T>(f: impl FnOnce(&mut HashSet<String>) -> T) -> T {
    let mut guard = LIVE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    f(guard.get_or_insert_with(HashSet::new))
}

fn delete_netns(name: &str) -> Result<()> {
    process::run(Command::new(paths::find_program("ip")?).args(["netns", "del", name])).map(drop)
}

/// PIDs of the processes whose network namespace is the one mounted at `path`.
pub fn pids_in_netns(path: &Path) -> Vec<i32> {
    let Ok(target) = std::fs::metadata(path) else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let pid: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let ns = std::fs::metadata(format!("/proc/{pid}/ns/net")).ok()?;
            (ns.dev() == target.dev() && ns.ino() == target.ino()).then_some(pid)
        })
        .collect()
}

/// SIGTERM, then (after `grace`) SIGKILL to every process inside the namespace, by PID; waits
/// (bounded) until none is left. Zombies no longer count: they have left the namespace.
fn stop_processes_in(path: &Path, grace: Duration) {
    let signal_all = |signal| {
        for pid in pids_in_netns(path) {
            let _ = kill(Pid::from_raw(pid), signal);
        }
    };
    let gone = || pids_in_netns(path).is_empty().then_some(());
    if gone().is_some() {
        return;
    }
    signal_all(Signal::SIGTERM);
    if wait::until("processes to leave", grace, Duration::from_millis(10), gone).is_ok() {
        return;
    }
    signal_all(Signal::SIGKILL);
    let _ = wait::until(
        "killed processes to leave",
        Duration::from_secs(5),
        Duration::from_millis(10),
        gone,
    );
}

/// A network namespace made by the lab, named `mw<pid>-<n>-<name>`.
///
/// Created with loopback up, IPv6 DAD off and `keep_addr_on_down` on. Dropping it stops
/// every process still inside (SIGTERM, then SIGKILL, by PID), then `ip netns del` — which
/// also removes its veths (their peers vanish from the other namespaces) and nft tables.
#[derive(Debug)]
pub struct Netns {
    name: String,
    path: PathBuf,
    lab: LabNet,
}

impl Netns {
    pub(super) fn create(lab: &LabNet, name: &str) -> Result<Self> {
        if name.is_empty()
            || name.len() > 24
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(LabError::CommandFailed {
                command: format!("netns {name:?}"),
                detail: "names are 1-24 characters of [A-Za-z0-9_-]".to_owned(),
            });
        }
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let full = format!("{}{n}-{name}", own_prefix());
        live_names(|live| live.insert(full.clone()));
        if let Err(error) =
            process::run(Command::new(paths::find_program("ip")?).args(["netns", "add", &full]))
        {
            live_names(|live| live.remove(&full));
            return Err(error);
        }
        // From here on, Drop deletes the namespace if the setup below fails.
        let netns = Self {
            path: Path::new(NETNS_DIR).join(&full),
            name: full,
            lab: lab.clone(),
        };
        netns.ip(&["link", "set", "lo", "up"])?;
        netns.sysctl("net.ipv6.conf.all.keep_addr_on_down", "1")?;
        netns.sysctl("net.ipv6.conf.default.keep_addr_on_down", "1")?;
        netns.sysctl("net.ipv6.conf.all.accept_dad", "0")?;
        netns.sysctl("net.ipv6.conf.default.accept_dad", "0")?;
        tracing::debug!(netns = %netns.name, "namespace created");
        Ok(netns)
    }

    /// The full namespace name (`mw<pid>-<n>-<name>`), as `ip -n` takes it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace's mount, `/run/netns/<name>` (for `nsenter --net=`, `setns`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The lab this namespace belongs to.
    pub fn lab(&self) -> &LabNet {
        &self.lab
    }

    /// A command that runs `program` inside the namespace:
    /// `nsenter -F --net=/run/netns/<name> -- program`. Only the network namespace changes
    /// (not the mounts, unlike `ip netns exec`), and no extra process sits in between, so the
    /// spawned PID is the program's.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        command_in(&self.path, program)
    }

    /// Rewraps `inner` (program, arguments, environment, working directory) to run inside the
    /// namespace.
    pub fn wrap(&self, inner: &Command) -> Command {
        let mut command = self.command(inner.get_program());
        command.args(inner.get_args());
        process::carry_env_and_dir(inner, &mut command);
        command
    }

    /// Runs `program args…` inside the namespace to completion; its stdout, or an error
    /// with its stderr.
    pub fn run(&self, program: &str, args: &[&str]) -> Result<String> {
        process::run(self.command(program).args(args))
    }

    /// Starts the long-running `inner` command inside the namespace (see [`Netns::wrap`]),
    /// logging to `<lab log dir>/<namespace>-<name>.log`. The caller owns the process; if the
    /// namespace is dropped first, its drop stops the process too.
    pub fn spawn(&self, name: &str, inner: &Command) -> Result<LabProcess> {
        let log = self.log_path(name);
        LabProcess::spawn(name, self.wrap(inner), &log)
    }

    /// The log file [`Netns::spawn`] uses for `name`.
    pub fn log_path(&self, name: &str) -> PathBuf {
        self.lab.log_dir().join(format!("{}-{name}.log", self.name))
    }

    /// Runs `ip -n <name> args…`. Address assignment is refused here: use
    /// [`Netns::add_addr`], which checks the guarded ranges.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let object = args
            .iter()
            .find(|a| !a.starts_with('-'))
            .copied()
            .unwrap_or("");
        if !object.is_empty() && "address".starts_with(object) && args.len() > 1 {
            let verb_pos = args.iter().position(|a| *a == object).unwrap_or(0) + 1;
            let verb = args.get(verb_pos).copied().unwrap_or("show");
            if !["show", "list", "lst", "sh", "ls", "l", "s"].contains(&verb) {
                return Err(LabError::CommandFailed {
                    command: format!("ip {}", args.join(" ")),
                    detail: "change addresses with Netns::add_addr (guarded ranges only)"
                        .to_owned(),
                });
            }
        }
        process::run(
            Command::new(paths::find_program("ip")?)
                .arg("-n")
                .arg(&self.name)
                .args(args),
        )
    }

    /// Assigns `cidr` (e.g. `10.213.1.2/24`) to `dev`. Refused unless it lies inside one of
    /// the [`super::GUARDED_RANGES`]. IPv6 addresses are added with `nodad`.
    pub fn add_addr(&self, dev: &str, cidr: &str) -> Result<Cidr> {
        let parsed = Cidr::parse(cidr)?;
        parsed.check_guarded()?;
        let text = parsed.to_string();
        let mut args = vec!["address", "add", &text, "dev", dev];
        if parsed.is_ipv6() {
            args.push("nodad");
        }
        process::run(
            Command::new(paths::find_program("ip")?)
                .arg("-n")
                .arg(&self.name)
                .args(&args),
        )?;
        Ok(parsed)
    }

    /// `ip link set dev up`.
    pub fn link_up(&self, dev: &str) -> Result<()> {
        self.ip(&["link", "set", dev, "up"]).map(drop)
    }

    /// Takes `dev` down until the returned guard heals (or drops). Routes through `dev`
    /// (which the kernel deletes on admin-down) are restored on heal.
    pub fn link_down(&self, dev: &str) -> Result<LinkDown> {
        LinkDown::new(self, dev)
    }

    /// Sets the MTU of `dev`.
    pub fn set_mtu(&self, dev: &str, mtu: u32) -> Result<()> {
        self.ip(&["link", "set", dev, "mtu", &mtu.to_string()])
            .map(drop)
    }

    /// Adds a route to `dest` (`default` or a prefix) via the gateway `via`.
    pub fn add_route_via(&self, dest: &str, via: &str) -> Result<()> {
        self.ip(&["route", "add", dest, "via", via]).map(drop)
    }

    /// Adds a route to `dest` (`default` or a prefix) straight out of `dev`.
    pub fn add_route_dev(&self, dest: &str, dev: &str) -> Result<()> {
        self.ip(&["route", "add", dest, "dev", dev]).map(drop)
    }

    /// Points the route to `dest` (a prefix) straight out of `dev`, replacing any route to it.
    pub fn replace_route_dev(&self, dest: &str, dev: &str) -> Result<()> {
        self.ip(&["route", "replace", dest, "dev", dev]).map(drop)
    }

    /// Turns on IPv4 and IPv6 forwarding (for node namespaces that route for pods).
    pub fn enable_forwarding(&self) -> Result<()> {
        self.sysctl("net.ipv4.ip_forward", "1")?;
        self.sysctl("net.ipv6.conf.all.forwarding", "1")
    }

    /// Writes a `net.*` sysctl of this namespace (e.g. `net.ipv4.ip_forward`).
    pub fn sysctl(&self, key: &str, value: &str) -> Result<()> {
        if !key.starts_with("net.") || key.contains("..") || key.contains('/') {
            return Err(LabError::CommandFailed {
                command: format!("sysctl {key}"),
                detail: "only net.* sysctls are per namespace".to_owned(),
            });
        }
        let path = PathBuf::from("/proc/sys").join(key.replace('.', "/"));
        let value = value.to_owned();
        self.enter(move || {
            File::options()
                .write(true)
                .open(&path)
                .and_then(|mut f| f.write_all(value.as_bytes()))
                .map_err(LabError::io(format!("writing {}", path.display())))
        })?
    }

    /// Makes a veth pair: `dev` here, `peer_dev` in `peer`, both up, no addresses. Names must
    /// be at most 15 characters and free in their namespace.
    pub fn veth_to(&self, dev: &str, peer: &Netns, peer_dev: &str) -> Result<Veth> {
        Veth::create(self, dev, peer, peer_dev)
    }

    /// Runs `f` on a thread that has entered this namespace, and returns its result. Sockets
    /// made inside keep the namespace after the thread ends, so a `TcpStream` or
    /// `TcpListener` created here can be used from any thread (or handed to tokio).
    /// `f` never runs unless the thread is verifiably inside the namespace. A panic in `f`
    /// is resumed on the caller.
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T> {
        let file = File::open(&self.path)
            .map_err(LabError::io(format!("opening {}", self.path.display())))?;
        let target = file
            .metadata()
            .map_err(LabError::io(format!("stat {}", self.path.display())))?;
        let outcome = std::thread::scope(|scope| {
            scope
                .spawn(move || -> Result<T> {
                    nix::sched::setns(&file, CloneFlags::CLONE_NEWNET).map_err(|errno| {
                        LabError::Io {
                            context: "setns into the lab namespace".to_owned(),
                            error: errno.into(),
                        }
                    })?;
                    let now = std::fs::metadata("/proc/thread-self/ns/net")
                        .map_err(LabError::io("stat /proc/thread-self/ns/net"))?;
                    if now.dev() != target.dev() || now.ino() != target.ino() {
                        return Err(LabError::CommandFailed {
                            command: "setns".to_owned(),
                            detail: "the thread is not in the lab namespace".to_owned(),
                        });
                    }
                    Ok(f())
                })
                .join()
        });
        match outcome {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    /// One reachability probe from inside this namespace: a TCP connect to
    /// `ip:`[`PROBE_PORT`]; an accepted or refused connection means `ip` answered.
    pub fn can_reach(&self, ip: IpAddr, timeout: Duration) -> Result<bool> {
        self.enter(move || {
            match TcpStream::connect_timeout(&SocketAddr::new(ip, PROBE_PORT), timeout) {
                Ok(_) => true,
                Err(error) => error.kind() == std::io::ErrorKind::ConnectionRefused,
            }
        })
    }

    /// Probes (one-second attempts) until `ip` answers, or fails after `timeout`.
    pub fn wait_reachable(&self, ip: IpAddr, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        let mut last_error = None;
        let reached = wait::until(
            &format!("{ip} to answer from {}", self.name),
            timeout,
            Duration::from_millis(50),
            || {
                let left = timeout.saturating_sub(start.elapsed());
                let attempt = left.clamp(Duration::from_millis(100), Duration::from_secs(1));
                match self.can_reach(ip, attempt) {
                    Ok(true) => Some(()),
                    Ok(false) => None,
                    Err(error) => {
                        last_error = Some(error);
                        None
                    }
                }
            },
        );
        match (reached, last_error) {
            (Ok(()), _) => Ok(()),
            (Err(_), Some(error)) => Err(error),
            (Err(timeout), None) => Err(timeout),
        }
    }

    /// Drops all traffic to and from `prefix` (an address or CIDR, IPv4 or IPv6) in this
    /// namespace with an nft table of its own, until the returned guard heals (or drops).
    pub fn drop_traffic(&self, prefix: &str) -> Result<NftPartition> {
        NftPartition::new(self, prefix)
    }

    /// PIDs of the processes currently inside this namespace.
    pub fn pids(&self) -> Vec<i32> {
        pids_in_netns(&self.path)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        stop_processes_in(&self.path, Duration::from_secs(2));
        if let Err(error) = delete_netns(&self.name) {
            tracing::warn!(netns = %self.name, %error, "could not delete the namespace");
        }
        live_names(|live| live.remove(&self.name));
        tracing::debug!(netns = %self.name, "namespace deleted");
    }
}

/// `nsenter -F --net=<path> -- program`: `program` in the network namespace mounted at
/// `path` (a lab namespace, or one a runtime made), nothing else changed.
pub fn command_in(path: &Path, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let nsenter = paths::find_program("nsenter").unwrap_or_else(|_| PathBuf::from("nsenter"));
    let mut command = Command::new(nsenter);
    command
        .arg("-F")
        .arg(format!("--net={}", path.display()))
        .arg("--")
        .arg(program);
    command
}

/// Runs `command` with `input` as its stdin (a seekable temporary file: `ip route restore`
/// insists on one); its raw stdout, or an error with its stderr.
pub(super) fn run_bytes(command: &mut Command, input: Option<&[u8]>) -> Result<Vec<u8>> {
    let description = format!("{command:?}");
    let stdin = match input {
        Some(input) => {
            let mut file = tempfile::tempfile().map_err(LabError::io("creating a stdin file"))?;
            file.write_all(input)
                .and_then(|()| file.seek(SeekFrom::Start(0)).map(drop))
                .map_err(LabError::io("writing a stdin file"))?;
            Stdio::from(file)
        }
        None => Stdio::null(),
    };
    let output = command
        .stdin(stdin)
        .output()
        .map_err(LabError::io(format!("running {description}")))?;
    if output.status.success() {
        Ok(output.stdout)
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
