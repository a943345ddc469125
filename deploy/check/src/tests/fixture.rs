//! A small rendering that holds every check: the operator in Kubernetes mode with its
//! ConfigMap, service account, permissions and Service.

use crate::{Finding, Manifests, check};

/// The rendering.
pub const OPERATOR: &str = r#"
apiVersion: v1
kind: Namespace
metadata:
  name: meshwork-system
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: meshwork-operator
  namespace: meshwork-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: meshwork-operator
rules:
  - apiGroups: [cilium.io]
    resources: [ciliumnodes]
    verbs: [get, list, watch, create, update]
  - apiGroups: [cilium.io]
    resources: [ciliumnodes/status]
    verbs: [update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: meshwork-operator
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: meshwork-operator}
subjects:
  - {kind: ServiceAccount, name: meshwork-operator, namespace: meshwork-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: leases
  namespace: meshwork-system
rules:
  - apiGroups: [coordination.k8s.io]
    resources: [leases]
    verbs: [get, create, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: leases
  namespace: meshwork-system
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: leases}
subjects:
  - {kind: ServiceAccount, name: meshwork-operator, namespace: meshwork-system}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: meshwork-config
  namespace: meshwork-system
data:
  cluster-name: c1
  aws-region: us-east-1
  operator-prometheus-serve-addr: 0.0.0.0:9963
---
apiVersion: v1
kind: Service
metadata:
  name: meshwork-operator
  namespace: meshwork-system
spec:
  selector: {app: operator}
  ports:
    - {name: grpc, port: 9890, targetPort: grpc}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: meshwork-operator
  namespace: meshwork-system
spec:
  replicas: 2
  selector:
    matchLabels: {app: operator}
  template:
    metadata:
      labels: {app: operator}
    spec:
      serviceAccountName: meshwork-operator
      containers:
        - name: operator
          image: meshwork/operator:dev
          command: [/usr/bin/meshwork-operator]
          args:
            - --kube
            - --cluster-name=$(CLUSTER_NAME)
            - --aws-region=$(AWS_REGION)
            - --prometheus-serve-addr=$(OPERATOR_PROMETHEUS_SERVE_ADDR)
            - --grpc-serve-addr=0.0.0.0:9890
          env:
            - name: CLUSTER_NAME
              valueFrom: {configMapKeyRef: {name: meshwork-config, key: cluster-name}}
            - name: AWS_REGION
              valueFrom: {configMapKeyRef: {name: meshwork-config, key: aws-region}}
            - name: OPERATOR_PROMETHEUS_SERVE_ADDR
              valueFrom: {configMapKeyRef: {name: meshwork-config, key: operator-prometheus-serve-addr}}
          ports:
            - {name: prometheus, containerPort: 9963}
            - {name: grpc, containerPort: 9890}
          livenessProbe:
            httpGet: {path: /healthz, port: prometheus}
          readinessProbe:
            grpc: {port: 9890}
"#;

/// The findings of `yaml`.
pub fn findings(yaml: &str) -> Vec<Finding> {
    check(&Manifests::parse(yaml).expect("YAML"))
}

/// [`OPERATOR`] with `from` replaced by `to` (which must be there), and its findings.
pub fn broken(from: &str, to: &str) -> Vec<Finding> {
    assert!(OPERATOR.contains(from), "{from:?} is not in the fixture");
    findings(&OPERATOR.replacen(from, to, 1))
}

/// Asserts that one of `findings` says `expected`.
pub fn assert_found(findings: &[Finding], expected: &str) {
    assert!(
        findings.iter().any(|f| f.to_string().contains(expected)),
        "expected a finding saying {expected:?}, got {findings:#?}"
    );
}
