//! `meshctl`: the on-call engineer's CLI for a Meshwork agent, talking to the agent's local
//! gRPC API on its unix socket.

mod client;
mod datapath;
mod encrypt;
mod health;
mod kvstoremesh;
mod services;
mod status;
mod timeline;
mod troubleshoot;

use std::process::ExitCode;

use clap::Parser;
// The library's command line, as `crate::cli` for the modules here.
use meshctl::cli;

use crate::cli::{BpfCommand, Cli, Command, EndpointCommand, IpcacheCommand, TroubleshootCommand};
use crate::client::Agent;

/// Exit status when the agent could not be reached or answered with an error (clap uses 2
/// for usage errors, `status --wait` 1 for a timeout).
const EXIT_AGENT_ERROR: u8 = 3;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Status(args) => status::run(&cli.socket, cli.kvstoremesh.as_deref(), &args).await,
        Command::Bpf(BpfCommand::Ipcache(IpcacheCommand::List { bpf_root, json })) => {
            datapath::ipcache_list(&bpf_root, json).map(|()| ExitCode::SUCCESS)
        }
        Command::Endpoint(command) => {
            let agent = Agent::new(&cli.socket);
            match command {
                EndpointCommand::List { json } => datapath::endpoint_list(&agent, json).await,
                EndpointCommand::Add(args) => datapath::endpoint_add(&agent, &args).await,
                EndpointCommand::Delete { id } => datapath::endpoint_delete(&agent, id).await,
            }
            .map(|()| ExitCode::SUCCESS)
        }
        Command::Encrypt(command) => encrypt::run(&cli.socket, &command).await,
        Command::Health(args) => health::run(&cli.socket, &args).await,
        Command::Service(command) => services::service(cli.apiserver.as_deref(), &command).await,
        Command::Node(command) => services::node(cli.apiserver.as_deref(), &command).await,
        Command::Troubleshoot(TroubleshootCommand::Clustermesh(args)) => {
            troubleshoot::clustermesh(&cli.socket, cli.kvstoremesh.as_deref(), &args).await
        }
        Command::Timeline(args) => timeline::run(&cli.socket, &args).await,
    };
    result.unwrap_or_else(|err| {
        eprintln!("meshctl: {err:#}");
        ExitCode::from(EXIT_AGENT_ERROR)
    })
}
