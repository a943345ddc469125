//! Cluster-2 cut off the shared network (`docker network disconnect`) and put back.
//!
//! Agents read every remote through their own cluster's kvstoremesh cache, so a partition
//! reaches them only as a stale cache: they keep every remote entry (nothing drained) and a
//! restarted agent syncs from the cache without its breaker. What sees the partition is
//! kvstoremesh: cluster-1's is restarted while cluster-2 is away, and its readiness breaker
//! (`--per-cluster-ready-timeout`: a remote that did not connect in time is not waited for)
//! trips exactly once, for cluster-2; it serves the cache it adopted meanwhile. After the
//! reconnect, both kvstoremeshes have their remote again, every agent is ready, the cache
//! holds what it held before, and a TCP stream between the clusters that was open across
//! it all ends without a reset or a lost number.

use std::time::{Duration, Instant};

use anyhow::ensure;
use meshwork_lab::wait::Wait;

use super::pods::Pods;
use crate::dev::compose::{self, NODES};
use crate::dev::stack::{node_status, wait_converged};
use crate::dev::stream::Stream;

/// Cluster-2's containers on the shared network, with their addresses there.
const CLUSTER_2_ON_MESH: [(&str, &str); 4] = [
    ("c2-etcd", "172.30.0.22"),
    ("c2-kvstoremesh", "172.30.0.24"),
    ("c2-node-1", "172.30.0.121"),
    ("c2-node-2", "172.30.0.122"),
];
/// What kvstoremesh logs when its readiness gives up on remotes.
const BREAKER_LINE: &str = "ready without these remote clusters";
/// How long the reconnected mesh may take to converge (kvstoremesh's reconnect backoff).
const RECONVERGE_TIMEOUT: Duration = Duration::from_secs(90);

/// kvstoremesh `service`'s status of its remote: (ready, entries by kind).
fn cached(service: &str) -> anyhow::Result<(bool, serde_json::Value)> {
    let status = compose::exec_json(
        service,
        &[
            "meshctl",
            "--kvstoremesh",
            "127.0.0.1:9889",
            "status",
            "--json",
        ],
    )?;
    let remote = &status["clustermesh"]["clusters"][0];
    Ok((
        remote["ready"].as_bool().unwrap_or(false),
        remote["entries"].clone(),
    ))
}

/// Whether `node`'s pinned ipcache map holds `ip`.
fn ipcache_holds(node: &str, ip: &str) -> anyhow::Result<bool> {
    let listed = compose::exec(node, &["meshctl", "bpf", "ipcache", "list"])?;
    Ok(listed
        .lines()
        .any(|line| line.split_whitespace().next() == Some(&format!("{ip}/32"))))
}

/// Every agent still has its remote ready and the other cluster's pod in its map.
fn agents_hold_everything(pods: &Pods) -> anyhow::Result<()> {
    for node in NODES {
        let status = node_status(node)?;
        let other = if node.starts_with("c1") {
            &pods.b.ip
        } else {
            &pods.a.ip
        };
        ensure!(
            status["ready"] == status["total"] && ipcache_holds(node, other)?,
            "{node} lost its remote: {status}, {other} in its map: {}",
            ipcache_holds(node, other)?
        );
    }
    Ok(())
}

/// Whether the container of `service` is healthy.
fn healthy(service: &str) -> bool {
    compose::docker(&[
        "inspect",
        "--format",
        "{{.State.Health.Status}}",
        &compose::container(service),
    ])
    .is_ok_and(|status| status.trim() == "healthy")
}

