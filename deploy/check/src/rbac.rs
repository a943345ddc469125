//! The operator's service account may make every call the operator makes on Kubernetes:
//! CiliumNodes (`operator/src/node_store/kubernetes.rs`, `manager/watch.rs`) cluster-wide,
//! and its leader-election Lease (`leader_election/lease.rs`) in its namespace.

use serde_json::Value;

use crate::Finding;
use crate::analysis::Pod;
use crate::manifest::Manifests;
use crate::pod::strings;

/// `(API group, resource, verbs)` the operator needs cluster-wide.
pub const OPERATOR_CLUSTER: &[(&str, &str, &[&str])] = &[
    (
        "cilium.io",
        "ciliumnodes",
        &["get", "list", "watch", "create", "update"],
    ),
    ("cilium.io", "ciliumnodes/status", &["update"]),
];

/// `(API group, resource, verbs)` the operator needs in its Lease's namespace.
pub const OPERATOR_NAMESPACED: &[(&str, &str, &[&str])] = &[(
    "coordination.k8s.io",
    "leases",
    &["get", "create", "update"],
)];

/// Checks the operator's permissions.
pub fn check(manifests: &Manifests, pods: &[Pod<'_>], findings: &mut Vec<Finding>) {
    for pod in pods {
        for analyzed in &pod.containers {
            let Some(lease_namespace) = analyzed
                .parsed
                .as_ref()
                .and_then(|p| p.kube_operator.clone())
            else {
                continue;
            };
            let id = pod.id(analyzed.container.name());
            let namespace = pod.workload.namespace();
            let account = pod.workload.service_account();
            let lease_namespace = lease_namespace.unwrap_or_else(|| namespace.to_owned());
            let token = pod.workload.spec()["automountServiceAccountToken"]
                .as_bool()
                .or_else(|| {
                    manifests
                        .get("ServiceAccount", Some(namespace), account)
                        .and_then(|sa| sa.value["automountServiceAccountToken"].as_bool())
                });
            if token == Some(false) {
                findings.push(Finding::new(
                    &id,
                    "--kube needs the service account token, which is not mounted",
                ));
            }
            let cluster = rules(manifests, namespace, account, None);
            let local = rules(manifests, namespace, account, Some(&lease_namespace));
            for (needs, granted, scope) in [
                (OPERATOR_CLUSTER, &cluster, "cluster-wide".to_owned()),
                (OPERATOR_NAMESPACED, &local, format!("in {lease_namespace}")),
            ] {
                for (group, resource, verbs) in needs {
                    for verb in *verbs {
                        if !granted
                            .iter()
                            .any(|rule| covers(rule, group, resource, verb))
                        {
                            findings.push(Finding::new(
                                &id,
                                format!("service account {namespace}/{account} may not {verb} {resource}.{group} {scope}"),
                            ));
                        }
                    }
                }
            }
        }
    }
}

/// The rules bound to `namespace/account`: cluster-wide ones (`within: None`), or those
/// that hold in namespace `within` (cluster-wide ones included).
fn rules(
    manifests: &Manifests,
    namespace: &str,
    account: &str,
    within: Option<&str>,
) -> Vec<Value> {
    let names_account = |binding: &Value| {
        binding["subjects"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|subject| {
                subject["kind"] == "ServiceAccount"
                    && subject["name"] == account
                    && subject["namespace"].as_str().unwrap_or(namespace) == namespace
            })
    };
    let role_rules = |binding: &Value, binding_namespace: Option<&str>| -> Vec<Value> {
        let name = binding["roleRef"]["name"].as_str().unwrap_or_default();
        let role = match binding["roleRef"]["kind"].as_str() {
            Some("ClusterRole") => manifests.get("ClusterRole", None, name),
            Some("Role") => manifests.get("Role", binding_namespace, name),
            _ => None,
        };
        role.and_then(|role| role.value["rules"].as_array().cloned())
            .unwrap_or_default()
    };
    let mut granted: Vec<Value> = manifests
        .of_kind("ClusterRoleBinding")
        .filter(|binding| names_account(&binding.value))
        .flat_map(|binding| role_rules(&binding.value, None))
        .collect();
    if let Some(within) = within {
        granted.extend(
            manifests
                .of_kind("RoleBinding")
                .filter(|binding| {
                    binding.namespace() == Some(within) && names_account(&binding.value)
                })
                .flat_map(|binding| role_rules(&binding.value, Some(within))),
        );
    }
    granted
}

/// Whether a policy rule allows `verb` on `resource` of `group`.
fn covers(rule: &Value, group: &str, resource: &str, verb: &str) -> bool {
    let has = |field: &str, wanted: &str| {
        strings(&rule[field])
            .iter()
            .any(|v| v == wanted || v == "*")
    };
    has("apiGroups", group) && has("resources", resource) && has("verbs", verb)
}
