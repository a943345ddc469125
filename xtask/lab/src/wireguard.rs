//! wireguard-go devices inside lab namespaces, and the UAPI text protocol to talk to them.
//!
//! wireguard-go creates its TUN device in the namespace it runs in, but its UAPI socket
//! `/var/run/wireguard/<dev>.sock` lives in the one shared mount namespace: device names must
//! be unique on the machine, not just per namespace. [`unique_device_name`] makes such names
//! (`mwg<pid>-<n>`), and [`WireguardGo::start`] refuses a name whose socket answers already.
//!
//! ```no_run
//! # fn main() -> meshwork_lab::Result<()> {
//! use meshwork_lab::net::LabNet;
//! use meshwork_lab::wireguard::{WireguardGo, unique_device_name};
//!
//! let lab = LabNet::new()?;
//! let node = lab.netns("node")?;
//! let wg = WireguardGo::start(&node, &unique_device_name())?;
//! assert!(wg.uapi_get()?.contains("errno=0"));
//! # Ok(())
//! # }
//! ```

use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::net::{Netns, check_ifname};
use crate::process::LabProcess;
use crate::{LabError, Result, paths, wait};

/// Where wireguard-go puts its UAPI sockets (shared by all network namespaces).
pub const SOCKET_DIR: &str = "/var/run/wireguard";

/// How long [`WireguardGo::start`] waits for the UAPI socket.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a UAPI request may take.
pub const UAPI_TIMEOUT: Duration = Duration::from_secs(5);

static DEVICES: AtomicU32 = AtomicU32::new(0);

/// A device name unique on the machine: `mwg<pid>-<n>` (`n` in hex), at most 15 characters.
pub fn unique_device_name() -> String {
    let pid = std::process::id();
    let n = DEVICES.fetch_add(1, Ordering::Relaxed);
    let room = 15usize.saturating_sub(format!("mwg{pid}-").len()).max(1);
    // Keep the low `room` hex digits of the counter (65 536 devices per process at 7-digit PIDs).
    let digits = format!("{n:x}");
    let tail = &digits[digits.len().saturating_sub(room)..];
    format!("mwg{pid}-{tail}")
}

/// The UAPI socket path of `device`.
pub fn socket_path(device: &str) -> PathBuf {
    Path::new(SOCKET_DIR).join(format!("{device}.sock"))
}

/// Writes `<dir>/wireguard-go-in-<netns name>`: a program that runs wireguard-go inside
/// `netns`, for an agent's `--wireguard-userspace-bin`. An agent in the root namespace then
/// creates its fallback device in its node's namespace, never in the root one. Its path.
pub fn netns_wrapper(netns: &Netns, dir: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let nsenter = paths::find_program("nsenter")?;
    let program = paths::find_program("wireguard-go")?;
    let wrapper = dir.join(format!("wireguard-go-in-{}", netns.name()));
    let script = format!(
        "#!/bin/sh\nexec {} --net={} -- {} \"$@\"\n",
        nsenter.display(),
        netns.path().display(),
        program.display()
    );
    let written = std::fs::write(&wrapper, script)
        .and_then(|()| std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)));
    written.map_err(LabError::io(format!("writing {}", wrapper.display())))?;
    Ok(wrapper)
}

/// Removes UAPI sockets of lab devices (`mwg<pid>-*`) whose process is gone and which no
/// longer answer. Returns the paths removed.
pub fn sweep_stale_sockets() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(SOCKET_DIR) else {
        return Vec::new();
    };
    let me = std::process::id();
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let Some(device) = name.strip_suffix(".sock") else {
            continue;
        };
        let Some(pid) = device
            .strip_prefix("mwg")
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let path = entry.path();
        let owner_gone = pid != me && !Path::new(&format!("/proc/{pid}")).exists();
        if owner_gone && UnixStream::connect(&path).is_err() && std::fs::remove_file(&path).is_ok()
        {
            removed.push(path);
        }
    }
    removed
}

/// Sends one UAPI request (e.g. `get=1\n\n`, or `set=1\n…\n\n`) to the socket and returns the
/// answer up to and including its terminating empty line.
pub fn uapi_request(socket: &Path, request: &str) -> Result<String> {
    let context = |what: &str| format!("{what} {}", socket.display());
    let mut stream = UnixStream::connect(socket).map_err(LabError::io(context("connecting to")))?;
    stream
        .set_read_timeout(Some(UAPI_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(UAPI_TIMEOUT)))
        .map_err(LabError::io(context("setting timeouts on")))?;
    stream
        .write_all(request.as_bytes())
        .map_err(LabError::io(context("writing to")))?;
    let mut reader = BufReader::new(stream);
    let mut answer = String::new();
    loop {
        let mut line = String::new();
        let read = reader
            .read_line(&mut line)
            .map_err(LabError::io(context("reading from")))?;
        if read == 0 {
            return Err(LabError::CommandFailed {
                command: format!("uapi {}", socket.display()),
                detail: format!("connection closed before the end of the answer: {answer:?}"),
            });
        }
        answer.push_str(&line);
        if line == "\n" {
            return Ok(answer);
        }
    }
}

