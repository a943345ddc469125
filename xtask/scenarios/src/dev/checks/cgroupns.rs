//! The node's cgroup safety check can fail: a node container given the host's cgroup
//! namespace (`docker run --cgroupns host`, no network) must refuse to start before it mounts
//! cgroup2 — so its agent never runs, and no socket-LB hook can attach at the machine's root.

use std::process::Command;

use anyhow::{Context as _, ensure};

use crate::dev::images;

/// What the node's PID 1 says when it refuses.
const REFUSAL: &str = "its cgroup namespace is the host's";

/// Runs a node with the host's cgroup namespace; it must exit non-zero, saying why.
pub fn node_refuses_the_hosts_cgroup_namespace() -> anyhow::Result<()> {
    let out = Command::new("docker")
        .args(["run", "--rm", "--cgroupns", "host", "--network", "none"])
        .args(["--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE"])
        .args(["--security-opt", "seccomp=unconfined"])
        .args(["--security-opt", "apparmor=unconfined"])
        .args(["--tmpfs", "/run"])
        .arg(images::name("agent"))
        .args(["--", "--cluster-name=refused", "--cluster-id=9"])
        .output()
        .context("docker run of a node with the host's cgroup namespace")?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        !out.status.success() && said.contains(REFUSAL),
        "a node with the host's cgroup namespace did not refuse ({}): {said}",
        out.status
    );
    println!(
        "  refused ({}): {}",
        out.status,
        said.lines()
            .find(|l| l.contains(REFUSAL))
            .unwrap_or_default()
            .trim()
    );
    Ok(())
}
