//! The demo: Meshwork meshed with itself ([`crate::mesh`]). Each cluster runs its own etcd,
//! `meshwork-apiserver` and one `meshwork-agent` per node; pods are network namespaces whose
//! identities come from their cluster's apiserver. Every remote entry an agent holds was
//! written by a Meshwork apiserver. The act itself is in [`demo_mesh`](crate::demo_mesh);
//! the no-drop proof follows on the same topology.

use std::time::{Duration, Instant};

use anyhow::Context;

use crate::mesh::{Mesh, MeshSpec};
use crate::proof::SceneKind;
use crate::{binaries, demo_mesh};

/// Options of the demo.
#[derive(clap::Args)]
pub struct Args {
    /// Number of clusters (each its own etcd and meshwork-apiserver; at least two, to mesh).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(2..=9))]
    clusters: u32,
    /// Nodes (agents, one pod each) per cluster.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=9))]
    nodes: u32,
    /// Give up when the mesh has not converged after this many seconds.
    #[arg(long, default_value_t = 120)]
    timeout_secs: u64,
    /// Skip the no-drop proof at the end.
    #[arg(long)]
    no_proof: bool,
    /// Run no kvstoremesh: every agent connects to every remote cluster's etcd itself.
    #[arg(long)]
    no_kvstoremesh: bool,
}

/// Runs the demo.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let timeout = Duration::from_secs(args.timeout_secs);
    let spec = MeshSpec {
        clusters: args.clusters,
        nodes: args.nodes,
        kvstoremesh: !args.no_kvstoremesh,
        ..MeshSpec::demo()
    };
    println!(
        "Meshwork demo: {} Meshwork clusters meshed with each other. Each runs its own etcd, \
         meshwork-apiserver{} and {} meshwork-agents (lab network namespaces, pods as namespaces); \
         agents publish their node and pods to their apiserver, which alone writes its etcd{}.\n",
        spec.clusters,
        if spec.kvstoremesh {
            ", kvstoremesh"
        } else {
            ""
        },
        spec.nodes,
        if spec.kvstoremesh {
            "; kvstoremesh caches the other clusters there, so each agent reads every remote \
             from its own cluster's etcd"
        } else {
            ""
        }
    );
    let binaries = binaries::build()?;
    let dir = tempfile::Builder::new()
        .prefix("meshwork-demo-")
        .tempdir()
        .context("creating the demo's temp dir")?;
    let started = Instant::now();
    let outcome = async {
        let mesh = Mesh::start(&binaries, &spec, dir.path(), "1m", &mut |line| {
            println!("  {line}");
        })
        .await?;
        println!();
        for (pod, identity) in mesh.add_pods().await? {
            println!("  {pod:<8} identity {identity} (allocated by its cluster's apiserver)");
        }
        let figures = demo_mesh::run(&binaries, &mesh, started, timeout).await?;
        let per_cluster = 2 + usize::from(spec.kvstoremesh) + spec.nodes as usize;
        let processes = mesh.clusters.len() * per_cluster;
        drop(mesh);
        println!(
            "\nStopped {processes} processes (agents, apiservers, {}etcd) and removed the namespaces.",
            if spec.kvstoremesh { "kvstoremeshes, " } else { "" }
        );
        anyhow::Ok(figures)
    }
    .await;
    let figures = match outcome {
        Ok(figures) => figures,
        Err(err) => {
            let kept = dir.keep();
            eprintln!(
                "Kept {} (agent and apiserver logs, state, clustermesh configs) for inspection.",
                kept.display()
            );
            return Err(err);
        }
    };
    println!(
        "Demo done: {} clusters × {} nodes converged in {} ms, every remote entry written by a \
         Meshwork apiserver; {}/{} cross-cluster connections; {} drained in {} ms.",
        spec.clusters,
        spec.nodes,
        figures.converged.as_millis(),
        figures.connections.0,
        figures.connections.1,
        figures.drained.0,
        figures.drained.1.as_millis(),
    );
    if !args.no_proof {
        Box::pin(proof_step(&binaries)).await?;
    }
    Ok(())
}

/// The no-drop proof on the same topology, with its negative control, figures side by side.
async fn proof_step(binaries: &binaries::Binaries) -> anyhow::Result<()> {
    println!(
        "\nThe no-drop proof on this topology, with WireGuard between the clusters: pod-1-1 \
         streams TCP to pod-2-1 through its BPF endpoint program; cluster-1-node-1's agent \
         restarts while cluster-2's etcd is down, back {} s after the agent.",
        crate::proof::LATE_BY.as_secs()
    );
    let with = Box::pin(crate::proof::run_once(binaries, SceneKind::Mesh, true)).await?;
    let without = Box::pin(crate::proof::run_once(binaries, SceneKind::Mesh, false)).await?;
    println!(
        "{}",
        crate::proof::table::table(Some(&with), Some(&without))
    );
    println!(
        "  (new connections: pod-1-1 → the global service echo, backends only in cluster-2, \
         20/s through socket-LB; the UDP stream: pod-2-1 → pod-1-1, every 5 ms, through the \
         nodes' WireGuard tunnels)"
    );
    let page = crate::proof::timeline::side_by_side(SceneKind::Mesh)?;
    println!(
        "  the restart's timelines (meshctl timeline --svg): {} and {}; side by side: {}",
        crate::proof::timeline::path(SceneKind::Mesh, true).display(),
        crate::proof::timeline::path(SceneKind::Mesh, false).display(),
        page.display()
    );
    Ok(())
}
