//! Docker's daemon for the dev stack (`compose.yaml`): Debian's `dockerd` (docker.io) is
//! started when none answers, with a private default cgroup namespace. On this cgroup-v1
//! (hybrid) host Docker's default is the host's cgroup namespace, where a node container's
//! `mount -t cgroup2` shows the machine's root — and socket-LB hooks attached there would run
//! for every process on the machine. With `--default-cgroupns-mode private` the mount's root
//! is the container's own cgroup (Debian's docker-compose 1.29 can set no `cgroup:` per
//! service). A daemon that already runs is used only if it gives containers a private
//! cgroup namespace by default; setup never stops or restarts a daemon it did not start.
//!
//! The daemon setup starts has no default bridge (`--bridge none`): no `docker0`, and so no
//! MASQUERADE rule that would route a container's traffic off the machine. The dev stack
//! uses only its own `internal: true` networks, and images are built `FROM scratch` with
//! `COPY` alone, which needs no network.

use std::fs::OpenOptions;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::cmd;
use super::probe::full_path;

/// Where the daemon started by setup logs.
const LOG: &str = "/var/log/meshwork-dockerd.log";
/// The daemon's pid file (dockerd's default).
const PID_FILE: &str = "/var/run/docker.pid";
/// The daemon's config file (dockerd's default).
const DAEMON_JSON: &str = "/etc/docker/daemon.json";
/// The flag that makes every container's cgroup namespace private.
const CGROUPNS_FLAG: &str = "--default-cgroupns-mode";
/// How long a started daemon may take to answer.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// What [`ensure`] found or did.
pub enum Daemon {
    /// A daemon answered, with a private default cgroup namespace; its version.
    Running(String),
    /// Setup started one just now; its version and log.
    Started(String),
    /// None can be used: why.
    Unusable(String),
}

/// Makes sure a Docker daemon with a private default cgroup namespace answers on the
/// default socket, starting Debian's `dockerd` when none does.
pub fn ensure() -> Daemon {
    if let Some(version) = server_version() {
        return match cgroupns_private() {
            Ok(how) => Daemon::Running(format!("dockerd {version}, cgroupns private: {how}")),
            Err(why) => Daemon::Unusable(format!(
                "dockerd {version} runs but {why}: restart it with `{CGROUPNS_FLAG} private` \
                 (setup does not stop a daemon it did not start)"
            )),
        };
    }
    match start() {
        Ok(version) => Daemon::Started(format!(
            "dockerd {version}, {CGROUPNS_FLAG} private, --bridge none, log {LOG}"
        )),
        Err(why) => Daemon::Unusable(why),
    }
}

/// The daemon's version, if one answers.
fn server_version() -> Option<String> {
    let output = cmd::run(Command::new("docker").env("PATH", full_path()).args([
        "version",
        "--format",
        "{{.Server.Version}}",
    ]))
    .ok()?;
    let version = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    (!version.is_empty()).then_some(version)
}

/// Whether the running daemon gives containers a private cgroup namespace by default: cgroup
/// v2 alone (Docker's default there), the flag on its command line, or the key in its config.
fn cgroupns_private() -> Result<&'static str, String> {
    let cgroup_version = cmd::run(Command::new("docker").env("PATH", full_path()).args([
        "info",
        "--format",
        "{{.CgroupVersion}}",
    ]))
    .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    .unwrap_or_default();
    if cgroup_version == "2" {
        return Ok("cgroup v2 host");
    }
    let pid = std::fs::read_to_string(PID_FILE).unwrap_or_default();
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", pid.trim())).unwrap_or_default();
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|arg| String::from_utf8_lossy(arg).into_owned())
        .collect();
    let flagged = args
        .iter()
        .any(|arg| *arg == format!("{CGROUPNS_FLAG}=private"))
        || args
            .windows(2)
            .any(|pair| pair[0] == CGROUPNS_FLAG && pair[1] == "private");
    if flagged {
        return Ok("daemon flag");
    }
    let config = std::fs::read_to_string(DAEMON_JSON).unwrap_or_default();
    let configured = config
        .split_once("\"default-cgroupns-mode\"")
        .is_some_and(|(_, rest)| {
            rest.trim_start()
                .trim_start_matches(':')
                .trim_start()
                .starts_with("\"private\"")
        });
    if configured {
        return Ok(DAEMON_JSON);
    }
    Err(format!(
        "its default cgroup namespace is the host's (cgroup v{cgroup_version}, \
         no {CGROUPNS_FLAG} private)"
    ))
}

/// Starts `dockerd --default-cgroupns-mode private` in its own process group (it outlives
/// setup, as a daemon does), logging to [`LOG`]; waits until it answers.
fn start() -> Result<String, String> {
    let dockerd = std::env::split_paths(&full_path())
        .map(|dir| dir.join("dockerd"))
        .find(|path| path.is_file())
        .ok_or("dockerd not found (apt: docker.io)")?;
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(LOG)
        .map_err(|err| format!("cannot open {LOG}: {err}"))?;
    let log_err = log
        .try_clone()
        .map_err(|err| format!("cannot open {LOG}: {err}"))?;
    eprintln!(
        "starting {} {CGROUPNS_FLAG} private --bridge none",
        dockerd.display()
    );
    let mut child = {
        use std::os::unix::process::CommandExt as _;
        Command::new(&dockerd)
            .args([CGROUPNS_FLAG, "private", "--bridge", "none"])
            .env("PATH", full_path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .process_group(0)
            .spawn()
            .map_err(|err| format!("cannot run {}: {err}", dockerd.display()))?
    };
    let started = Instant::now();
    while started.elapsed() < START_TIMEOUT {
        if let Some(version) = server_version() {
            return Ok(version);
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "dockerd exited ({status}); {}",
                log_tail(Path::new(LOG))
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Err(format!(
        "dockerd did not answer within {}s; {}",
        START_TIMEOUT.as_secs(),
        log_tail(Path::new(LOG))
    ))
}

/// The last lines of `log`, for a failure report.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    format!(
        "log {}: {}",
        log.display(),
        lines[lines.len().saturating_sub(3)..].join(" | ")
    )
}
