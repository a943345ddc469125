//! `meshwork-devnode`: the node of the dev stack (`compose.yaml`), in the node image beside
//! `meshwork-agent`, `meshctl`, `meshwork-cni` and `wireguard-go`. The image holds no shell, so
//! what a node's boot scripts and its container runtime would do is done here:
//!
//! - `node -- AGENT_FLAGS…`: PID 1 of a node container. It mounts the node's own bpffs and
//!   cgroup2 (refusing to go on unless the cgroup2 mount shows this container's processes
//!   alone: a private cgroup namespace), starts wireguard-go, adds the node's routes, then runs
//!   `meshwork-agent` and restarts it whenever it exits; SIGTERM stops everything.
//! - `restart-agent`: restarts this node's agent (optionally with more flags) and waits until
//!   the new one answers.
//! - `pod add|del|allow|show`: pods as network namespaces, added to the network through the
//!   node's CNI conflist and `meshwork-cni`, with the spec's environment and stdin protocol.
//! - `stream recv|send`: a sequence-numbered TCP stream between two pods, bounded in time and
//!   count, whose receiver reports pauses, reordering and resets.
//! - `eni-scene`: the VPC, subnet and instances in the stack's moto, one instance per node;
//!   `eni-owner`: which ENI EC2 says holds an address.
//! - `status`: the node's agent as one JSON line (what the dev stack's checks read).

mod api;
mod cgroup;
mod init;
mod pod;
mod restart;
mod scene;
mod stream;

use clap::{Parser, Subcommand};

/// The dev stack's node.
#[derive(Parser)]
#[command(name = "meshwork-devnode", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// PID 1 of a node container: bpffs, the container's own cgroup2, wireguard-go, routes,
    /// then the agent (the flags after `--`), restarted whenever it exits.
    Node(init::Args),
    /// Restart this node's agent and wait until the new one answers.
    RestartAgent(restart::Args),
    /// Pods as network namespaces of this node.
    Pod {
        #[command(subcommand)]
        command: pod::Command,
    },
    /// A sequence-numbered TCP stream between pods.
    Stream {
        #[command(subcommand)]
        command: stream::Command,
    },
    /// Make the ENI scene in moto: a VPC, a subnet, a security group and one instance per node,
    /// each instance's ID written to `<out>/<node>`.
    EniScene(scene::Args),
    /// Print, as JSON, the ENI that EC2 says holds an address, its instance and device index.
    EniOwner(scene::OwnerArgs),
    /// Print, as one JSON line, this node's agent: remote clusters ready of total, drops,
    /// ipcache entries, endpoints, WireGuard peers.
    Status,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Node(args) => init::run(&args),
        Command::RestartAgent(args) => restart::run(&args),
        Command::Pod { command } => pod::run(command),
        Command::Stream { command } => stream::run(command),
        Command::EniScene(args) => scene::run(&args),
        Command::EniOwner(args) => scene::owner(&args),
        Command::Status => api::print_status(),
    }
}
