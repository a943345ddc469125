//! `meshwork-operator`: Meshwork's AWS ENI IPAM operator.
//!
//! Subcommands so far: `crd`, which prints the CiliumNode CustomResourceDefinition generated
//! from the Rust type, so the schema served to Kubernetes can never drift from the code.

use std::io::Write;

use anyhow::Context;
use clap::{Parser, Subcommand};
use kube::CustomResourceExt;
use meshwork_operator::cilium_node::CiliumNode;

/// Meshwork's AWS ENI IPAM operator.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the CiliumNode CustomResourceDefinition (cilium.io/v2) as YAML.
    Crd,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => {
            let yaml = yaml_serde::to_string(&CiliumNode::crd()).context("encoding the CRD")?;
            std::io::stdout()
                .lock()
                .write_all(yaml.as_bytes())
                .context("writing the CRD")?;
        }
    }
    Ok(())
}