/// The check.
pub fn run(pods: &Pods) -> anyhow::Result<()> {
    let (_, entries_before) = cached("c1-kvstoremesh")?;
    let stream = Stream::start(&pods.a, &pods.b)?;
    stream.wait_flowing(0, 200, Duration::from_secs(20))?;
    let mesh = compose::network("mesh");
    for (service, _) in CLUSTER_2_ON_MESH {
        compose::docker(&["network", "disconnect", &mesh, &compose::container(service)])?;
    }
    println!("  cluster-2 disconnected from {mesh}");
    let cut = during_partition(pods);
    for (service, ip) in CLUSTER_2_ON_MESH {
        compose::docker(&[
            "network",
            "connect",
            "--ip",
            ip,
            &mesh,
            &compose::container(service),
        ])?;
    }
    let reconnected = Instant::now();
    println!("  cluster-2 reconnected");
    let breaker_trips = cut?;
    let before_reconnect = stream.received();
    Wait::new("both kvstoremeshes to have their remote ready again")
        .timeout(RECONVERGE_TIMEOUT)
        .every(Duration::from_millis(500))
        .until(
            || {
                ["c1-kvstoremesh", "c2-kvstoremesh"]
                    .iter()
                    .all(|s| cached(s).is_ok_and(|(ready, _)| ready))
            },
            |ready| *ready,
        )?;
    wait_converged(RECONVERGE_TIMEOUT)?;
    stream.wait_flowing(before_reconnect, 500, RECONVERGE_TIMEOUT)?;
    let reconverged = reconnected.elapsed();
    agents_hold_everything(pods)?;
    let (_, entries_after) = cached("c1-kvstoremesh")?;
    ensure!(
        entries_after == entries_before,
        "cluster-1's cache of cluster-2 changed: {entries_before} before, {entries_after} after"
    );
    let report = stream.finish()?;
    println!(
        "  after the reconnect: converged in {:.1} s; cache {entries_after} as before; stream \
         received {} of {}, resets {}, longest pause {} ms (the partition)",
        reconverged.as_secs_f64(),
        report.received,
        report.sent,
        report.resets,
        report.longest_pause_ms
    );
    ensure!(
        report.resets == 0 && report.received == report.sent,
        "the stream across the partition lost numbers or was reset: {report:?}"
    );
    ensure!(
        breaker_trips == 1,
        "cluster-1's kvstoremesh readiness gave up {breaker_trips} times, not once"
    );
    Ok(())
}

/// While cluster-2 is cut off: every agent keeps its remote; cluster-1's kvstoremesh is
/// restarted and becomes ready by its breaker; an agent restarted meanwhile syncs from the
/// cache without its own. How many times the kvstoremesh breaker tripped.
fn during_partition(pods: &Pods) -> anyhow::Result<usize> {
    agents_hold_everything(pods)?;
    let restarted_at = unix_now();
    compose::docker(&[
        "restart",
        "--time",
        "10",
        &compose::container("c1-kvstoremesh"),
    ])?;
    Wait::new("cluster-1's kvstoremesh ready again (by its breaker: cluster-2 is away)")
        .timeout(Duration::from_secs(60))
        .every(Duration::from_millis(250))
        .until(|| healthy("c1-kvstoremesh"), |ok| *ok)?;
    let log = compose::logs_since("c1-kvstoremesh", &restarted_at)?;
    let trips: Vec<&str> = log.lines().filter(|l| l.contains(BREAKER_LINE)).collect();
    ensure!(
        trips.iter().all(|line| line.contains("cluster-2")),
        "kvstoremesh gave up on something else than cluster-2: {trips:?}"
    );
    println!(
        "  cluster-1's kvstoremesh restarted while cluster-2 is away: its readiness breaker \
         tripped {} time(s): {}",
        trips.len(),
        trips.first().map_or("", |l| l.trim())
    );
    // An agent restarted now reads cluster-2 from the cache: synced, no breaker.
    compose::exec("c1-node-2", &["meshwork-devnode", "restart-agent"])?;
    wait_converged(Duration::from_secs(60))?;
    let timeline = compose::exec("c1-node-2", &["meshctl", "timeline", "--json"])?;
    ensure!(
        !timeline.contains("\"wait_end\":\"breaker\""),
        "c1-node-2's agent restarted during the partition and its breaker fired"
    );
    println!("  c1-node-2's agent restarted meanwhile: synced from the cache, no breaker");
    agents_hold_everything(pods)?;
    println!("  every agent kept its remote cluster and the other cluster's pod meanwhile");
    Ok(trips.len())
}

/// Now, as `docker logs --since` takes it (Unix seconds).
fn unix_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!("{}.{:09}", now.as_secs(), now.subsec_nanos())
}
