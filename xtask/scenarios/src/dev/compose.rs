//! The stack as Docker sees it: `docker-compose` (Debian's v1 command) on the workspace's
//! `compose.yaml` under one project name, and `docker exec` into its containers — the only
//! way anything here reaches a container (never a connection from the root namespace to a
//! container's address).

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use anyhow::{Context as _, bail};

/// The compose project: container names are `<project>_<service>_1`, networks
/// `<project>_<network>`.
pub const PROJECT: &str = "meshwork";
/// How long a container gets to stop before SIGKILL.
const STOP_TIMEOUT_SECS: &str = "15";

/// The nodes, by service name.
pub const NODES: [&str; 4] = ["c1-node-1", "c1-node-2", "c2-node-1", "c2-node-2"];

/// The workspace's `compose.yaml`.
pub fn file() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../compose.yaml"))
}

/// `docker-compose -p meshwork -f compose.yaml ARGS…`.
pub fn compose(args: &[&str]) -> Command {
    let mut command = Command::new("docker-compose");
    command
        .args(["--ansi", "never", "-p", PROJECT, "-f"])
        .arg(file())
        .args(args)
        .stdin(Stdio::null());
    command
}

/// Runs `command`, failing with its stderr; its stdout.
pub fn run(command: &mut Command) -> anyhow::Result<String> {
    let out = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    if !out.status.success() {
        bail!(
            "{:?} failed ({}): {}",
            command,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `command` with its output shown as it comes; fails when it does.
pub fn run_shown(command: &mut Command) -> anyhow::Result<()> {
    let status = command
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status()
        .with_context(|| format!("running {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed ({status})");
    }
    Ok(())
}

/// `up -d`: compose starts each service once those it depends on are healthy.
pub fn up() -> anyhow::Result<()> {
    run_shown(&mut compose(&["up", "--detach", "--no-build"]))
}

/// `down`: every container, network and volume of the project.
pub fn down() -> anyhow::Result<()> {
    run_shown(&mut compose(&[
        "down",
        "--volumes",
        "--remove-orphans",
        "--timeout",
        STOP_TIMEOUT_SECS,
    ]))
}

/// The container of `service`.
pub fn container(service: &str) -> String {
    format!("{PROJECT}_{service}_1")
}

/// The Docker network `network` of the stack.
pub fn network(network: &str) -> String {
    format!("{PROJECT}_{network}")
}

/// The stack's containers (running or not), by name.
pub fn containers() -> anyhow::Result<Vec<String>> {
    let out = run(Command::new("docker").args([
        "ps",
        "--all",
        "--filter",
        &format!("label=com.docker.compose.project={PROJECT}"),
        "--format",
        "{{.Names}}",
    ]))?;
    Ok(out.lines().map(str::to_owned).collect())
}

/// `docker exec CONTAINER ARGS…` of `service`'s container: its output, whatever its exit.
pub fn exec_output(service: &str, args: &[&str]) -> anyhow::Result<Output> {
    Command::new("docker")
        .arg("exec")
        .arg(container(service))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("docker exec {service} {}", args.join(" ")))
}

/// `docker exec` in `service`'s container; its stdout, or an error with its stderr.
pub fn exec(service: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = exec_output(service, args)?;
    if !out.status.success() {
        bail!(
            "docker exec {service} {} failed ({}): {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// [`exec`] of a command that prints one JSON value (its last line).
pub fn exec_json(service: &str, args: &[&str]) -> anyhow::Result<serde_json::Value> {
    let out = exec(service, args)?;
    let line = out.lines().last().unwrap_or_default();
    serde_json::from_str(line)
        .with_context(|| format!("docker exec {service} {}: {out:?}", args.join(" ")))
}

/// `docker CMD ARGS…`, failing with its stderr.
pub fn docker(args: &[&str]) -> anyhow::Result<String> {
    run(Command::new("docker").args(args).stdin(Stdio::null()))
}

/// The logs of `service`'s container (what it wrote to stdout and to stderr).
pub fn logs(service: &str) -> anyhow::Result<String> {
    logs_since(service, "0")
}

/// The logs of `service`'s container since `since` (Unix seconds, as `docker logs` takes it).
pub fn logs_since(service: &str, since: &str) -> anyhow::Result<String> {
    let out = Command::new("docker")
        .args(["logs", "--since", since, &container(service)])
        .stdin(Stdio::null())
        .output()?;
    Ok(format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}
