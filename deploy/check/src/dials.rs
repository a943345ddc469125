//! What the binaries connect to: a loopback address is a listener of the same pod, a
//! Service name is a Service with that port, another name is one of the pod's host
//! aliases; over TLS, the serving certificate (in the rendering) names the host dialed.

use crate::Finding;
use crate::analysis::{Analyzed, Pod};
use crate::binaries::Protocol;
use crate::files::{self, Certificate, Found};
use crate::manifest::Manifests;
use crate::pod::labels;
use crate::selectors;

/// Checks every address a parsed flag dials.
pub fn check(manifests: &Manifests, pods: &[Pod<'_>], findings: &mut Vec<Finding>) {
    for pod in pods {
        for analyzed in &pod.containers {
            let Some(parsed) = &analyzed.parsed else {
                continue;
            };
            let id = pod.id(analyzed.container.name());
            for dial in &parsed.dials {
                let what = format!("--{} {}:{}", dial.flag, dial.host, dial.port);
                if let Err(why) = reach(manifests, pods, pod, &dial.host, dial.port, dial.tls) {
                    findings.push(Finding::new(&id, format!("{what}: {why}")));
                }
            }
        }
    }
}

/// Checks one endpoint URL of a clustermesh config file read in `pod`.
pub fn check_endpoint(
    manifests: &Manifests,
    pods: &[Pod<'_>],
    pod: &Pod<'_>,
    (id, what): (&str, &str),
    endpoint: &str,
    findings: &mut Vec<Finding>,
) {
    let tls = endpoint.starts_with("https://");
    let rest = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest)
        .trim_end_matches('/');
    let Some((host, port)) = rest
        .rsplit_once(':')
        .and_then(|(host, port)| Some((host.trim_matches(['[', ']']), port.parse::<u16>().ok()?)))
    else {
        findings.push(Finding::new(
            id,
            format!("{what}: endpoint {endpoint} has no port"),
        ));
        return;
    };
    if let Err(why) = reach(manifests, pods, pod, host, port, tls) {
        findings.push(Finding::new(
            id,
            format!("{what}: endpoint {endpoint}: {why}"),
        ));
    }
}

/// Whether `host:port` dialed from `pod` reaches a listener, and over TLS one whose
/// certificate names `host`.
fn reach(
    manifests: &Manifests,
    pods: &[Pod<'_>],
    pod: &Pod<'_>,
    host: &str,
    port: u16,
    tls: bool,
) -> Result<(), String> {
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    let serving: Vec<(&Pod<'_>, &Analyzed<'_>, u16)> = if loopback {
        let found: Vec<_> = pod
            .containers
            .iter()
            .filter(|c| listens(c, port))
            .map(|c| (pod, c, port))
            .collect();
        if found.is_empty() {
            return Err(format!("nothing in the pod listens on {port}"));
        }
        found
    } else if let Some((service, namespace)) = service_name(host, pod.workload.namespace()) {
        let Some(object) = manifests.get("Service", Some(namespace), service) else {
            return Err(format!("no Service {namespace}/{service}"));
        };
        let entry = object.value["spec"]["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["port"].as_u64() == Some(u64::from(port)))
            .ok_or_else(|| format!("Service {namespace}/{service} has no port {port}"))?;
        let target = if entry["targetPort"].is_null() {
            &entry["port"]
        } else {
            &entry["targetPort"]
        };
        let selector = serde_json::json!({ "matchLabels": object.value["spec"]["selector"] });
        pods.iter()
            .filter(|p| p.workload.namespace() == namespace)
            .filter(|p| {
                selectors::selects(
                    &selector,
                    &labels(&p.workload.template["metadata"]["labels"]),
                )
                .unwrap_or(false)
            })
            .flat_map(|p| {
                p.containers.iter().filter_map(move |c| {
                    let number = c.container.resolve_port(target)?;
                    listens(c, number).then_some((p, c, number))
                })
            })
            .collect()
    } else if host.parse::<std::net::IpAddr>().is_ok() || aliased(pod, host) {
        // A Service link variable's address, or a host alias: outside the rendering.
        return Ok(());
    } else {
        return Err(
            "resolves to nothing in the rendering (no Service name, no host alias)".to_owned(),
        );
    };
    if !tls {
        return Ok(());
    }
    for (server_pod, server, listening) in serving {
        let Some(parsed) = &server.parsed else {
            continue;
        };
        let protocol = parsed
            .listeners
            .iter()
            .find(|l| l.port == listening)
            .map(|l| l.protocol);
        let cert_flag = match protocol {
            Some(Protocol::Tcp) => "cert-file",
            _ => "grpc-cert-file",
        };
        let Some(file) = parsed
            .files
            .iter()
            .find(|f| f.flag == cert_flag || f.flag == "grpc-tls-cert")
        else {
            return Err(format!(
                "dialed over TLS, but {} serves no certificate",
                server_pod.id(server.container.name())
            ));
        };
        if let Found::File(pem) = files::find(
            manifests,
            &server_pod.workload,
            &server.container,
            &file.path,
        ) {
            let cert = Certificate::from_pem(&pem)?;
            if !cert.names(host) {
                return Err(format!(
                    "the server's certificate ({}) does not name {host}: it names {}",
                    file.path,
                    cert.dns_names
                        .iter()
                        .cloned()
                        .chain(cert.ips.iter().map(ToString::to_string))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
    }
    Ok(())
}

fn listens(analyzed: &Analyzed<'_>, port: u16) -> bool {
    analyzed
        .parsed
        .as_ref()
        .is_some_and(|p| p.listeners.iter().any(|l| l.port == port))
}

/// `name.namespace.svc[.cluster.local]` → (name, namespace); a bare name is in `namespace`.
fn service_name<'a>(host: &'a str, namespace: &'a str) -> Option<(&'a str, &'a str)> {
    let host = host.strip_suffix(".cluster.local").unwrap_or(host);
    if let Some(rest) = host.strip_suffix(".svc") {
        return rest.split_once('.');
    }
    (!host.contains('.')).then_some((host, namespace))
}

/// Whether the pod maps `host` with `hostAliases`.
fn aliased(pod: &Pod<'_>, host: &str) -> bool {
    pod.workload.spec()["hostAliases"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|alias| {
            alias["hostnames"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|name| name == host)
        })
}
