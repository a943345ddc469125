//! `cargo xtask dev up|status|down`: the stack started from fresh images and waited for until
//! every node's agent has every remote cluster ready, its state shown, and everything it made
//! removed again.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use meshwork_lab::wait::Wait;

use super::compose::{self, NODES};
use super::images;

/// How long the agents may take to have every remote cluster ready once compose is up.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(120);

/// Builds the images, starts the stack and waits until it converged; prints `meshctl
/// status` of every node.
pub fn up() -> anyhow::Result<()> {
    images::build_all()?;
    let started = Instant::now();
    compose::up()?;
    let took = wait_converged(CONVERGE_TIMEOUT)?;
    println!(
        "\nthe stack is up: compose {:.1} s, every agent 1/1 remote clusters ready {:.1} s later\n",
        (started.elapsed() - took).as_secs_f64(),
        took.as_secs_f64()
    );
    print_nodes()
}

/// Waits (at most `timeout`) until every node's agent has every remote cluster ready;
/// how long that took.
pub fn wait_converged(timeout: Duration) -> anyhow::Result<Duration> {
    let started = Instant::now();
    for node in NODES {
        let left = timeout.saturating_sub(started.elapsed());
        Wait::new(format!("{node}'s agent: every remote cluster ready"))
            .timeout(left)
            .every(Duration::from_millis(250))
            .until(
                || node_status(node).ok(),
                |status| {
                    status
                        .as_ref()
                        .is_some_and(|s| s["total"].as_u64() > Some(0) && s["ready"] == s["total"])
                },
            )
            .with_context(|| {
                format!("{node}: {}", tail(&compose::logs(node).unwrap_or_default()))
            })?;
    }
    Ok(started.elapsed())
}

/// `meshwork-devnode status` of `node`: remote clusters ready and total, drops, ipcache
/// entries, endpoints, WireGuard peers.
pub fn node_status(node: &str) -> anyhow::Result<serde_json::Value> {
    compose::exec_json(node, &["meshwork-devnode", "status"])
}

/// The containers, then `meshctl status` of every node that runs.
pub fn status() -> anyhow::Result<()> {
    compose::run_shown(&mut compose::compose(&["ps"]))?;
    print_nodes()
}

/// `meshctl status` from inside every node's container.
fn print_nodes() -> anyhow::Result<()> {
    for node in NODES {
        println!("==> {node}: meshctl status");
        match compose::exec_output(node, &["meshctl", "status"]) {
            Ok(out) => {
                print!("{}", String::from_utf8_lossy(&out.stdout));
                eprint!("{}", String::from_utf8_lossy(&out.stderr));
            }
            Err(err) => println!("  (not running: {err:#})"),
        }
    }
    Ok(())
}

/// Removes every container, network and volume of the stack, and (unless `keep_images`)
/// its images; fails if a container of the stack is left.
pub fn down(keep_images: bool) -> anyhow::Result<()> {
    let downed = compose::down();
    if !keep_images {
        let removed = images::remove_all();
        println!("removed {removed} image(s) labelled {}", images::LABEL);
    }
    downed?;
    let left = compose::containers()?;
    if !left.is_empty() {
        bail!("containers of the stack are left: {}", left.join(", "));
    }
    println!("the stack is down: no container, network or volume of it is left");
    Ok(())
}

/// The last lines of a log.
pub fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}
