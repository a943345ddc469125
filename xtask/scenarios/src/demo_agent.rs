//! The demo's main act: a real `meshwork-agent` against the loaded lab clusters, with
//! `meshctl status` showing it converge; then one cluster's config file is removed and the
//! drain is timed; then SIGTERM stops the agent cleanly.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use meshwork_lab::agent::{AgentOptions, AgentProcess};
use meshwork_lab::cilium::Cluster;
use meshwork_lab::etcd::EtcdServer;
use meshwork_lab::process::LabProcess;
use meshwork_lab::wait::{self, Wait};
use nix::sys::signal::Signal;
use serde_json::Value;

use crate::binaries::Binaries;

/// The agent's own cluster (never one of the remotes).
const LOCAL_CLUSTER: &str = "demo-local";
const LOCAL_CLUSTER_ID: u32 = 250;
/// How often the agent (or meshctl) is checked on.
const POLL: Duration = Duration::from_millis(20);
/// How long `meshctl status --wait` may run beyond its own `--timeout`.
const MESHCTL_GRACE: Duration = Duration::from_secs(15);
/// How long the agent may take to drop a removed cluster from its status.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the agent may take to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs the agent against `servers` (one per cluster, loaded) in a temp dir; returns the
/// closing summary line. On failure the temp dir (config, state, agent log) is kept.
pub async fn run(
    binaries: &Binaries,
    clusters: &[Cluster],
    servers: &[EtcdServer],
    timeout: Duration,
) -> anyhow::Result<String> {
    let dir = tempfile::Builder::new()
        .prefix("meshwork-demo-")
        .tempdir()
        .context("creating the demo's temp dir")?;
    // The agent is stopped (by PID) when `run_in` returns, before the dir is removed.
    let outcome = run_in(binaries, clusters, servers, timeout, dir.path()).await;
    if outcome.is_err() {
        let kept = dir.keep();
        eprintln!(
            "Kept {} (clustermesh config, agent state and agent.log) for inspection.",
            kept.display()
        );
    }
    outcome
}

