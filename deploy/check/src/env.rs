//! A container's environment as the kubelet builds it — the Services' link variables of the
//! pod's namespace, then `env` in order — and `$(VAR)` expanded in its command and args.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::manifest::Manifests;
use crate::pod::{Container, Workload};

/// The value the checks give `status.hostIP` (a documentation address).
pub const HOST_IP: &str = "192.0.2.10";
/// The value the checks give `status.podIP` of a pod on its own network.
pub const POD_IP: &str = "198.51.100.10";
/// The value the checks give `spec.nodeName`.
pub const NODE_NAME: &str = "node-1";

/// One variable: its value, and the Service it links to, if it is a link variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Var {
    /// The value.
    pub value: String,
    /// `Some(index of the Service)` for a Service's link variable.
    pub service: Option<usize>,
}

/// A container's environment.
#[derive(Debug, Clone, Default)]
pub struct Environment {
    /// The variables.
    pub vars: BTreeMap<String, Var>,
    /// What could not be resolved, said as findings say it.
    pub problems: Vec<String>,
}

impl Environment {
    /// The value of `name`, if set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(|var| var.value.as_str())
    }

    /// `text` with every `$(VAR)` replaced (`$$` is a literal `$`); the names that did not
    /// resolve, if any.
    pub fn expand(&self, text: &str) -> Result<String, Vec<String>> {
        let mut out = String::new();
        let mut missing = Vec::new();
        let mut rest = text;
        while let Some(at) = rest.find('$') {
            out.push_str(&rest[..at]);
            let after = &rest[at + 1..];
            if let Some(after) = after.strip_prefix('$') {
                out.push('$');
                rest = after;
            } else if let Some(reference) = after.strip_prefix('(')
                && let Some(end) = reference.find(')')
            {
                let name = &reference[..end];
                match self.get(name) {
                    Some(value) => out.push_str(value),
                    None => {
                        missing.push(name.to_owned());
                        out.push_str(&rest[at..at + end + 3]);
                    }
                }
                rest = &reference[end + 1..];
            } else {
                out.push('$');
                rest = after;
            }
        }
        out.push_str(rest);
        if missing.is_empty() {
            Ok(out)
        } else {
            Err(missing)
        }
    }

    /// The variables of this environment a text references.
    pub fn referenced(text: &str) -> Vec<String> {
        let mut names = Vec::new();
        let mut rest = text;
        while let Some(at) = rest.find("$(") {
            if at > 0 && rest.as_bytes()[at - 1] == b'$' {
                rest = &rest[at + 2..];
                continue;
            }
            let reference = &rest[at + 2..];
            let Some(end) = reference.find(')') else {
                break;
            };
            names.push(reference[..end].to_owned());
            rest = &reference[end + 1..];
        }
        names
    }
}

/// `name` as an environment variable name, as Services' link variables spell it.
pub fn link_name(name: &str) -> String {
    name.to_ascii_uppercase().replace('-', "_")
}

/// The environment of `container` in `workload`.
pub fn environment(
    manifests: &Manifests,
    workload: &Workload<'_>,
    container: &Container<'_>,
) -> Environment {
    let mut environment = Environment::default();
    let namespace = workload.namespace();
    if workload.spec()["enableServiceLinks"] != false {
        let services = manifests
            .of_kind("Service")
            .filter(|service| service.namespace().unwrap_or("default") == namespace);
        for (number, service) in services.enumerate() {
            let prefix = link_name(service.name());
            let link = |value: String| Var {
                value,
                service: Some(service.index),
            };
            let host = format!("10.96.0.{}", number + 1);
            environment
                .vars
                .insert(format!("{prefix}_SERVICE_HOST"), link(host));
            let ports = service.value["spec"]["ports"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for (position, port) in ports.iter().enumerate() {
                let number = port["port"].as_u64().unwrap_or_default().to_string();
                if position == 0 {
                    environment
                        .vars
                        .insert(format!("{prefix}_SERVICE_PORT"), link(number.clone()));
                }
                if let Some(name) = port["name"].as_str() {
                    let var = format!("{prefix}_SERVICE_PORT_{}", link_name(name));
                    environment.vars.insert(var, link(number));
                }
            }
        }
    }
    for env in container.value["env"].as_array().into_iter().flatten() {
        let name = env["name"].as_str().unwrap_or_default().to_owned();
        let value = match env.get("value") {
            Some(Value::String(text)) => environment.expand(text).unwrap_or_else(|_| text.clone()),
            Some(_) | None => match value_from(manifests, workload, &env["valueFrom"]) {
                Ok(value) => value,
                Err(why) => {
                    environment.problems.push(format!("env {name}: {why}"));
                    continue;
                }
            },
        };
        environment.vars.insert(
            name,
            Var {
                value,
                service: None,
            },
        );
    }
    environment
}

/// The value of a `valueFrom`.
fn value_from(
    manifests: &Manifests,
    workload: &Workload<'_>,
    from: &Value,
) -> Result<String, String> {
    let namespace = Some(workload.namespace());
    if let Some(path) = from["fieldRef"]["fieldPath"].as_str() {
        return field(workload, path);
    }
    if from["resourceFieldRef"].is_object() {
        return Ok("1".to_owned());
    }
    for (kind, reference) in [
        ("ConfigMap", &from["configMapKeyRef"]),
        ("Secret", &from["secretKeyRef"]),
    ] {
        if !reference.is_object() {
            continue;
        }
        let name = reference["name"].as_str().unwrap_or_default();
        let key = reference["key"].as_str().unwrap_or_default();
        let object = manifests
            .get(kind, namespace, name)
            .ok_or_else(|| format!("{kind} {name} does not exist"))?;
        if let Some(text) = object.value["data"][key].as_str() {
            return if kind == "Secret" {
                let bytes = crate::files::decode_base64(text)
                    .map_err(|e| format!("Secret {name} key {key}: {e}"))?;
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            } else {
                Ok(text.to_owned())
            };
        }
        if let Some(text) = object.value["stringData"][key].as_str() {
            return Ok(text.to_owned());
        }
        return Err(format!("{kind} {name} has no key {key}"));
    }
    Err(format!("unsupported valueFrom {from}"))
}

/// A sample value of a downward-API field.
fn field(workload: &Workload<'_>, path: &str) -> Result<String, String> {
    let pod_ip = if workload.host_network() {
        HOST_IP
    } else {
        POD_IP
    };
    Ok(match path {
        "metadata.name" => format!("{}-0", workload.object.name()),
        "metadata.namespace" => workload.namespace().to_owned(),
        "metadata.uid" => "6f1c4e2a-0000-4000-8000-000000000001".to_owned(),
        "spec.nodeName" => NODE_NAME.to_owned(),
        "spec.serviceAccountName" => workload.service_account().to_owned(),
        "status.hostIP" => HOST_IP.to_owned(),
        "status.podIP" => pod_ip.to_owned(),
        other => {
            let label = other
                .strip_prefix("metadata.labels['")
                .and_then(|rest| rest.strip_suffix("']"))
                .ok_or_else(|| format!("unsupported fieldPath {other}"))?;
            workload.labels().get(label).cloned().unwrap_or_default()
        }
    })
}
