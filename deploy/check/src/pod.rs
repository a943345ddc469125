//! Pod templates of the workloads, and their containers, volumes and mounts.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::manifest::{Manifests, Object};

/// `key: value` labels.
pub type Labels = BTreeMap<String, String>;

/// The labels of a `labels` or `matchLabels` map.
pub fn labels(value: &Value) -> Labels {
    value
        .as_object()
        .map(|map| {
            map.iter()
                .map(|(key, value)| (key.clone(), value.as_str().unwrap_or_default().to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// The strings of a list.
pub fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|list| {
            list.iter()
                .map(|item| match item {
                    Value::String(text) => text.clone(),
                    other => other.to_string(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A workload: an object with a pod template.
#[derive(Debug, Clone, Copy)]
pub struct Workload<'a> {
    /// The Deployment, DaemonSet, StatefulSet, ReplicaSet or Job.
    pub object: &'a Object,
    /// `spec.template`.
    pub template: &'a Value,
}

impl<'a> Workload<'a> {
    /// The pod spec.
    pub fn spec(&self) -> &'a Value {
        &self.template["spec"]
    }

    /// The namespace (the default one when unset).
    pub fn namespace(&self) -> &'a str {
        self.object.namespace().unwrap_or("default")
    }

    /// The pod template's labels.
    pub fn labels(&self) -> Labels {
        labels(&self.template["metadata"]["labels"])
    }

    /// `spec.selector` of the workload.
    pub fn selector(&self) -> &'a Value {
        &self.object.value["spec"]["selector"]
    }

    /// Whether the pods share the node's network namespace.
    pub fn host_network(&self) -> bool {
        self.spec()["hostNetwork"].as_bool().unwrap_or(false)
    }

    /// The service account the pods run as.
    pub fn service_account(&self) -> &'a str {
        self.spec()["serviceAccountName"]
            .as_str()
            .unwrap_or("default")
    }

    /// Init containers (sidecars included), then containers.
    pub fn containers(&self) -> Vec<Container<'a>> {
        let list = |key: &str, init: bool| {
            self.spec()[key]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |value| Container { value, init })
        };
        list("initContainers", true)
            .chain(list("containers", false))
            .collect()
    }

    /// The volume named `name`.
    pub fn volume(&self, name: &str) -> Option<&'a Value> {
        self.spec()["volumes"]
            .as_array()?
            .iter()
            .find(|volume| volume["name"] == name)
    }
}

/// Every workload, in order.
pub fn workloads(manifests: &Manifests) -> Vec<Workload<'_>> {
    manifests
        .objects
        .iter()
        .filter_map(|object| {
            let template = match object.kind() {
                "Deployment" | "DaemonSet" | "StatefulSet" | "ReplicaSet" | "Job" => {
                    &object.value["spec"]["template"]
                }
                "CronJob" => &object.value["spec"]["jobTemplate"]["spec"]["template"],
                _ => return None,
            };
            Some(Workload { object, template })
        })
        .collect()
}

/// A container port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    /// `name`, if any.
    pub name: Option<String>,
    /// `containerPort`.
    pub container_port: u16,
    /// `hostPort`, if any.
    pub host_port: Option<u16>,
}

/// A volume mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The volume.
    pub name: String,
    /// Where it is mounted.
    pub path: String,
}

/// One container of a pod template.
#[derive(Debug, Clone, Copy)]
pub struct Container<'a> {
    /// The container.
    pub value: &'a Value,
    /// An init container (or a sidecar).
    pub init: bool,
}

impl<'a> Container<'a> {
    /// `name`.
    pub fn name(&self) -> &'a str {
        self.value["name"].as_str().unwrap_or_default()
    }

    /// `image`.
    pub fn image(&self) -> &'a str {
        self.value["image"].as_str().unwrap_or_default()
    }

    /// `command` then `args`, unexpanded.
    pub fn argv(&self) -> Vec<String> {
        let mut argv = strings(&self.value["command"]);
        argv.extend(strings(&self.value["args"]));
        argv
    }

    /// An init container that keeps running beside the others (`restartPolicy: Always`).
    pub fn sidecar(&self) -> bool {
        self.init && self.value["restartPolicy"] == "Always"
    }

    /// Runs as long as the pod does (a container or a sidecar): probes apply.
    pub fn long_running(&self) -> bool {
        !self.init || self.sidecar()
    }

    /// The declared ports.
    pub fn ports(&self) -> Vec<Port> {
        let port = |value: &Value| u16::try_from(value.as_u64()?).ok();
        self.value["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|entry| {
                Some(Port {
                    name: entry["name"].as_str().map(str::to_owned),
                    container_port: port(&entry["containerPort"])?,
                    host_port: port(&entry["hostPort"]),
                })
            })
            .collect()
    }

    /// The port a probe or Service names: a number, or the name of a declared port.
    pub fn resolve_port(&self, port: &Value) -> Option<u16> {
        match port {
            Value::Number(number) => number.as_u64().and_then(|n| u16::try_from(n).ok()),
            Value::String(name) => self
                .ports()
                .into_iter()
                .find(|p| p.name.as_deref() == Some(name))
                .map(|p| p.container_port),
            _ => None,
        }
    }

    /// The volume mounts.
    pub fn mounts(&self) -> Vec<Mount> {
        self.value["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|mount| Mount {
                name: mount["name"].as_str().unwrap_or_default().to_owned(),
                path: mount["mountPath"].as_str().unwrap_or_default().to_owned(),
            })
            .collect()
    }

    /// The probes it declares, by kind (`startupProbe`, `livenessProbe`, `readinessProbe`).
    pub fn probes(&self) -> Vec<(&'static str, &'a Value)> {
        ["startupProbe", "livenessProbe", "readinessProbe"]
            .into_iter()
            .filter(|kind| self.value[*kind].is_object())
            .map(|kind| (kind, &self.value[kind]))
            .collect()
    }
}
