//! `cargo xtask`: everything Meshwork's developers run.
//!
//! - `setup`: install what is missing (Debian packages, the Python venv with moto).
//! - `test`: the project's full check — setup, `cargo fmt --check`, clippy with
//!   `-D warnings`, and every test against real components. CI runs exactly this.
//! - `demo`: the main job on a fresh machine — setup, then the demo scenario.
//! - `bench <name>`: a benchmark, measured against the physical floor in the same run.
//! - `images`, `dev up|status|down|test`: the dev stack (`compose.yaml`) on Docker.

mod cargo;
mod setup;

use clap::{Parser, Subcommand, ValueEnum};

/// Meshwork's task runner.
#[derive(Parser)]
#[command(name = "cargo xtask", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what Meshwork needs on a Debian machine (idempotent; installing needs root).
    Setup,
    /// Run setup, `cargo fmt --check`, clippy (-D warnings) and every test; fail if any fails.
    Test {
        /// Extra arguments for the test runner (e.g. a test name filter).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        runner_args: Vec<String>,
    },
    /// Run setup, then the demo: three Meshwork clusters (etcd, meshwork-apiserver, kvstoremesh,
    /// two agents each) meshed with each other through kvstoremesh, pods connecting across
    /// clusters, a remote drained, then the no-drop proof on the same topology.
    Demo {
        /// Arguments passed on to the demo (`--clusters`, `--nodes`, `--no-proof`,
        /// `--no-kvstoremesh`; see `--help` after `--`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run setup, then the no-drop proof on the demo's topology: a TCP stream between pods of
    /// two clusters through the BPF endpoint program, an agent restart while the remote is
    /// late — with the bounded wait and without it. Ends with
    /// `drops_with_wait=… drops_without_wait=… stream_gaps_with_wait=…`.
    Proof {
        /// Arguments passed on to the proof (`--fixtures`, `--only`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run setup, then build the dev stack's images (`meshwork/<component>:dev`, FROM scratch,
    /// the legacy builder) from the current debug build, with exactly the libraries it links.
    Images,
    /// Run setup, then the dev stack (`compose.yaml`: two clusters on Docker).
    Dev {
        /// What to do with it.
        #[command(subcommand)]
        command: Dev,
    },
    /// Run setup, then a benchmark (release build) against its floor in the same run.
    Bench {
        /// Which benchmark.
        name: Bench,
        /// Arguments passed on to the benchmark (see `--help` after `--`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// The dev stack's commands.
#[derive(Subcommand)]
enum Dev {
    /// Build the images, start the stack, wait until every agent has every remote cluster
    /// ready; print `meshctl status` from inside every node.
    Up,
    /// The containers and `meshctl status` of every node.
    Status,
    /// Remove every container, network and volume of the stack, and its images.
    Down {
        /// Keep the images.
        #[arg(long)]
        keep_images: bool,
    },
    /// The stack from fresh images, its checks (remote clusters ready, an ENI pod IP through
    /// the CNI plugin, an agent restart with 0 drops, a network partition), then everything
    /// removed, also on failure.
    Test,
}

/// What the dev stack's images hold (built in one cargo invocation, debug).
const DEV_BINARIES: &[&str] = &[
    "meshwork-agent",
    "meshctl",
    "meshwork-apiserver",
    "meshwork-operator",
    "meshwork-cni",
    "meshwork-devnode",
];

/// What the demo, the proof and most benchmarks run as processes.
const MESH_BINARIES: &[&str] = &["meshwork-agent", "meshctl", "meshwork-apiserver"];
/// What `bench ipam` runs: the agent, the operator and the plugin.
const IPAM_BINARIES: &[&str] = &["meshwork-agent", "meshwork-operator", "meshwork-cni"];

/// The benchmarks.
#[derive(Clone, Copy, ValueEnum)]
enum Bench {
    /// 100k ipcache entries listed and decoded by the watch store vs a raw paginated read.
    Kvstore,
    /// 4 remote clusters synced by a real agent vs raw reads; propagation p99; RSS at 1M.
    Sync,
    /// ipcache inserts through the DatapathWriter vs a raw bpf(2) loop; time to regenerate.
    Datapath,
    /// 5,000 remote-node peers through the WireGuard actor vs one raw UAPI set.
    Wireguard,
    /// 100 nodes to pre-allocate 8 through the operator against moto: EC2 calls per node,
    /// wall time vs calls ÷ qps.
    Eni,
    /// 20 agents (`--ipam eni`) × 30 pods through the CNI plugin against the operator and
    /// moto: allocation p50/p99 on the agent; registration → first pod IP vs the EC2 calls
    /// it took at the operator's rate.
    Ipam,
    /// 100 agents × 500 endpoints published through the apiserver vs the same keys written
    /// raw with leases; endpoint → etcd p99 at 1,000/s; the apiserver's peak RSS.
    Apiserver,
    /// 250 remote etcds (100 nodes, 100 identities, 1,000 ipcache entries each) cached by
    /// one kvstoremesh and read by one agent, vs a raw copy and a raw read; the bootstrap.
    MeshScale,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Setup => setup::run(),
        Command::Test { runner_args } => cargo::test_suite(&runner_args),
        Command::Demo { args } => {
            setup::run()?;
            let args: Vec<&str> = std::iter::once("demo")
                .chain(args.iter().map(String::as_str))
                .collect();
            cargo::run_scenario(false, MESH_BINARIES, &args)
        }
        Command::Proof { args } => {
            setup::run()?;
            let args: Vec<&str> = std::iter::once("proof")
                .chain(args.iter().map(String::as_str))
                .collect();
            cargo::run_scenario(false, MESH_BINARIES, &args)
        }
        Command::Images => {
            setup::run()?;
            cargo::run_scenario(false, DEV_BINARIES, &["images"])
        }
        Command::Dev { command } => {
            setup::run()?;
            let args: &[&str] = match command {
                Dev::Up => &["dev", "up"],
                Dev::Status => &["dev", "status"],
                Dev::Down { keep_images: false } => &["dev", "down"],
                Dev::Down { keep_images: true } => &["dev", "down", "--keep-images"],
                Dev::Test => &["dev", "test"],
            };
            cargo::run_scenario(false, DEV_BINARIES, args)
        }
        Command::Bench { name, args } => {
            setup::run()?;
            let (name, binaries) = match name {
                Bench::Kvstore => ("kvstore", MESH_BINARIES),
                Bench::Sync => ("sync", MESH_BINARIES),
                Bench::Datapath => ("datapath", MESH_BINARIES),
                // In-process actors and wireguard-go only: no agent or meshctl build needed.
                Bench::Wireguard => ("wireguard", &[][..]),
                // In-process actors only: no agent or meshctl build needed.
                Bench::Eni => ("eni", &[][..]),
                Bench::Ipam => ("ipam", IPAM_BINARIES),
                Bench::Apiserver => ("apiserver", MESH_BINARIES),
                Bench::MeshScale => ("mesh-scale", MESH_BINARIES),
            };
            let mut scenario = vec!["bench", name];
            scenario.extend(args.iter().map(String::as_str));
            cargo::run_scenario(true, binaries, &scenario)
        }
    }
}
