//! `cargo xtask bench kvstore`: ipcache entries listed and decoded through the watch store
//! vs the raw paginated range read of the same keys (etcd-client, no decode), same etcd, same
//! run, several rounds; `ratio=` is the median of the per-round paired ratios.

use std::time::{Duration, Instant};

use anyhow::Context as _;

use meshwork_kvstore::{EtcdBackend, WatchStore, WatchStoreOptions, etcd::DEFAULT_PAGE_SIZE, keys};
use meshwork_lab::cilium::{Cluster, Sizes};
use meshwork_lab::etcd::{EtcdOptions, EtcdServer};
use meshwork_types::IpCacheDecoder;
use tokio_util::sync::CancellationToken;

use crate::floor;
use crate::measure::{Rounds, back_to_back, ms, odd_rounds, peak_rss_mib};

const GOAL: f64 = 1.30;

/// Options of the kvstore benchmark.
#[derive(clap::Args)]
pub struct Args {
    /// ipcache entries.
    #[arg(long, default_value_t = 100_000)]
    entries: u32,
    /// Rounds (odd), each the floor and the store back to back; `ratio=` is the median of
    /// the per-round ratios.
    #[arg(long, default_value_t = 5, value_parser = odd_rounds)]
    rounds: usize,
    /// Keys per list page, for both the floor and the store.
    #[arg(long, default_value_t = DEFAULT_PAGE_SIZE)]
    page_size: i64,
}

/// Runs the benchmark and prints its table and the closing `ratio=` line.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let server = EtcdServer::start_with(EtcdOptions {
        max_txn_ops: Some(10_000),
        data_in_memory: true,
        ..EtcdOptions::default()
    })?;
    let backend = crate::load::connect(&server.endpoint()).await?;
    let cluster = Cluster {
        name: "bench".to_owned(),
        id: 1,
        sizes: Sizes {
            nodes: 100,
            services: 0,
            identities: 1000,
            ipcache: args.entries,
        },
    };
    let pairs: Vec<_> = cluster
        .state()
        .into_iter()
        .filter(|(key, _)| key.starts_with(keys::IPCACHE_PREFIX))
        .collect();
    let bytes: usize = pairs.iter().map(|(k, v)| k.len() + v.len()).sum();
    backend.put_many(pairs, 5000).await?;
    let prefix = keys::with_trailing_slash(keys::IPCACHE_DEFAULT_PREFIX);
    println!(
        "kvstore benchmark: {} ipcache entries ({:.1} MiB), page size {}, {} rounds",
        args.entries,
        bytes as f64 / (1024.0 * 1024.0),
        args.page_size,
        args.rounds
    );

    let mut rounds = Rounds::default();
    for round in 0..args.rounds {
        let (f, s) = back_to_back(
            round,
            || raw_list(&backend, &prefix, args.page_size, args.entries),
            || store_list(&backend, &prefix, args.page_size, args.entries),
        )
        .await?;
        let ratio = s.as_secs_f64() / f.as_secs_f64();
        println!(
            "  round {}: raw range read {:>7.1} ms   watch store list+decode {:>7.1} ms   ratio {ratio:.2}",
            round + 1,
            ms(f),
            ms(s),
        );
        rounds.push(ratio, (f, s));
    }
    let (ratio, &(floor, store)) = rounds.median().context("no rounds")?;
    println!();
    println!(
        "  {:<42} {:>10} {:>12}",
        "median round (median ratio)", "ms", "entries/s"
    );
    println!(
        "  {:<42} {:>10.1} {:>12.0}",
        "floor: raw paginated range read (no decode)",
        ms(floor),
        rate(args.entries, floor)
    );
    println!(
        "  {:<42} {:>10.1} {:>12.0}",
        "watch store: list + decode + validate",
        ms(store),
        rate(args.entries, store)
    );
    println!("  per-round ratios: {}", rounds.ratios_line());
    println!(
        "  peak RSS of the benchmark process: {} MiB",
        peak_rss_mib(None)
    );
    drop(server);
    println!("ratio={ratio:.2} goal={GOAL:.2}");
    Ok(())
}

async fn raw_list(
    backend: &EtcdBackend,
    prefix: &str,
    page_size: i64,
    expected: u32,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let count = floor::read_prefix(backend, prefix, page_size).await?;
    let elapsed = started.elapsed();
    anyhow::ensure!(
        count == expected as usize,
        "raw read saw {count} keys, expected {expected}"
    );
    Ok(elapsed)
}

async fn store_list(
    backend: &EtcdBackend,
    prefix: &str,
    page_size: i64,
    expected: u32,
) -> anyhow::Result<Duration> {
    let mut options = WatchStoreOptions::new("bench");
    options.page_size = page_size;
    let mut store = WatchStore::new(IpCacheDecoder::new(Some(1)), Discard, options);
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let started = Instant::now();
    store.on_sync(move || {
        let _ = done_tx.send(started.elapsed());
    });
    let status = store.status();
    let cancel = CancellationToken::new();
    let token = cancel.clone();
    let backend = backend.clone();
    let prefix = prefix.to_owned();
    let task = tokio::spawn(async move { store.watch(&backend, &prefix, &token).await });
    let elapsed = tokio::time::timeout(Duration::from_secs(300), done_rx).await??;
    cancel.cancel();
    task.await?;
    anyhow::ensure!(
        status.entries() == u64::from(expected) && status.decode_errors() == 0,
        "the store holds {} entries with {} rejected, expected {expected}",
        status.entries(),
        status.decode_errors()
    );
    Ok(elapsed)
}

fn rate(entries: u32, d: Duration) -> f64 {
    f64::from(entries) / d.as_secs_f64()
}

/// Drops every event: the benchmark only looks at the store's status.
struct Discard;

impl<V> meshwork_kvstore::Observer<V> for Discard {
    fn on_upsert(&mut self, _key: &str, _value: &std::sync::Arc<V>) {}
    fn on_delete(&mut self, _key: &str, _value: &std::sync::Arc<V>) {}
}
