//! Every object a workload or a binding names exists in the rendering: ServiceAccounts,
//! Secrets and ConfigMaps (with the keys taken from them), volumes, namespaces, roles.

use serde_json::Value;

use crate::Finding;
use crate::manifest::{Manifests, Object};
use crate::pod::{Workload, workloads};

/// Namespaces every cluster has.
const BUILTIN_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

/// Priority classes every cluster has.
const BUILTIN_PRIORITY_CLASSES: &[&str] = &["system-node-critical", "system-cluster-critical"];

/// Cluster roles every cluster has.
const BUILTIN_CLUSTER_ROLES: &[&str] = &["cluster-admin", "admin", "edit", "view"];

/// The keys a Secret or ConfigMap holds.
pub fn keys(object: &Object) -> Vec<String> {
    ["data", "stringData", "binaryData"]
        .iter()
        .filter_map(|field| object.value[*field].as_object())
        .flat_map(|map| map.keys().cloned())
        .collect()
}

/// Checks every reference.
pub fn check(manifests: &Manifests, findings: &mut Vec<Finding>) {
    for object in &manifests.objects {
        if let Some(namespace) = object.namespace()
            && !BUILTIN_NAMESPACES.contains(&namespace)
            && manifests.get("Namespace", None, namespace).is_none()
        {
            findings.push(Finding::new(
                &object.id(),
                format!("namespace {namespace} is not created"),
            ));
        }
    }
    for workload in workloads(manifests) {
        workload_references(manifests, &workload, findings);
    }
    for binding in manifests
        .of_kind("RoleBinding")
        .chain(manifests.of_kind("ClusterRoleBinding"))
    {
        binding_references(manifests, binding, findings);
    }
}

fn workload_references(
    manifests: &Manifests,
    workload: &Workload<'_>,
    findings: &mut Vec<Finding>,
) {
    let id = workload.object.id();
    let namespace = workload.namespace();
    let mut missing = |what: String| findings.push(Finding::new(&id, what));
    let account = workload.service_account();
    if account != "default"
        && manifests
            .get("ServiceAccount", Some(namespace), account)
            .is_none()
    {
        missing(format!("ServiceAccount {account} does not exist"));
    }
    if let Some(class) = workload.spec()["priorityClassName"].as_str()
        && !BUILTIN_PRIORITY_CLASSES.contains(&class)
        && manifests.get("PriorityClass", None, class).is_none()
    {
        missing(format!("PriorityClass {class} does not exist"));
    }
    for secret in workload.spec()["imagePullSecrets"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let name = secret["name"].as_str().unwrap_or_default();
        if manifests.get("Secret", Some(namespace), name).is_none() {
            missing(format!("image pull Secret {name} does not exist"));
        }
    }
    for volume in workload.spec()["volumes"].as_array().into_iter().flatten() {
        let name = volume["name"].as_str().unwrap_or_default();
        let mut sources = vec![
            ("Secret", &volume["secret"], "secretName"),
            ("ConfigMap", &volume["configMap"], "name"),
        ];
        for source in volume["projected"]["sources"]
            .as_array()
            .into_iter()
            .flatten()
        {
            sources.push(("Secret", &source["secret"], "name"));
            sources.push(("ConfigMap", &source["configMap"], "name"));
        }
        for (kind, source, field) in sources {
            if source.is_object()
                && let Some(why) = source_missing(manifests, namespace, kind, source, field)
            {
                missing(format!("volume {name}: {why}"));
            }
        }
    }
    for container in workload.containers() {
        let name = container.name();
        for mount in container.mounts() {
            if workload.volume(&mount.name).is_none() {
                missing(format!(
                    "container {name}: volume {} is not defined",
                    mount.name
                ));
            }
        }
        for env in container.value["env"].as_array().into_iter().flatten() {
            let var = env["name"].as_str().unwrap_or_default();
            for (kind, reference) in [
                ("ConfigMap", &env["valueFrom"]["configMapKeyRef"]),
                ("Secret", &env["valueFrom"]["secretKeyRef"]),
            ] {
                if reference.is_object()
                    && let Some(why) = key_missing(manifests, namespace, kind, reference)
                {
                    missing(format!("container {name}: env {var}: {why}"));
                }
            }
        }
        for from in container.value["envFrom"].as_array().into_iter().flatten() {
            for (kind, reference) in [
                ("ConfigMap", &from["configMapRef"]),
                ("Secret", &from["secretRef"]),
            ] {
                let wanted = reference["name"].as_str().unwrap_or_default();
                if reference.is_object()
                    && reference["optional"] != true
                    && manifests.get(kind, Some(namespace), wanted).is_none()
                {
                    missing(format!(
                        "container {name}: envFrom: {kind} {wanted} does not exist"
                    ));
                }
            }
        }
    }
}

/// Why a volume source's object, or an item's key, is missing.
fn source_missing(
    manifests: &Manifests,
    namespace: &str,
    kind: &str,
    source: &Value,
    name_field: &str,
) -> Option<String> {
    let name = source[name_field].as_str().unwrap_or_default();
    let Some(object) = manifests.get(kind, Some(namespace), name) else {
        return (source["optional"] != true).then(|| format!("{kind} {name} does not exist"));
    };
    let present = keys(object);
    source["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|item| item["key"].as_str())
        .find(|key| !present.iter().any(|k| k == key))
        .map(|key| format!("{kind} {name} has no key {key}"))
}

/// Why a `configMapKeyRef` or `secretKeyRef` does not resolve.
fn key_missing(
    manifests: &Manifests,
    namespace: &str,
    kind: &str,
    reference: &Value,
) -> Option<String> {
    if reference["optional"] == true {
        return None;
    }
    let name = reference["name"].as_str().unwrap_or_default();
    let key = reference["key"].as_str().unwrap_or_default();
    let Some(object) = manifests.get(kind, Some(namespace), name) else {
        return Some(format!("{kind} {name} does not exist"));
    };
    (!keys(object).iter().any(|k| k == key)).then(|| format!("{kind} {name} has no key {key}"))
}

fn binding_references(manifests: &Manifests, binding: &Object, findings: &mut Vec<Finding>) {
    let id = binding.id();
    let role = &binding.value["roleRef"];
    let role_name = role["name"].as_str().unwrap_or_default();
    let found = match role["kind"].as_str().unwrap_or_default() {
        "ClusterRole" => {
            BUILTIN_CLUSTER_ROLES.contains(&role_name)
                || role_name.starts_with("system:")
                || manifests.get("ClusterRole", None, role_name).is_some()
        }
        "Role" => manifests
            .get("Role", binding.namespace(), role_name)
            .is_some(),
        _ => false,
    };
    if !found {
        findings.push(Finding::new(&id, format!("roleRef {role} does not exist")));
    }
    for subject in binding.value["subjects"].as_array().into_iter().flatten() {
        if subject["kind"] != "ServiceAccount" {
            continue;
        }
        let name = subject["name"].as_str().unwrap_or_default();
        let namespace = subject["namespace"]
            .as_str()
            .or(binding.namespace())
            .unwrap_or("default");
        if manifests
            .get("ServiceAccount", Some(namespace), name)
            .is_none()
        {
            findings.push(Finding::new(
                &id,
                format!("subject ServiceAccount {namespace}/{name} does not exist"),
            ));
        }
    }
}
