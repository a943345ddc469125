//! `meshwork-agent`: one per node. Watches every remote cluster's etcd and serves the local
//! API (`meshwork.agent.v1.Agent`) on a unix socket and metrics over HTTP.

mod api;
mod args;
mod datapath;
mod metrics_format;
mod metrics_server;
mod run;
mod wireguard;

use clap::Parser;

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = args::Args::parse();
    args.validate()?;
    // Actors live on the system's arbiter; watch stores, the API and the metrics server run
    // on tokio's worker threads.
    let system = actix_rt::System::with_tokio_rt(|| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
    });
    system.block_on(run::run(args))
}
