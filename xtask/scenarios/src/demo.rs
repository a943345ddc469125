//! The demo: three etcd "clusters" from the lab, loaded with Cilium-format state, synced by
//! canary-gated watch stores, with live per-cluster progress and sync times.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use meshwork_agent_core::kvstore::{EtcdBackend, EtcdConfig};
use meshwork_lab::etcd::{EtcdOptions, EtcdServer};
use tokio_util::sync::CancellationToken;

use meshwork_lab::cilium::{Cluster, Sizes};

use crate::load;
use crate::mesh_stores::ClusterStores;

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
    /// Give up when the stores have not synced after this many seconds.
    #[arg(long, default_value_t = 120)]
    timeout_secs: u64,
}

/// Runs the demo.
pub async fn run(args: Args) -> anyhow::Result<()> {
    println!(
        "Meshwork demo: {} etcd clusters in Cilium's kvstore layout, synced by canary-gated watch stores\n",
        args.clusters
    );
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

    let mut servers = Vec::new();
    let mut backends = Vec::new();
    for cluster in &clusters {
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
        let config = EtcdConfig::new([server.endpoint()]);
        backends.push(EtcdBackend::connect(&config, Duration::from_secs(10)).await?);
        servers.push(server);
    }

    println!();
    for (cluster, backend) in clusters.iter().zip(&backends) {
        let started = Instant::now();
        let keys = load::load(backend, cluster).await?;
        println!(
            "  {:<10} loaded {keys} keys ({} nodes, {} services, {} identities, {} ipcache) and its sync canaries in {} ms",
            cluster.name,
            sizes.nodes,
            sizes.services,
            sizes.identities,
            sizes.ipcache,
            started.elapsed().as_millis()
        );
    }

    println!("\nWatching every cluster (nodes, services, identities, ipcache):");
    let cancel = CancellationToken::new();
    let started = Instant::now();
    let stores: Vec<ClusterStores> = clusters
        .iter()
        .zip(&backends)
        .map(|(cluster, backend)| ClusterStores::start(backend, &cluster.name, cluster.id, &cancel))
        .collect();
    let synced_after =
        show_progress(&clusters, &stores, Duration::from_secs(args.timeout_secs)).await;
    let total = started.elapsed();

    println!(
        "\n  {:<10} {:>8} {:>9} {:>11} {:>8} {:>9} {:>10}",
        "cluster", "nodes", "services", "identities", "ipcache", "rejected", "synced in"
    );
    for ((cluster, store), synced) in clusters.iter().zip(&stores).zip(&synced_after) {
        let counts: Vec<u64> = store.statuses.iter().map(|(_, s)| s.entries()).collect();
        println!(
            "  {:<10} {:>8} {:>9} {:>11} {:>8} {:>9} {:>7} ms",
            cluster.name,
            counts[0],
            counts[1],
            counts[2],
            counts[3],
            store.decode_errors(),
            synced.map_or_else(|| "-".to_owned(), |d| d.as_millis().to_string())
        );
    }
    let all_synced = synced_after.iter().all(Option::is_some);

    cancel.cancel();
    for store in stores {
        store.stopped().await;
    }
    let count = servers.len();
    drop(servers);
    println!("\nStopped {count} etcd servers and removed their data.");
    if !all_synced {
        bail!("not every cluster synced within {} s", args.timeout_secs);
    }
    println!(
        "All {} clusters synced in {} ms.",
        clusters.len(),
        total.as_millis()
    );
    Ok(())
}

/// Shows one progress bar per cluster until every cluster synced or `timeout`; returns when
/// each cluster synced, relative to the start.
async fn show_progress(
    clusters: &[Cluster],
    stores: &[ClusterStores],
    timeout: Duration,
) -> Vec<Option<Duration>> {
    let bars = MultiProgress::new();
    let style = ProgressStyle::with_template("  {prefix:<10} [{bar:40}] {pos:>6}/{len:6} {msg}")
        .expect("a valid template")
        .progress_chars("=> ");
    let progress: Vec<ProgressBar> = clusters
        .iter()
        .map(|cluster| {
            let s = cluster.sizes;
            let bar = bars.add(ProgressBar::new(u64::from(
                s.nodes + s.services + s.identities + s.ipcache,
            )));
            bar.set_style(style.clone());
            bar.set_prefix(cluster.name.clone());
            bar.set_message("waiting for canaries");
            bar
        })
        .collect();
    let started = Instant::now();
    let mut synced_after = vec![None; stores.len()];
    while synced_after.iter().any(Option::is_none) && started.elapsed() < timeout {
        for (i, store) in stores.iter().enumerate() {
            progress[i].set_position(store.entries());
            if synced_after[i].is_none() && store.synced() {
                synced_after[i] = Some(started.elapsed());
                progress[i]
                    .finish_with_message(format!("synced in {} ms", started.elapsed().as_millis()));
            } else if synced_after[i].is_none() && store.entries() > 0 {
                progress[i].set_message("listing");
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for bar in &progress {
        if !bar.is_finished() {
            bar.abandon_with_message("not synced");
        }
    }
    synced_after
}
