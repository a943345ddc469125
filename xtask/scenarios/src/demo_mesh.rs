//! The demo's main act on [`Mesh`]: `meshctl status --wait` shows one agent converge on the
//! other clusters, the table shows what each apiserver wrote to its etcd, every pod connects
//! to every pod of the other clusters through the BPF endpoint programs, and one remote is
//! removed from one agent's config and drained.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use meshwork_lab::etcd::EtcdServer;
use meshwork_lab::wait::Wait;
use serde_json::Value;

use crate::binaries::Binaries;
use crate::mesh::{Mesh, MeshNode};
use crate::sockets;

/// How often an agent is checked on.
const POLL: Duration = Duration::from_millis(20);
/// How long `meshctl status --wait` may run beyond its own `--timeout`.
const MESHCTL_GRACE: Duration = Duration::from_secs(15);
/// How long the agent may take to drop a removed cluster.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// What the act measured, for the closing line.
pub struct Figures {
    /// From the first etcd's start until every agent held every remote pod.
    pub converged: Duration,
    /// Cross-cluster connections that succeeded, and how many were tried.
    pub connections: (usize, usize),
    /// The drained cluster and how long the drain took.
    pub drained: (String, Duration),
}

/// Runs the act on a started mesh with its pods added.
pub async fn run(
    binaries: &Binaries,
    mesh: &Mesh,
    started: Instant,
    timeout: Duration,
) -> anyhow::Result<Figures> {
    let first = &mesh.clusters[0].nodes[0];
    let socket = first.agent.socket();
    let wait_timeout = format!("{}s", timeout.as_secs());
    println!(
        "\n$ meshctl status --wait --timeout {wait_timeout}    # on {}",
        first.addrs.name
    );
    let status = meshctl(
        binaries,
        &socket,
        &["status", "--wait", "--timeout", &wait_timeout],
        timeout + MESHCTL_GRACE,
    )
    .await?;
    if !status.success() {
        bail!(
            "`meshctl status --wait` failed ({status}); agent log:\n{}",
            first.agent.log_tail()
        );
    }
    if let Some((options, _)) = &mesh.clusters[0].kvstoremesh {
        let addr = options.api_addr();
        println!(
            "\n$ meshctl --kvstoremesh {addr} status    # {}'s kvstoremesh",
            mesh.clusters[0].name
        );
        let status = meshctl(
            binaries,
            &socket,
            &["--kvstoremesh", &addr, "status"],
            MESHCTL_GRACE,
        )
        .await?;
        if !status.success() {
            bail!("`meshctl --kvstoremesh {addr} status` failed ({status})");
        }
    }
    mesh.wait_converged(timeout).await?;
    let converged = started.elapsed();
    println!(
        "\nEvery agent holds every remote pod {} ms after the first etcd started (a fresh \
         apiserver writes its sync canaries only after --initial-sync-timeout={}s: it cannot \
         know which agents will come).",
        converged.as_millis(),
        mesh.spec.initial_sync_timeout.as_secs()
    );

    println!(
        "\nWhat each meshwork-apiserver wrote to its cluster's etcd (the only writer of its state){}:",
        if mesh.spec.kvstoremesh {
            ", and what its kvstoremesh cached there"
        } else {
            ""
        }
    );
    for cluster in &mesh.clusters {
        println!("  {:<10} {}", cluster.name, written_keys(&cluster.etcd)?);
    }
    etcd_connections(mesh)?;

    let connections = connectivity(mesh)?;
    let drained = drain(binaries, mesh).await?;
    Ok(Figures {
        converged,
        connections,
        drained,
    })
}

/// Counts the keys under `cilium/` by kind.
fn written_keys(etcd: &EtcdServer) -> anyhow::Result<String> {
    let keys = etcd
        .ctl(&["get", "--prefix", "cilium/", "--keys-only"])
        .context("listing the cluster's keys")?;
    let count = |prefix: &str| keys.lines().filter(|k| k.starts_with(prefix)).count();
    Ok(format!(
        "nodes {}, ipcache entries {}, identities {}, sync canaries {}, cluster config {}, heartbeat {}",
        count("cilium/state/nodes/v1/"),
        count("cilium/state/ip/v1/"),
        count("cilium/state/identities/v1/id/"),
        count("cilium/synced/"),
        count("cilium/cluster-config/"),
        count("cilium/.heartbeat"),
    ) + &match count("cilium/cache/") {
        0 => String::new(),
        cached => format!("; cached remote entries {cached}"),
    })
}

/// Prints, per agent, which etcd servers it holds established connections to (its sockets in
/// /proc); through kvstoremesh that must be its own cluster's alone.
fn etcd_connections(mesh: &Mesh) -> anyhow::Result<()> {
    let etcds: Vec<(u16, &str)> = mesh
        .clusters
        .iter()
        .map(|c| (c.etcd.client_port(), c.name.as_str()))
        .collect();
    let ports: Vec<u16> = etcds.iter().map(|(port, _)| *port).collect();
    println!("\netcd connections each agent holds (its established sockets, from /proc):");
    for (cluster, node) in mesh.nodes() {
        let pid = node.agent.pid().context("the agent runs")?;
        let held = sockets::connections_to(pid, &ports)?;
        let names: Vec<&str> = etcds
            .iter()
            .filter(|(port, _)| held.servers.contains(port))
            .map(|(_, name)| *name)
            .collect();
        println!(
            "  {:<18} {} etcd server{} ({}), {} TCP connection{}",
            node.addrs.name,
            names.len(),
            if names.len() == 1 { "" } else { "s" },
            names.join(", "),
            held.connections,
            if held.connections == 1 { "" } else { "s" },
        );
        if mesh.spec.kvstoremesh && names != [cluster.name.as_str()] {
            bail!(
                "{} reads through kvstoremesh but is connected to {names:?}, not only {}'s etcd",
                node.addrs.name,
                cluster.name
            );
        }
    }
    Ok(())
}