/// The `errno` of a UAPI answer (`0` is success), if present.
pub fn uapi_errno(answer: &str) -> Option<i64> {
    answer
        .lines()
        .find_map(|line| line.strip_prefix("errno="))
        .and_then(|errno| errno.trim().parse().ok())
}

/// A wireguard-go process (`wireguard-go -f DEV`) running inside a lab namespace.
///
/// Dropping it stops the process (SIGTERM, then SIGKILL, by PID) and removes the socket if it
/// was left behind. The TUN device disappears with the process.
#[derive(Debug)]
pub struct WireguardGo {
    device: String,
    socket: PathBuf,
    process: LabProcess,
}

impl WireguardGo {
    /// Starts wireguard-go for `device` in `netns` and waits for its UAPI socket to answer.
    /// The device is created down and without addresses: use `netns.link_up(device)` and
    /// `netns.add_addr(device, …)`.
    pub fn start(netns: &Netns, device: &str) -> Result<Self> {
        check_ifname(device)?;
        let program = paths::find_program("wireguard-go")?;
        sweep_stale_sockets();
        let socket = socket_path(device);
        if UnixStream::connect(&socket).is_ok() {
            return Err(LabError::CommandFailed {
                command: format!("wireguard-go {device}"),
                detail: format!(
                    "{} already answers: device name in use (see unique_device_name)",
                    socket.display()
                ),
            });
        }
        let mut inner = Command::new(program);
        inner.args(["-f", device]).env("WG_PROCESS_FOREGROUND", "1");
        let process = netns.spawn(&format!("wireguard-go-{device}"), &inner)?;
        let mut wg = Self {
            device: device.to_owned(),
            socket,
            process,
        };
        let mut exited = None;
        let ready = wait::until(
            &format!("wireguard-go UAPI socket {}", wg.socket.display()),
            START_TIMEOUT,
            Duration::from_millis(5),
            || {
                if let Err(error) = wg.process.check_running() {
                    exited = Some(error);
                    return Some(false);
                }
                UnixStream::connect(&wg.socket).is_ok().then_some(true)
            },
        );
        match (ready, exited) {
            (Ok(true), _) => Ok(wg),
            (_, Some(error)) => Err(error),
            (Ok(false), None) => Err(LabError::CommandFailed {
                command: format!("wireguard-go {device}"),
                detail: wg.process.log_tail(),
            }),
            (Err(timeout), None) => Err(timeout),
        }
    }

    /// The device (TUN interface) name.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// The UAPI socket, `/var/run/wireguard/<device>.sock`.
    pub fn uapi_socket(&self) -> PathBuf {
        self.socket.clone()
    }

    /// The wireguard-go PID.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Whether wireguard-go still runs.
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    /// The log of the process.
    pub fn log_tail(&self) -> String {
        self.process.log_tail()
    }

    /// SIGKILLs wireguard-go, as a crash would: the device vanishes at once and the stale
    /// socket file stays (until drop), like after a real crash.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// `get=1`: the device's configuration in UAPI form (hex keys), ending with `errno=0`.
    pub fn uapi_get(&self) -> Result<String> {
        uapi_request(&self.socket, "get=1\n\n")
    }

    /// `set=1` with `body` (UAPI lines such as `private_key=<hex>\nlisten_port=51820`);
    /// fails unless the answer is `errno=0`.
    pub fn uapi_set(&self, body: &str) -> Result<()> {
        let body = body.trim_end_matches('\n');
        let answer = uapi_request(&self.socket, &format!("set=1\n{body}\n\n"))?;
        match uapi_errno(&answer) {
            Some(0) => Ok(()),
            _ => Err(LabError::CommandFailed {
                command: format!("uapi set on {}", self.device),
                detail: answer.trim().to_owned(),
            }),
        }
    }
}

impl Drop for WireguardGo {
    fn drop(&mut self) {
        self.process.stop(Duration::from_secs(5));
        if self.socket.exists() && UnixStream::connect(&self.socket).is_err() {
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}
