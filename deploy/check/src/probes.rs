//! Ports and probes against what the binaries listen on: every declared container port is
//! one its binary's flags open, every listener reachable from outside the pod is declared,
//! every probe hits a listener serving its path (or speaking gRPC, or is the binary's own
//! probe command run in its image), and every Service port reaches a listener.

use serde_json::Value;

use crate::Finding;
use crate::analysis::{Analyzed, Pod, parse_checked};
use crate::binaries::{Listener, Protocol};
use crate::manifest::Manifests;
use crate::pod::{labels, strings};
use crate::selectors;

/// Checks ports, probes and Services.
pub fn check(manifests: &Manifests, pods: &[Pod<'_>], findings: &mut Vec<Finding>) {
    for pod in pods {
        for analyzed in &pod.containers {
            ports(pod, analyzed, findings);
            for (kind, probe) in analyzed.container.probes() {
                let id = format!("{} {kind}", pod.id(analyzed.container.name()));
                if let Err(why) = probe_reaches(pod, analyzed, probe, findings, &id) {
                    findings.push(Finding::new(&id, why));
                }
            }
        }
    }
    services(manifests, pods, findings);
}

fn listeners_text(listeners: &[Listener]) -> String {
    let ports: Vec<String> = listeners
        .iter()
        .map(|l| format!("{} (--{})", l.port, l.flag))
        .collect();
    if ports.is_empty() {
        "none".to_owned()
    } else {
        ports.join(", ")
    }
}

fn ports(pod: &Pod<'_>, analyzed: &Analyzed<'_>, findings: &mut Vec<Finding>) {
    let Some(parsed) = &analyzed.parsed else {
        return;
    };
    let id = pod.id(analyzed.container.name());
    let declared = analyzed.container.ports();
    for port in &declared {
        if !parsed
            .listeners
            .iter()
            .any(|l| l.port == port.container_port)
        {
            findings.push(Finding::new(
                &id,
                format!(
                    "containerPort {} ({}) is not a port it listens on: {}",
                    port.container_port,
                    port.name.as_deref().unwrap_or("unnamed"),
                    listeners_text(&parsed.listeners)
                ),
            ));
        }
        if pod.workload.host_network()
            && port
                .host_port
                .is_some_and(|host| host != port.container_port)
        {
            findings.push(Finding::new(
                &id,
                format!(
                    "hostPort of {} differs on the host network",
                    port.container_port
                ),
            ));
        }
    }
    if !analyzed.container.long_running() {
        return;
    }
    for listener in parsed.listeners.iter().filter(|l| !l.loopback) {
        if !declared.iter().any(|p| p.container_port == listener.port) {
            findings.push(Finding::new(
                &id,
                format!(
                    "--{} listens on {}: declare it as a containerPort",
                    listener.flag, listener.port
                ),
            ));
        }
    }
}

/// Whether a probe reaches what it means to.
fn probe_reaches(
    pod: &Pod<'_>,
    analyzed: &Analyzed<'_>,
    probe: &Value,
    findings: &mut Vec<Finding>,
    id: &str,
) -> Result<(), String> {
    let container = &analyzed.container;
    let listeners = analyzed
        .parsed
        .as_ref()
        .map(|p| p.listeners.as_slice())
        .unwrap_or_default();
    let find = |port: &Value, kind: &str| -> Result<Vec<&Listener>, String> {
        let number = container
            .resolve_port(port)
            .ok_or_else(|| format!("{kind} port {port} is no port of the container"))?;
        let on_port: Vec<&Listener> = listeners.iter().filter(|l| l.port == number).collect();
        if on_port.is_empty() {
            return Err(format!(
                "{kind} port {number}: nothing listens there ({})",
                listeners_text(listeners)
            ));
        }
        Ok(on_port)
    };
    let reachable = |on_port: &[&Listener], host: Option<&str>| -> Result<(), String> {
        let local_host = host.is_some_and(|h| h == "127.0.0.1" || h == "localhost");
        if let Some(host) = host
            && !local_host
        {
            return Err(format!("host {host} is not the pod's"));
        }
        let via_loopback = local_host && pod.workload.host_network();
        if on_port.iter().all(|l| l.loopback) && !via_loopback {
            return Err(format!(
                "--{} is bound to loopback: the kubelet probes the pod's IP",
                on_port[0].flag
            ));
        }
        if local_host && !pod.workload.host_network() {
            return Err("host 127.0.0.1 is the node's, not the pod's (no host network)".to_owned());
        }
        Ok(())
    };
    if probe["httpGet"].is_object() {
        let get = &probe["httpGet"];
        let on_port = find(&get["port"], "httpGet")?;
        reachable(&on_port, get["host"].as_str())?;
        let path = get["path"].as_str().unwrap_or("/");
        let serves = on_port
            .iter()
            .any(|l| matches!(l.protocol, Protocol::Http(paths) if paths.contains(&path)));
        if !serves {
            return Err(format!(
                "httpGet {path}: --{} does not serve it",
                on_port[0].flag
            ));
        }
        if get["scheme"].as_str().is_some_and(|s| s != "HTTP") {
            return Err("httpGet scheme: the health endpoints are plain HTTP".to_owned());
        }
        return Ok(());
    }
    if probe["grpc"].is_object() {
        let on_port = find(&probe["grpc"]["port"], "grpc")?;
        reachable(&on_port, None)?;
        let plaintext = on_port
            .iter()
            .any(|l| l.protocol == Protocol::Grpc { tls: false });
        if !plaintext {
            return Err(format!(
                "grpc probe: --{} is not plaintext gRPC (the kubelet's gRPC probe has no TLS)",
                on_port[0].flag
            ));
        }
        return Ok(());
    }
    if probe["tcpSocket"].is_object() {
        let on_port = find(&probe["tcpSocket"]["port"], "tcpSocket")?;
        return reachable(&on_port, probe["tcpSocket"]["host"].as_str());
    }
    if probe["exec"].is_object() {
        return exec_probe(
            pod,
            analyzed,
            &strings(&probe["exec"]["command"]),
            findings,
            id,
        );
    }
    Err("no httpGet, grpc, tcpSocket or exec handler".to_owned())
}

/// An exec probe runs in the container's image, with its environment (no shell: the
/// command is a binary of the image, parsed by that binary's parser).
fn exec_probe(
    pod: &Pod<'_>,
    analyzed: &Analyzed<'_>,
    command: &[String],
    findings: &mut Vec<Finding>,
    id: &str,
) -> Result<(), String> {
    let image = analyzed.container.image();
    let Some(parsed) = parse_checked(id, image, command, &analyzed.env, findings) else {
        return Ok(()); // said already
    };
    let Some((socket, grpc_addr)) = parsed.health else {
        return Err(format!("exec {command:?} is no health probe"));
    };
    match grpc_addr {
        None => {
            let agent_socket = analyzed
                .parsed
                .as_ref()
                .and_then(|p| p.api_socket.as_deref());
            if agent_socket != Some(socket.as_str()) {
                return Err(format!(
                    "meshctl health asks {socket}, but this container's agent serves {}",
                    agent_socket.unwrap_or("no API socket")
                ));
            }
            Ok(())
        }
        Some(addr) => {
            let port = addr
                .rsplit_once(':')
                .and_then(|(_, port)| port.parse::<u16>().ok())
                .ok_or_else(|| format!("--grpc-addr {addr:?} has no port"))?;
            let served = pod
                .containers
                .iter()
                .filter_map(|c| c.parsed.as_ref())
                .any(|p| {
                    p.listeners
                        .iter()
                        .any(|l| l.port == port && l.protocol == Protocol::Grpc { tls: false })
                });
            if served {
                Ok(())
            } else {
                Err(format!(
                    "--grpc-addr {addr}: no plaintext gRPC listener of the pod"
                ))
            }
        }
    }
}

fn services(manifests: &Manifests, pods: &[Pod<'_>], findings: &mut Vec<Finding>) {
    for service in manifests.of_kind("Service") {
        let selector = &service.value["spec"]["selector"];
        if !selector.is_object() {
            continue;
        }
        let namespace = service.namespace().unwrap_or("default");
        let selector = serde_json::json!({ "matchLabels": selector });
        let selected: Vec<&Pod<'_>> = pods
            .iter()
            .filter(|pod| pod.workload.namespace() == namespace)
            .filter(|pod| {
                selectors::selects(
                    &selector,
                    &labels(&pod.workload.template["metadata"]["labels"]),
                )
                .unwrap_or(false)
            })
            .collect();
        for port in service.value["spec"]["ports"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let target = if port["targetPort"].is_null() {
                &port["port"]
            } else {
                &port["targetPort"]
            };
            for pod in &selected {
                let reached = pod
                    .containers
                    .iter()
                    .filter(|c| c.container.long_running())
                    .any(|c| {
                        let Some(number) = c.container.resolve_port(target) else {
                            return false;
                        };
                        let declared = c
                            .container
                            .ports()
                            .iter()
                            .any(|p| p.container_port == number);
                        declared
                            && c.parsed.as_ref().is_some_and(|p| {
                                p.listeners.iter().any(|l| l.port == number && !l.loopback)
                            })
                    });
                if !reached {
                    findings.push(Finding::new(
                        &service.id(),
                        format!(
                            "port {} (targetPort {target}) reaches no listener of {}",
                            port["port"],
                            pod.workload.object.id()
                        ),
                    ));
                }
            }
        }
    }
}
