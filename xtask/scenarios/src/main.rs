//! Meshwork's scenarios: the demo and the benchmarks, on real components from the lab.
//!
//! Run through `cargo xtask demo` and `cargo xtask bench <name>`, which install what is
//! missing first.

mod bench_eni;
mod bench_kvstore;
mod bench_sync;
mod binaries;
mod demo;
mod demo_agent;
mod demo_stores;
mod floor;
mod load;
mod measure;
mod mesh_stores;

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
    /// Three etcd clusters in Cilium's layout, watched by a real meshwork-agent: meshctl
    /// status shows it converge, then one cluster's config file is removed and drained.
    Demo(demo::Args),
    /// A benchmark against its physical floor, measured in the same run.
    #[command(subcommand)]
    Bench(Bench),
}

#[derive(Subcommand)]
enum Bench {
    /// ipcache entries listed and decoded by the watch store vs a raw paginated range read.
    Kvstore(bench_kvstore::Args),
    /// Remote clusters synced by a real agent vs raw reads; propagation latency; peak RSS.
    Sync(bench_sync::Args),
    /// 100 nodes from zero to pre-allocate 8 through the operator against moto: EC2 calls
    /// per node, wall time vs the token bucket's floor.
    Eni(bench_eni::Args),
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
        Command::Bench(Bench::Eni(args)) => {
            drop(runtime);
            // The operator's actors need an actix system.
            actix_rt::System::with_tokio_rt(|| {
                tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .build()
                    .expect("a tokio runtime")
            })
            .block_on(bench_eni::run(args))
        }
        Command::Bench(Bench::Sync(args)) => {
            drop(runtime);
            // The in-process part runs the agent's actors: they need an actix system.
            actix_rt::System::with_tokio_rt(|| {
                tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .build()
                    .expect("a tokio runtime")
            })
            .block_on(bench_sync::run(args))
        }
    }
}
