//! Selectors against the pods they are meant to select: a workload's selector against its
//! own template, a Service's and a PodDisruptionBudget's against the workloads of their
//! namespace.

use serde_json::Value;

use crate::Finding;
use crate::manifest::Manifests;
use crate::pod::{Labels, Workload, labels, strings, workloads};

/// Whether a `LabelSelector` (`matchLabels`, `matchExpressions`) selects `pod`; an empty
/// selector selects everything, as the API server reads it.
pub fn selects(selector: &Value, pod: &Labels) -> Result<bool, String> {
    let wanted = labels(&selector["matchLabels"]);
    if wanted
        .iter()
        .any(|(key, value)| pod.get(key) != Some(value))
    {
        return Ok(false);
    }
    for expression in selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let key = expression["key"].as_str().unwrap_or_default();
        let values = strings(&expression["values"]);
        let has = pod.get(key);
        let matched = match expression["operator"].as_str().unwrap_or_default() {
            "In" => has.is_some_and(|value| values.contains(value)),
            "NotIn" => has.is_none_or(|value| !values.contains(value)),
            "Exists" => has.is_some(),
            "DoesNotExist" => has.is_none(),
            other => return Err(format!("unknown selector operator {other:?}")),
        };
        if !matched {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether a selector selects nothing at all (no labels, no expressions).
fn is_empty(selector: &Value) -> bool {
    labels(&selector["matchLabels"]).is_empty()
        && selector["matchExpressions"]
            .as_array()
            .is_none_or(Vec::is_empty)
}

/// The workloads of `namespace` whose pods `selector` selects.
pub fn selected<'a>(
    workloads: &[Workload<'a>],
    namespace: &str,
    selector: &Value,
) -> Vec<Workload<'a>> {
    workloads
        .iter()
        .filter(|workload| workload.namespace() == namespace)
        .filter(|workload| selects(selector, &workload.labels()).unwrap_or(false))
        .copied()
        .collect()
}

/// Checks every selector.
pub fn check(manifests: &Manifests, findings: &mut Vec<Finding>) {
    let workloads = workloads(manifests);
    for workload in &workloads {
        let selector = workload.selector();
        let id = workload.object.id();
        if workload.object.kind() == "CronJob" || workload.object.kind() == "Job" {
            continue;
        }
        if is_empty(selector) {
            findings.push(Finding::new(&id, "spec.selector is empty"));
            continue;
        }
        match selects(selector, &workload.labels()) {
            Ok(true) => {}
            Ok(false) => findings.push(Finding::new(
                &id,
                format!(
                    "spec.selector {} does not select the pod template's labels {:?}",
                    selector,
                    workload.labels()
                ),
            )),
            Err(why) => findings.push(Finding::new(&id, why)),
        }
    }
    for service in manifests.of_kind("Service") {
        let selector = &service.value["spec"]["selector"];
        if !selector.is_object() {
            continue;
        }
        let namespace = service.namespace().unwrap_or("default");
        let as_label_selector = serde_json::json!({ "matchLabels": selector });
        if selected(&workloads, namespace, &as_label_selector).is_empty() {
            findings.push(Finding::new(
                &service.id(),
                format!("spec.selector {selector} selects no pod of any workload in {namespace}"),
            ));
        }
    }
    for budget in manifests.of_kind("PodDisruptionBudget") {
        let selector = &budget.value["spec"]["selector"];
        let namespace = budget.namespace().unwrap_or("default");
        if is_empty(selector) || selected(&workloads, namespace, selector).is_empty() {
            findings.push(Finding::new(
                &budget.id(),
                format!("spec.selector {selector} selects no pod of any workload in {namespace}"),
            ));
        }
    }
}
