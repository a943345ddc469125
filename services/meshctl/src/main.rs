//! `meshctl`: the on-call engineer's CLI for a Meshwork agent, talking to the agent's local
//! gRPC API on its unix socket.

mod cli;
mod client;
mod encrypt;
mod status;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};

/// Exit status when the agent could not be reached or answered with an error (clap uses 2
/// for usage errors, `status --wait` 1 for a timeout).
const EXIT_AGENT_ERROR: u8 = 3;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Status(args) => status::run(&cli.socket, &args).await,
        Command::Encrypt(command) => encrypt::run(&cli.socket, &command).await,
    };
    result.unwrap_or_else(|err| {
        eprintln!("meshctl: {err:#}");
        ExitCode::from(EXIT_AGENT_ERROR)
    })
}
