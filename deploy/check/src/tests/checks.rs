//! Every check on the fixture: it holds, and each break is found.

use super::fixture::{OPERATOR, assert_found, broken, findings};

#[test]
fn the_fixture_holds() {
    let found = findings(OPERATOR);
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn a_selector_that_misses_its_pods_is_found() {
    let found = broken(
        "      labels: {app: operator}",
        "      labels: {app: operatr}",
    );
    assert_found(&found, "does not select the pod template's labels");
    assert_found(
        &found,
        "Service/meshwork-system/meshwork-operator: spec.selector",
    );
}

#[test]
fn missing_objects_and_keys_are_found() {
    let found = broken(
        "serviceAccountName: meshwork-operator",
        "serviceAccountName: operator",
    );
    assert_found(&found, "ServiceAccount operator does not exist");
    let found = broken("key: aws-region}", "key: region}");
    assert_found(&found, "ConfigMap meshwork-config has no key region");
    let found = broken("name: leases}", "name: lease}");
    assert_found(&found, "roleRef");
}

#[test]
fn args_the_binary_refuses_are_found() {
    let found = broken(
        "--grpc-serve-addr=0.0.0.0:9890",
        "--grpc-serve-adr=0.0.0.0:9890",
    );
    assert_found(&found, "/usr/bin/meshwork-operator refuses its arguments");
    let found = broken("aws-region: us-east-1", "aws-region: \"\"");
    assert_found(&found, "--aws-region (or AWS_REGION) is required");
    let found = broken(
        "            - --kube\n",
        "            - --kube\n            - --leader-election-retry-period=9s\n",
    );
    assert_found(&found, "--leader-election-renew-deadline");
}

#[test]
fn variables_the_environment_lacks_are_found() {
    let found = broken(
        "--cluster-name=$(CLUSTER_NAME)",
        "--cluster-name=$(CLUSTER)",
    );
    assert_found(&found, "no variable CLUSTER in the container's environment");
}

#[test]
fn a_command_its_image_lacks_is_found() {
    let found = broken(
        "command: [/usr/bin/meshwork-operator]",
        "command: [/usr/bin/meshwork-agent]",
    );
    assert_found(
        &found,
        "\"/usr/bin/meshwork-agent\" is not in image meshwork/operator:dev",
    );
    let found = broken("image: meshwork/operator:dev", "image: busybox:1");
    assert_found(&found, "image \"busybox:1\" is not one these checks know");
}

#[test]
fn ports_and_probes_that_miss_their_listener_are_found() {
    let found = broken("path: /healthz", "path: /readyz");
    assert_found(
        &found,
        "httpGet /readyz: --prometheus-serve-addr does not serve it",
    );
    let found = broken(
        "operator-prometheus-serve-addr: 0.0.0.0:9963",
        "operator-prometheus-serve-addr: 127.0.0.1:9963",
    );
    assert_found(
        &found,
        "is bound to loopback: the kubelet probes the pod's IP",
    );
    let found = broken(
        "{name: grpc, containerPort: 9890}",
        "{name: grpc, containerPort: 9891}",
    );
    assert_found(
        &found,
        "containerPort 9891 (grpc) is not a port it listens on",
    );
    assert_found(
        &found,
        "--grpc-serve-addr listens on 9890: declare it as a containerPort",
    );
    let found = broken(
        "            - --grpc-serve-addr=0.0.0.0:9890\n",
        "            - --grpc-serve-addr=0.0.0.0:9890\n            - --grpc-tls-cert=/tls/tls.crt\n            - --grpc-tls-key=/tls/tls.key\n",
    );
    assert_found(&found, "is not plaintext gRPC");
    assert_found(
        &found,
        "--grpc-tls-cert /tls/tls.crt: /tls/tls.crt is on no volume mount",
    );
}

#[test]
fn a_service_port_that_reaches_no_listener_is_found() {
    let found = broken(
        "{name: grpc, port: 9890, targetPort: grpc}",
        "{name: grpc, port: 9890, targetPort: 9999}",
    );
    assert_found(&found, "port 9890 (targetPort 9999) reaches no listener");
}

#[test]
fn config_keys_that_reach_no_flag_or_another_flag_are_found() {
    let found = broken(
        "  cluster-name: c1\n",
        "  cluster-name: c1\n  cluster-id: \"3\"\n",
    );
    assert_found(&found, "key cluster-id reaches no binary");
    let found = broken("--aws-region=$(AWS_REGION)", "--cluster-name=$(AWS_REGION)");
    assert_found(&found, "key aws-region sets --cluster-name");
}

#[test]
fn missing_permissions_are_found() {
    let found = broken(
        "verbs: [get, list, watch, create, update]",
        "verbs: [get, list, watch, update]",
    );
    assert_found(&found, "may not create ciliumnodes.cilium.io cluster-wide");
    let found = broken("verbs: [get, create, update]", "verbs: [get, update]");
    assert_found(
        &found,
        "may not create leases.coordination.k8s.io in meshwork-system",
    );
}

#[test]
fn a_service_link_variable_needs_its_service_first() {
    let uses = OPERATOR.replacen(
        "--grpc-serve-addr=0.0.0.0:9890",
        "--grpc-serve-addr=0.0.0.0:$(MESHWORK_OPERATOR_SERVICE_PORT_GRPC)",
        1,
    );
    assert!(findings(&uses).is_empty(), "{:#?}", findings(&uses));
    // The Service moved after the Deployment.
    let (head, deployment) = uses
        .split_once("---\napiVersion: apps/v1")
        .expect("a Deployment");
    let (before, service) = head
        .rsplit_once("---\napiVersion: v1\nkind: Service")
        .expect("a Service");
    let reordered = format!(
        "{before}---\napiVersion: apps/v1{deployment}\n---\napiVersion: v1\nkind: Service{service}"
    );
    assert_found(
        &findings(&reordered),
        "its Service comes after the workload",
    );
}
