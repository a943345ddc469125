//! `meshctl health`: a probe of a Meshwork gRPC server's standard health service.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context as _, anyhow};
use meshwork_proto::standard::client::{HealthStatus, health};
use tonic::Code;
use tonic::transport::Endpoint;

use crate::cli::HealthArgs;
use crate::client::{Agent, CALL_TIMEOUT, CONNECT_TIMEOUT, call_error};

/// Prints the status (`SERVING`, `NOT_SERVING`); SERVING exits 0, anything else 1.
pub async fn run(socket: &Path, args: &HealthArgs) -> anyhow::Result<ExitCode> {
    let status = match &args.grpc_addr {
        None => {
            let channel = Agent::new(socket).channel().await?;
            health(channel, &args.service).await.map_err(|status| {
                named(&args.service, &status, || {
                    call_error(socket, "grpc.health.v1.Health/Check", &status)
                })
            })?
        }
        Some(addr) => {
            let channel = Endpoint::from_shared(format!("http://{addr}"))
                .with_context(|| format!("--grpc-addr {addr:?} is not HOST:PORT"))?
                .connect_timeout(CONNECT_TIMEOUT)
                .timeout(CALL_TIMEOUT)
                .connect()
                .await
                .map_err(|err| anyhow!("cannot reach the gRPC server at {addr}: {err}"))?;
            health(channel, &args.service).await.map_err(|status| {
                named(&args.service, &status, || {
                    anyhow!(
                        "the gRPC server at {addr} failed to answer grpc.health.v1.Health/Check: {:?}: {}",
                        status.code(),
                        status.message()
                    )
                })
            })?
        }
    };
    println!("{}", status.as_str_name());
    Ok(if status == HealthStatus::Serving {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// NOT_FOUND means the server has no such service: say which.
fn named(
    service: &str,
    status: &tonic::Status,
    otherwise: impl FnOnce() -> anyhow::Error,
) -> anyhow::Error {
    if status.code() == Code::NotFound {
        anyhow!("the server serves no service {service:?}")
    } else {
        otherwise()
    }
}
