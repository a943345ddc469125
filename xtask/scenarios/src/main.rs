//! Meshwork's scenarios: the demo and the benchmarks, on real components from the lab.
//!
//! Run through `cargo xtask demo` and `cargo xtask bench <name>`, which install what is
//! missing first.

mod bench_kvstore;
mod demo;
mod load;
mod mesh_stores;
mod rss;

use clap::{Parser, Subcommand};

/// Meshwork's demo and benchmarks.
#[derive(Parser)]
#[command(name = "meshwork-scenarios", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Three etcd clusters in Cilium's layout, synced by canary-gated watch stores.
    Demo(demo::Args),
    /// A benchmark against its physical floor, measured in the same run.
    #[command(subcommand)]
    Bench(Bench),
}

#[derive(Subcommand)]
enum Bench {
    /// ipcache entries listed and decoded by the watch store vs a raw paginated range read.
    Kvstore(bench_kvstore::Args),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    // Lab processes die with the thread that started them: start them from this thread's
    // runtime (block_on), never from a blocking-pool thread.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match cli.command {
        Command::Demo(args) => runtime.block_on(demo::run(args)),
        Command::Bench(Bench::Kvstore(args)) => runtime.block_on(bench_kvstore::run(args)),
    }
}
