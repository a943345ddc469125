//! `demo --in-process`: the loaded clusters watched by the canary-gated watch stores an agent
//! runs per remote cluster, in this process, with live per-cluster progress and sync times.

use std::time::{Duration, Instant};

use anyhow::bail;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use meshwork_kvstore::EtcdBackend;
use meshwork_lab::cilium::Cluster;
use meshwork_lab::wait::Wait;
use tokio_util::sync::CancellationToken;

use crate::mesh_stores::ClusterStores;

/// How often the progress bars are updated.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(20);

/// Watches every cluster through `backends` until all synced or `timeout`; prints the
/// per-cluster table and returns the closing summary line.
pub async fn run(
    clusters: &[Cluster],
    backends: &[EtcdBackend],
    timeout: Duration,
) -> anyhow::Result<String> {
    println!("\nWatching every cluster (nodes, services, identities, ipcache):");
    let cancel = CancellationToken::new();
    let started = Instant::now();
    let stores: Vec<ClusterStores> = clusters
        .iter()
        .zip(backends)
        .map(|(cluster, backend)| ClusterStores::start(backend, &cluster.name, cluster.id, &cancel))
        .collect();
    let synced_after = show_progress(clusters, &stores, timeout).await;
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
    if !all_synced {
        bail!("not every cluster synced within {} s", timeout.as_secs());
    }
    Ok(format!(
        "All {} clusters synced in {} ms.",
        clusters.len(),
        total.as_millis()
    ))
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
    // Updates the bars on every look; a timeout is not an error here: the bars and the table
    // show which clusters did not sync, and the caller fails on them.
    let _ = Wait::new("every cluster synced")
        .timeout(timeout)
        .every(PROGRESS_INTERVAL)
        .until_async(
            || {
                for (i, store) in stores.iter().enumerate() {
                    progress[i].set_position(store.entries());
                    if synced_after[i].is_none() && store.synced() {
                        synced_after[i] = Some(started.elapsed());
                        progress[i].finish_with_message(format!(
                            "synced in {} ms",
                            started.elapsed().as_millis()
                        ));
                    } else if synced_after[i].is_none() && store.entries() > 0 {
                        progress[i].set_message("listing");
                    }
                }
                let all = synced_after.iter().all(Option::is_some);
                async move { all }
            },
            |all| *all,
        )
        .await;
    for bar in &progress {
        if !bar.is_finished() {
            bar.abandon_with_message("not synced");
        }
    }
    synced_after
}