/// Every pod opens a TCP connection to every pod of the other clusters; prints a matrix.
fn connectivity(mesh: &Mesh) -> anyhow::Result<(usize, usize)> {
    let nodes: Vec<&MeshNode> = mesh.nodes().map(|(_, n)| n).collect();
    println!(
        "\nTCP connects between pods of different clusters, through both pods' BPF endpoint programs:"
    );
    print!("  {:<10}", "from \\ to");
    for to in &nodes {
        print!(" {:>8}", to.addrs.pod_name);
    }
    println!();
    let (mut ok, mut tried) = (0, 0);
    let mut failures = Vec::new();
    for from in &nodes {
        print!("  {:<10}", from.addrs.pod_name);
        for to in &nodes {
            if from.addrs.cluster_id == to.addrs.cluster_id {
                print!(" {:>8}", "·");
                continue;
            }
            tried += 1;
            match mesh.probe(&from.addrs, &to.addrs) {
                Ok(took) => {
                    ok += 1;
                    print!(" {:>8}", format!("✔ {:.1}ms", took.as_secs_f64() * 1e3));
                }
                Err(err) => {
                    print!(" {:>8}", "✖");
                    failures.push(format!("{err:#}"));
                }
            }
        }
        println!();
    }
    if !failures.is_empty() {
        bail!(
            "{} of {tried} connections failed:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
    Ok((ok, tried))
}

/// Removes the last cluster's file from the first agent's config and waits for the drain:
/// its status loses the cluster and its map the cluster's pods; a probe then fails.
async fn drain(binaries: &Binaries, mesh: &Mesh) -> anyhow::Result<(String, Duration)> {
    let first = &mesh.clusters[0].nodes[0];
    let removed = mesh.clusters.last().context("a mesh has clusters")?;
    if removed.id == mesh.clusters[0].id {
        return Ok((String::new(), Duration::ZERO));
    }
    let gone_pods: Vec<&str> = removed
        .nodes
        .iter()
        .map(|n| n.addrs.pod_ip.as_str())
        .collect();
    let expected = mesh.clusters.len() as u64 - 2;
    let file = first.agent.clustermesh_config().join(&removed.name);
    std::fs::remove_file(&file).with_context(|| format!("removing {}", file.display()))?;
    let drain_started = Instant::now();
    println!("\n$ rm {}    # on {}", file.display(), first.addrs.name);
    let socket = first.agent.socket();
    Wait::new(format!(
        "{} drained from {}",
        removed.name, first.addrs.name
    ))
    .timeout(DRAIN_TIMEOUT)
    .every(POLL)
    .until_async(
        || async {
            let total = status_json(binaries, &socket)
                .await
                .ok()
                .and_then(|s| s["clustermesh"]["total"].as_u64());
            total == Some(expected) && first.agent.ipcache_holds(&gone_pods).ok() == Some(0)
        },
        |drained| *drained,
    )
    .await
    .with_context(|| first.agent.log_tail())?;
    let took = drain_started.elapsed();
    println!(
        "{} drained {} ms after its file was removed: gone from the status and its {} pods from the ipcache map.",
        removed.name,
        took.as_millis(),
        gone_pods.len()
    );
    let to = &removed.nodes[0].addrs;
    match mesh.probe(&first.addrs, to) {
        Ok(_) => bail!(
            "{} still reaches {} after the drain",
            first.addrs.pod_name,
            to.pod_name
        ),
        Err(err) => println!(
            "{} → {} now fails, as it must (its endpoint program drops unknown destinations): {err:#}",
            first.addrs.pod_name, to.pod_name
        ),
    }
    Ok((removed.name.clone(), took))
}

/// `meshctl --socket SOCKET ARGS…` with its output on this process's, killed after `limit`.
async fn meshctl(
    binaries: &Binaries,
    socket: &Path,
    args: &[&str],
    limit: Duration,
) -> anyhow::Result<ExitStatus> {
    let mut child = command(binaries, socket, args)
        .spawn()
        .with_context(|| format!("starting meshctl {}", args.join(" ")))?;
    match tokio::time::timeout(limit, child.wait()).await {
        Ok(status) => status.context("waiting for meshctl"),
        Err(_) => bail!(
            "meshctl {} still running after {} s",
            args.join(" "),
            limit.as_secs()
        ),
    }
}

fn command(binaries: &Binaries, socket: &Path, args: &[&str]) -> tokio::process::Command {
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
    let output = command(binaries, socket, &["status", "--json"])
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
    serde_json::from_slice(&output.stdout).context("parsing `meshctl status --json`")
}
