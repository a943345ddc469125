//! The demo: three etcd "clusters" from the lab, loaded with Cilium-format state, watched by a
//! real `meshwork-agent` whose convergence, drain and stop `meshctl status` shows
//! ([`demo_agent`](crate::demo_agent)); or, with `--in-process`, by the canary-gated watch
//! stores in this process ([`demo_stores`](crate::demo_stores)).

use std::time::{Duration, Instant};

use anyhow::Context;
use meshwork_kvstore::EtcdBackend;
use meshwork_lab::cilium::{Cluster, Sizes};
use meshwork_lab::etcd::{EtcdOptions, EtcdServer};

use crate::{binaries, demo_agent, demo_stores, load};

/// Options of the demo.
#[derive(clap::Args)]
pub struct Args {
    /// Number of etcd clusters.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=16))]
    clusters: u32,
    /// Nodes per cluster.
    #[arg(long, default_value_t = 50)]
    nodes: u32,
    /// Global services per cluster.
    #[arg(long, default_value_t = 20)]
    services: u32,
    /// Identities per cluster.
    #[arg(long, default_value_t = 500)]
    identities: u32,
    /// ipcache entries per cluster (at most 65536).
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    ipcache: u32,
    /// Give up when the clusters are not all synced (ready) after this many seconds.
    #[arg(long, default_value_t = 120)]
    timeout_secs: u64,
    /// Watch the clusters with the watch stores in this process instead of running
    /// `meshwork-agent` and `meshctl`.
    #[arg(long)]
    in_process: bool,
}

/// Runs the demo.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let timeout = Duration::from_secs(args.timeout_secs);
    let binaries = if args.in_process {
        println!(
            "Meshwork demo: {} etcd clusters in Cilium's kvstore layout, synced by canary-gated watch stores\n",
            args.clusters
        );
        None
    } else {
        println!(
            "Meshwork demo: meshwork-agent against {} etcd clusters in Cilium's kvstore layout\n",
            args.clusters
        );
        Some(binaries::build()?)
    };
    let sizes = Sizes {
        nodes: args.nodes,
        services: args.services,
        identities: args.identities,
        ipcache: args.ipcache,
    };
    let clusters: Vec<Cluster> = (1..=args.clusters)
        .map(|id| Cluster {
            name: format!("cluster-{id}"),
            id,
            sizes,
        })
        .collect();

    let (servers, backends) = start_and_load(&clusters).await?;
    let outcome = match &binaries {
        None => demo_stores::run(&clusters, &backends, timeout).await,
        Some(binaries) => {
            drop(backends);
            demo_agent::run(binaries, &clusters, &servers, timeout).await
        }
    };
    let count = servers.len();
    drop(servers);
    println!("\nStopped {count} etcd servers and removed their data.");
    println!("{}", outcome?);
    if let Some(binaries) = &binaries {
        Box::pin(proof_step(binaries)).await?;
    }
    Ok(())
}

/// The no-drop proof with its negative control, figures side by side.
async fn proof_step(binaries: &binaries::Binaries) -> anyhow::Result<()> {
    println!(
        "\nThe no-drop proof: pod A streams TCP to pod B through A's BPF endpoint program; A's \
         agent restarts while cluster B's state arrives {} s late.",
        crate::proof::LATE_BY.as_secs()
    );
    let with = Box::pin(crate::proof::run_once(binaries, true)).await?;
    let without = Box::pin(crate::proof::run_once(binaries, false)).await?;
    println!(
        "  {:<58} {:>6} {:>12}\n  {:<58} {:>6} {:>12}\n  {:<58} {:>6} {:>12}",
        "",
        "drops",
        "stream gaps",
        "with the bounded wait (default 1m)",
        with.drops,
        with.stream.gaps + with.stream.resets,
        "without it (--clustermesh-ip-identities-sync-timeout=0s)",
        without.drops,
        without.stream.gaps + without.stream.resets,
    );
    Ok(())
}

/// Starts one etcd server per cluster and loads its state and canaries, one line each.
async fn start_and_load(
    clusters: &[Cluster],
) -> anyhow::Result<(Vec<EtcdServer>, Vec<EtcdBackend>)> {
    let mut servers = Vec::new();
    let mut backends = Vec::new();
    for cluster in clusters {
        let server = EtcdServer::start_with(EtcdOptions {
            max_txn_ops: Some(1000),
            name: Some(cluster.name.clone()),
            ..EtcdOptions::default()
        })
        .with_context(|| format!("starting etcd for {}", cluster.name))?;
        println!(
            "  {:<10} etcd {} (pid {})",
            cluster.name,
            server.endpoint(),
            server.pid().unwrap_or(0)
        );
        let backend = load::connect(&server.endpoint())
            .await
            .with_context(|| format!("connecting to {}'s etcd", cluster.name))?;
        backends.push(backend);
        servers.push(server);
    }

    println!();
    for (cluster, backend) in clusters.iter().zip(&backends) {
        let started = Instant::now();
        let keys = load::load(backend, cluster)
            .await
            .with_context(|| format!("loading {}'s state", cluster.name))?;
        let s = cluster.sizes;
        println!(
            "  {:<10} loaded {keys} keys ({} nodes, {} services, {} identities, {} ipcache) and its sync canaries in {} ms",
            cluster.name,
            s.nodes,
            s.services,
            s.identities,
            s.ipcache,
            started.elapsed().as_millis()
        );
    }
    Ok((servers, backends))
}
