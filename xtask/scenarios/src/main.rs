//! Meshwork's scenarios: the demo and the benchmarks, on real components from the lab.
//!
//! Run through `cargo xtask demo`, `cargo xtask bench <name>`, `cargo xtask images` and
//! `cargo xtask dev …`, which install what is missing first.

mod bench_apiserver;
mod bench_datapath;
mod bench_eni;
mod bench_ipam;
mod bench_kvstore;
mod bench_mesh_scale;
mod bench_sync;
mod bench_wireguard;
mod binaries;
mod demo;
mod demo_mesh;
mod dev;
mod floor;
mod load;
mod measure;
mod mesh;
mod node_agent;
mod proof;
mod propagation;
mod sockets;

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
    /// Three Meshwork clusters meshed with each other (etcd, meshwork-apiserver and two
    /// agents each): they converge, pods connect across clusters, a remote is drained; then
    /// the no-drop proof on the same topology.
    Demo(demo::Args),
    /// The no-drop proof: restart an agent while a remote cluster is late; with the bounded
    /// wait nothing drops, without it (0s) the endpoint program drops. On Meshwork meshed
    /// with itself, or with `--fixtures` on hand-written Cilium-format state.
    Proof(proof::Args),
    /// A benchmark against its physical floor, measured in the same run.
    #[command(subcommand)]
    Bench(Bench),
    /// The dev stack's images (`meshwork/<component>:dev`), `FROM scratch` with the binaries
    /// beside this one and exactly the libraries they link.
    Images,
    /// The dev stack (`compose.yaml`): up, status, down, test.
    #[command(subcommand)]
    Dev(dev::Command),
}

#[derive(Subcommand)]
enum Bench {
    /// ipcache entries listed and decoded by the watch store vs a raw paginated range read.
    Kvstore(bench_kvstore::Args),
    /// Remote clusters synced by a real agent vs raw reads; propagation latency; peak RSS.
    Sync(bench_sync::Args),
    /// ipcache inserts through the DatapathWriter vs a raw bpf(2) loop; agent start to
    /// restored endpoints regenerated vs the raw read floor.
    Datapath(bench_datapath::Args),
    /// 5,000 remote-node peers reconciled through the WireGuard actor vs one raw UAPI set.
    Wireguard(bench_wireguard::Args),
    /// 100 nodes from zero to pre-allocate 8 through the operator against moto: EC2 calls
    /// per node, wall time vs the token bucket's floor.
    Eni(bench_eni::Args),
    /// 20 agents (`--ipam eni`) × 30 pods through the CNI plugin against the operator and
    /// moto: allocation p50/p99 on the agent; registration → first pod IP vs the token
    /// bucket's floor for the calls it took.
    Ipam(bench_ipam::Args),
    /// 100 agents × 500 endpoints publishing to the apiserver until its canaries are
    /// written, vs the same keys written raw with leases; endpoint → etcd p99; peak RSS.
    Apiserver(bench_apiserver::Args),
    /// Cilium's clustermesh scale-test shape: 250 remote etcds cached by one kvstoremesh, one
    /// agent reading through it; each against a raw copy and a raw read; the bootstrap.
    MeshScale(bench_mesh_scale::Args),
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
        Command::Images => dev::images::build_all(),
        Command::Dev(command) => dev::run(&command),
        Command::Demo(args) => runtime.block_on(demo::run(args)),
        Command::Proof(args) => runtime.block_on(proof::run(args)),
        Command::Bench(Bench::Kvstore(args)) => runtime.block_on(bench_kvstore::run(args)),
        Command::Bench(Bench::Datapath(args)) => with_actix(runtime, bench_datapath::run(args)),
        Command::Bench(Bench::Wireguard(args)) => with_actix(runtime, bench_wireguard::run(args)),
        Command::Bench(Bench::Sync(args)) => with_actix(runtime, bench_sync::run(args)),
        Command::Bench(Bench::Eni(args)) => with_actix(runtime, bench_eni::run(args)),
        Command::Bench(Bench::Ipam(args)) => runtime.block_on(bench_ipam::run(args)),
        Command::Bench(Bench::MeshScale(args)) => runtime.block_on(bench_mesh_scale::run(args)),
        Command::Bench(Bench::Apiserver(args)) => {
            let apiserver = binaries::build()?.apiserver;
            runtime.block_on(bench_apiserver::run(args, &apiserver))
        }
    }
}

/// Runs `scenario` in an actix system: the in-process parts run the agent's actors.
fn with_actix(
    runtime: tokio::runtime::Runtime,
    scenario: impl Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    drop(runtime);
    actix_rt::System::with_tokio_rt(|| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
    .block_on(scenario)
}
