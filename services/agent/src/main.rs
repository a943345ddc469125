//! `meshwork-agent`: one per node. Watches every remote cluster's etcd, programs the BPF
//! datapath and WireGuard, and serves the local API (`meshwork.agent.v1.*`) on a unix socket
//! and metrics over HTTP.

use anyhow::Context as _;
use meshwork_agent::{AgentBuilder, Args};
use tokio::signal::unix::{SignalKind, signal};

// A sync allocates per remote entry on several threads at once, where glibc's malloc and free
// were a fifth of the agent's instructions (callgrind of a sync; ARCHITECTURE.md, Memory).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    // Cilium's `--flag=true` booleans too (`meshwork_agent::args::parse_args`).
    let args: Args =
        meshwork_agent::args::parse_args(std::env::args_os()).unwrap_or_else(|err| err.exit());
    // The system's arbiter holds the mesh, the barrier and the identity cache; the datapath
    // and WireGuard actors get arbiters of their own; watch stores, the API and the metrics
    // server run on tokio's worker threads.
    let system = actix_rt::System::with_tokio_rt(|| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
    });
    match system.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            // One line: the error and its causes, as an operator reads it in a pod's log.
            eprintln!("meshwork-agent: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let mut terminate =
        signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let agent = AgentBuilder::new(args).start().await?;
    tokio::select! {
        _ = terminate.recv() => tracing::info!("SIGTERM: stopping"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
    }
    agent.shutdown().await;
    actix_rt::System::current().stop();
    Ok(())
}
