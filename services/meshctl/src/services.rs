//! `meshctl service …` and `meshctl node …`: calls of a meshwork-apiserver's
//! `meshwork.apiserver.v1.Export`.

use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::{Context as _, anyhow, bail};
use meshwork_proto::apiserver::v1 as pb;
use meshwork_proto::apiserver::v1::export_client::ExportClient;
use serde_json::json;
use tonic::transport::{Channel, Endpoint};

use crate::cli::{NodeCommand, ServiceCommand, ServicePutArgs};
use crate::client::{CALL_TIMEOUT, CONNECT_TIMEOUT};
use crate::status::print_text;

async fn client(apiserver: Option<&str>) -> anyhow::Result<(ExportClient<Channel>, String)> {
    let addr = apiserver.ok_or_else(|| {
        anyhow!("which apiserver? give --apiserver HOST:PORT (or MESHWORK_APISERVER)")
    })?;
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .with_context(|| format!("--apiserver {addr:?} is not HOST:PORT"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .connect()
        .await
        .map_err(|err| anyhow!("cannot reach the apiserver at {addr}: {err} — is meshwork-apiserver running? (--apiserver)"))?;
    Ok((ExportClient::new(channel), addr.to_owned()))
}

fn refused(addr: &str, rpc: &str, status: &tonic::Status) -> anyhow::Error {
    anyhow!(
        "the apiserver at {addr} refused {rpc}: {:?}: {}",
        status.code(),
        status.message()
    )
}

fn namespaced(text: &str) -> anyhow::Result<(String, String)> {
    match text.split_once('/') {
        Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() => {
            Ok((namespace.to_owned(), name.to_owned()))
        }
        _ => bail!("{text:?} is not NAMESPACE/NAME"),
    }
}

/// `NAME:PORT[/PROTOCOL]`.
fn port(text: &str) -> anyhow::Result<pb::NamedPort> {
    let (name, rest) = text
        .split_once(':')
        .ok_or_else(|| anyhow!("--port {text:?} is not NAME:PORT[/PROTOCOL]"))?;
    let (number, protocol) = rest.split_once('/').unwrap_or((rest, "TCP"));
    let port = number
        .parse()
        .with_context(|| format!("--port {text:?}: {number:?} is not a port number"))?;
    Ok(pb::NamedPort {
        name: name.to_owned(),
        port,
        protocol: protocol.to_ascii_uppercase(),
    })
}

fn service_from(args: &ServicePutArgs) -> anyhow::Result<pb::Service> {
    let (namespace, name) = namespaced(&args.service)?;
    Ok(pb::Service {
        namespace,
        name,
        frontends: args.frontends.clone(),
        ports: args
            .ports
            .iter()
            .map(|p| port(p))
            .collect::<anyhow::Result<_>>()?,
        selector: args.selector.clone(),
        shared: args.shared,
    })
}

/// Runs a `service` subcommand.
pub async fn service(
    apiserver: Option<&str>,
    command: &ServiceCommand,
) -> anyhow::Result<ExitCode> {
    // Arguments are checked before anything is asked of the apiserver.
    let put = match command {
        ServiceCommand::Put(args) => Some(service_from(args)?),
        _ => None,
    };
    let (mut client, addr) = client(apiserver).await?;
    let text = match (command, put) {
        (ServiceCommand::Put(args), Some(service)) => {
            let reply = client
                .put_service(pb::PutServiceRequest {
                    service: Some(service),
                })
                .await
                .map_err(|s| refused(&addr, "PutService", &s))?;
            let shared = if args.shared {
                "shared"
            } else {
                "not shared: this cluster's agents only"
            };
            format!(
                "service {} declared ({shared}), {} backends\n",
                args.service,
                reply.into_inner().backends
            )
        }
        (ServiceCommand::Delete { service }, _) => {
            let (namespace, name) = namespaced(service)?;
            let existed = client
                .delete_service(pb::DeleteServiceRequest { namespace, name })
                .await
                .map_err(|s| refused(&addr, "DeleteService", &s))?
                .into_inner()
                .existed;
            if existed {
                format!("service {service} deleted\n")
            } else {
                format!("service {service} was not declared\n")
            }
        }
        (ServiceCommand::List { json }, _) => {
            let services = client
                .list_services(pb::ListServicesRequest {})
                .await
                .map_err(|s| refused(&addr, "ListServices", &s))?
                .into_inner()
                .services;
            if *json {
                list_json(&services)
            } else {
                list_text(&services)
            }
        }
        (ServiceCommand::Put(_), None) => unreachable!("checked above"),
    };
    print_text(&text)?;
    Ok(ExitCode::SUCCESS)
}

fn list_json(services: &[pb::ServiceStatus]) -> String {
    let rows: Vec<_> = services
        .iter()
        .map(|s| {
            let service = s.service.clone().unwrap_or_default();
            json!({
                "namespace": service.namespace,
                "name": service.name,
                "frontends": service.frontends,
                "ports": service.ports.iter().map(|p| json!({"name": p.name, "port": p.port, "protocol": p.protocol})).collect::<Vec<_>>(),
                "selector": service.selector,
                "shared": service.shared,
                "backends": s.backends,
            })
        })
        .collect();
    format!("{}\n", json!({ "services": rows }))
}

fn list_text(services: &[pb::ServiceStatus]) -> String {
    if services.is_empty() {
        return "no services declared\n".to_owned();
    }
    let mut out = String::new();
    for s in services {
        let service = s.service.clone().unwrap_or_default();
        let ports: Vec<String> = service
            .ports
            .iter()
            .map(|p| format!("{}:{}/{}", p.name, p.port, p.protocol))
            .collect();
        let _ = writeln!(
            out,
            "{}/{}  frontends {}  ports {}  selector {}  {}  backends {}",
            service.namespace,
            service.name,
            service.frontends.join(","),
            ports.join(","),
            service.selector.join(","),
            if service.shared { "shared" } else { "local" },
            if s.backends.is_empty() {
                "none".to_owned()
            } else {
                s.backends.join(",")
            },
        );
    }
    out
}

/// Runs a `node` subcommand.
pub async fn node(apiserver: Option<&str>, command: &NodeCommand) -> anyhow::Result<ExitCode> {
    let NodeCommand::Delete { name } = command;
    let (mut client, addr) = client(apiserver).await?;
    let existed = client
        .delete_node(pb::DeleteNodeRequest { name: name.clone() })
        .await
        .map_err(|s| refused(&addr, "DeleteNode", &s))?
        .into_inner()
        .existed;
    print_text(&if existed {
        format!("node {name} deleted, with its entries\n")
    } else {
        format!("node {name} was not known\n")
    })?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_and_names_parse_or_say_why() {
        let p = port("http:80").unwrap();
        assert_eq!(
            (p.name.as_str(), p.port, p.protocol.as_str()),
            ("http", 80, "TCP")
        );
        assert_eq!(port("dns:53/udp").unwrap().protocol, "UDP");
        assert_eq!(
            port("http").unwrap_err().to_string(),
            "--port \"http\" is not NAME:PORT[/PROTOCOL]"
        );
        assert!(port("http:x").is_err());
        assert_eq!(
            namespaced("default/web").unwrap(),
            ("default".to_owned(), "web".to_owned())
        );
        assert_eq!(
            namespaced("web").unwrap_err().to_string(),
            "\"web\" is not NAMESPACE/NAME"
        );
    }
}