async fn run_in(
    binaries: &Binaries,
    clusters: &[Cluster],
    servers: &[EtcdServer],
    timeout: Duration,
    dir: &Path,
) -> anyhow::Result<String> {
    let config_dir = crate::load::write_mesh_config(dir, servers, clusters)?;
    println!(
        "\nClustermesh config: {} (one file per cluster: endpoints)",
        config_dir.display()
    );

    let metrics_port = wait::free_port()?;
    let options = AgentOptions::new(
        &binaries.agent,
        LOCAL_CLUSTER,
        LOCAL_CLUSTER_ID,
        &dir.join("state"),
    )
    .clustermesh_config(&config_dir)
    .metrics_port(metrics_port);
    let started = Instant::now();
    let mut agent = AgentProcess::start(&options)
        .with_context(|| format!("starting {}", binaries.agent.display()))?;
    let socket = agent.socket().to_owned();
    println!(
        "Started meshwork-agent (pid {}) as cluster {LOCAL_CLUSTER} (ID {LOCAL_CLUSTER_ID})\n  \
         log      {}\n  API      {}\n  metrics  http://127.0.0.1:{metrics_port}/metrics",
        agent.pid(),
        agent.log().display(),
        socket.display()
    );

    // Convergence, as meshctl shows it (progress on stderr, status on stdout).
    let wait_timeout = format!("{}s", timeout.as_secs());
    println!("\n$ meshctl status --wait --timeout {wait_timeout}");
    let status = supervise(
        agent.process(),
        "meshctl status --wait",
        &mut meshctl(
            binaries,
            &socket,
            &["status", "--wait", "--timeout", &wait_timeout],
        ),
        timeout + MESHCTL_GRACE,
    )
    .await?;
    if !status.success() {
        bail!(
            "`meshctl status --wait` failed ({status}); agent log {}:\n{}",
            agent.log().display(),
            agent.log_tail()
        );
    }
    let ready_after = started.elapsed();
    println!(
        "\nAll {} remote clusters ready {} ms after the agent started (meshctl polls every 250 ms).",
        clusters.len(),
        ready_after.as_millis()
    );

    // Drain: the removed file takes the cluster and everything it contributed away.
    let removed = &clusters[clusters.len().min(2) - 1].name;
    let file = config_dir.join(removed);
    std::fs::remove_file(&file).with_context(|| format!("removing {}", file.display()))?;
    let drain_started = Instant::now();
    println!("\n$ rm {}", file.display());
    let expected = clusters.len() - 1;
    let drained = Wait::new(format!("{removed} gone from the agent's status"))
        .timeout(DRAIN_TIMEOUT)
        .every(POLL)
        .until_async(
            || {
                let running = running(agent.process(), "the drain");
                let socket = socket.clone();
                async move {
                    running?;
                    let status = status_json(binaries, &socket).await?;
                    let mesh = &status["clustermesh"];
                    let drained = mesh["total"].as_u64() == Some(expected as u64);
                    anyhow::Ok(drained.then(|| mesh["ready"].as_u64().unwrap_or(0)))
                }
            },
            |seen| !matches!(seen, Ok(None)),
        )
        .await;
    let ready = match drained {
        Ok(Ok(Some(ready))) => ready,
        Ok(Err(err)) => return Err(err),
        Ok(Ok(None)) => unreachable!("the wait answers only once drained or failed"),
        Err(timeout) => bail!(
            "{removed} still in the agent's status {} s after its config file was removed: {timeout}",
            DRAIN_TIMEOUT.as_secs()
        ),
    };
    let drained_after = drain_started.elapsed();
    println!(
        "{removed} drained {} ms after its config file was removed ({ready}/{expected} remote clusters ready).",
        drained_after.as_millis()
    );
    println!("\n$ meshctl status");
    let status = supervise(
        agent.process(),
        "meshctl status",
        &mut meshctl(binaries, &socket, &["status"]),
        DRAIN_TIMEOUT,
    )
    .await?;
    if !status.success() {
        bail!("`meshctl status` failed ({status})");
    }

    // A clean stop: SIGTERM, the agent drains nothing, removes its socket and exits.
    println!(
        "\nStopping meshwork-agent (pid {}) with SIGTERM ...",
        agent.pid()
    );
    agent
        .process()
        .signal(Signal::SIGTERM)
        .context("sending SIGTERM to meshwork-agent")?;
    let stop_started = Instant::now();
    let exited = Wait::new("meshwork-agent to exit after SIGTERM")
        .timeout(STOP_TIMEOUT)
        .every(POLL)
        .until_async(
            || {
                let running = agent.process().is_running();
                async move { running }
            },
            |running| !running,
        )
        .await;
    if exited.is_err() {
        bail!(
            "meshwork-agent still running {} s after SIGTERM; log {}:\n{}",
            STOP_TIMEOUT.as_secs(),
            agent.log().display(),
            agent.log_tail()
        );
    }
    let stopped_after = stop_started.elapsed();
    // The exit status is the lab's to reap; the agent's last acts on a clean stop show instead.
    let log = std::fs::read_to_string(agent.log()).unwrap_or_default();
    if socket.exists() || !log.contains("meshwork-agent stopped") {
        bail!(
            "meshwork-agent exited after SIGTERM without removing its API socket and logging \
             \"meshwork-agent stopped\": not a clean stop; log {}:\n{}",
            agent.log().display(),
            agent.log_tail()
        );
    }
    println!(
        "meshwork-agent stopped cleanly {} ms after SIGTERM (API socket removed, \"meshwork-agent stopped\" logged).",
        stopped_after.as_millis()
    );

    Ok(format!(
        "Demo done: {} remote clusters ready {} ms after the agent started, {removed} drained in {} ms, \
         the agent stopped cleanly in {} ms.",
        clusters.len(),
        ready_after.as_millis(),
        drained_after.as_millis(),
        stopped_after.as_millis()
    ))
}

/// `meshctl --socket SOCKET ARGS…`, its output going to this process's stdout and stderr.
fn meshctl(binaries: &Binaries, socket: &Path, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(&binaries.meshctl);
    command
        .arg("--socket")
        .arg(socket)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

/// `meshctl status --json`, parsed.
async fn status_json(binaries: &Binaries, socket: &Path) -> anyhow::Result<Value> {
    let output = meshctl(binaries, socket, &["status", "--json"])
        .output()
        .await
        .context("running `meshctl status --json`")?;
    if !output.status.success() {
        bail!(
            "`meshctl status --json` failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    serde_json::from_slice(&output.stdout).with_context(|| {
        format!(
            "parsing the output of `meshctl status --json`: {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// Runs `command` (`what`, for messages) to its end while checking that the agent stays up;
/// fails if the agent exits first (with its log tail) or the command outlives `limit` (then
/// it is killed).
async fn supervise(
    agent: &mut LabProcess,
    what: &str,
    command: &mut tokio::process::Command,
    limit: Duration,
) -> anyhow::Result<ExitStatus> {
    let mut child = command
        .spawn()
        .with_context(|| format!("starting `{what}` ({:?})", command.as_std()))?;
    let started = Instant::now();
    let mut ticks = tokio::time::interval(POLL);
    loop {
        tokio::select! {
            status = child.wait() => return status.with_context(|| format!("waiting for `{what}`")),
            _ = ticks.tick() => {
                running(agent, &format!("`{what}`"))?;
                if started.elapsed() >= limit {
                    bail!("`{what}` still running after {} s", limit.as_secs());
                }
            }
        }
    }
}

/// Fails with the agent's log tail when it is no longer running.
fn running(agent: &mut LabProcess, during: &str) -> anyhow::Result<()> {
    let pid = agent.pid();
    agent
        .check_running()
        .with_context(|| format!("meshwork-agent (pid {pid}) exited during {during}"))
}
