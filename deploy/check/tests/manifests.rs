//! `deploy/kubernetes`: each overlay renders with `kubectl kustomize`, passes
//! `kubernetes-validate --strict`, and holds every check of `meshwork-deploy`; a rendering
//! broken on purpose is caught; the checked-in CRD is the one the operator's types make.

use std::path::PathBuf;

use meshwork_deploy::render::{self, OVERLAYS};
use meshwork_deploy::{Finding, Manifests, check};

/// Regenerates the checked-in CRD instead of comparing with it.
const ACCEPT: &str = "MESHWORK_ACCEPT_CRD";

fn crd_path() -> PathBuf {
    render::kubernetes_dir().join("base/crds/ciliumnodes.cilium.io.yaml")
}

#[test]
fn the_checked_in_crd_is_the_one_the_operator_types_generate() {
    let generated = meshwork_operator::cilium_node::crd_yaml().expect("the CRD encodes");
    let path = crd_path();
    if std::env::var_os(ACCEPT).is_some() {
        std::fs::write(&path, &generated).expect("write the CRD");
    }
    let checked_in = std::fs::read_to_string(&path).expect("the checked-in CRD");
    assert!(
        checked_in == generated,
        "{} differs from `meshwork-operator crd` (the CiliumNode types changed): regenerate it with \
         `{ACCEPT}=1 cargo test -p meshwork-deploy --test manifests`",
        path.display()
    );
}

fn rendered(overlay: &str) -> String {
    render::kustomize(&render::overlay_dir(overlay))
        .unwrap_or_else(|err| panic!("kubectl kustomize overlays/{overlay}: {err}"))
}

fn findings_text(findings: &[Finding]) -> String {
    findings.iter().map(|f| format!("  {f}\n")).collect()
}

#[test]
#[ignore = "needs kubectl and kubernetes-validate: `cargo xtask test` runs it"]
fn every_overlay_renders_and_passes_kubernetes_validate_strict() {
    let validator = meshwork_lab::paths::venv_dir().join("bin/kubernetes-validate");
    assert!(
        validator.exists(),
        "{} missing: run `cargo xtask setup`",
        validator.display()
    );
    let dir = std::env::temp_dir().join(format!("meshwork-deploy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for overlay in OVERLAYS {
        let yaml = rendered(overlay);
        let objects = Manifests::parse(&yaml).expect("YAML").objects.len();
        let file = dir.join(format!("{overlay}.yaml"));
        std::fs::write(&file, &yaml).expect("write");
        let report = render::validate(&validator, &file)
            .unwrap_or_else(|err| panic!("overlays/{overlay}: {err}"));
        let passed = report
            .lines()
            .filter(|line| line.contains(" passed for resource "))
            .count();
        assert_eq!(
            passed, objects,
            "overlays/{overlay}: every object validated:\n{report}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
#[ignore = "needs kubectl and kubernetes-validate: `cargo xtask test` runs it"]
fn every_overlay_holds_every_check() {
    for overlay in OVERLAYS {
        let manifests = Manifests::parse(&rendered(overlay)).expect("YAML");
        let findings = check(&manifests);
        assert!(
            findings.is_empty(),
            "overlays/{overlay}:\n{}",
            findings_text(&findings)
        );
        let has = |kind: &str, name: &str| {
            manifests
                .objects
                .iter()
                .any(|o| o.kind() == kind && o.name() == name)
        };
        assert!(has("DaemonSet", "meshwork-agent") && has("Deployment", "meshwork-operator"));
        assert_eq!(
            has("Deployment", "clustermesh-apiserver"),
            overlay.starts_with("mesh-")
        );
    }
}

/// A real rendering, broken one way at a time: each break must be found.
#[test]
#[ignore = "needs kubectl and kubernetes-validate: `cargo xtask test` runs it"]
fn a_rendering_broken_on_purpose_is_caught() {
    let yaml = rendered("mesh-1");
    assert!(
        check(&Manifests::parse(&yaml).expect("YAML")).is_empty(),
        "the control holds"
    );
    // (what breaks, text replaced, its replacement, what a finding must say)
    let breaks = [
        (
            "the apiserver's health port moved, the probes and the port did not",
            "--health-serve-addr=0.0.0.0:9880",
            "--health-serve-addr=0.0.0.0:9882",
            "httpGet port 9880: nothing listens there",
        ),
        (
            "a ConfigMap value the agent's parser refuses",
            "clustermesh-sync-timeout: 1m",
            "clustermesh-sync-timeout: soon",
            "/usr/bin/meshwork-agent refuses its arguments",
        ),
        (
            "a Secret's name misspelt",
            "secretName: clustermesh-apiserver-admin-cert",
            "secretName: clustermesh-apiserver-admin-certs",
            "Secret clustermesh-apiserver-admin-certs does not exist",
        ),
        (
            "the operator's Service selects no pod",
            "  selector:\n    app.kubernetes.io/name: meshwork-operator\n",
            "  selector:\n    app.kubernetes.io/name: meshwork-operatr\n",
            "selects no pod of any workload",
        ),
        (
            "the agents present the admin certificate to etcd",
            "path: local-etcd-client-ca.crt\n              name: clustermesh-apiserver-local-cert\n",
            "path: local-etcd-client-ca.crt\n              name: clustermesh-apiserver-admin-cert\n",
            "is not the etcd user it needs (local-mesh-1)",
        ),
        (
            "the readiness probe asks another socket",
            "--socket=/var/run/meshwork/agent.sock",
            "--socket=/run/other.sock",
            "meshctl health asks /run/other.sock",
        ),
        (
            "the CNI plugin is told another socket than the agent's",
            "--agent-socket=/var/run/meshwork/agent.sock",
            "--agent-socket=/run/meshwork/agent.sock",
            "--agent-socket /run/meshwork/agent.sock: the agent's socket is /var/run/meshwork/agent.sock",
        ),
        (
            "the agents dial the apiserver by a name its certificate lacks",
            "--apiserver-addr=meshwork-apiserver.meshwork-system.svc:9891",
            "--apiserver-addr=meshwork-apiserver:9891",
            "does not name meshwork-apiserver",
        ),
        (
            "kvstoremesh cannot resolve the remote cluster's name",
            "- mesh-2.mesh.meshwork.io",
            "- mesh-3.mesh.meshwork.io",
            "endpoint https://mesh-2.mesh.meshwork.io:32379: resolves to nothing",
        ),
    ];
    for (what, from, to, expected) in breaks {
        assert!(
            yaml.contains(from),
            "{what}: {from:?} is not in the rendering"
        );
        let broken = Manifests::parse(&yaml.replacen(from, to, 1)).expect("YAML");
        let findings = check(&broken);
        assert!(
            findings.iter().any(|f| f.to_string().contains(expected)),
            "{what}: expected a finding saying {expected:?}, got:\n{}",
            findings_text(&findings)
        );
    }
    // A remote's config file (Secret data) names a certificate that is not projected.
    let mut broken = Manifests::parse(&yaml).expect("YAML");
    let secret = broken
        .objects
        .iter_mut()
        .find(|o| o.kind() == "Secret" && o.name() == "cilium-clustermesh")
        .expect("the agents' remotes");
    let config = "endpoints:\n- https://clustermesh-apiserver.meshwork-system.svc:2379\n\
                  trusted-ca-file: local-etcd-client-ca.crt\ncert-file: etcd-client.crt\n\
                  key-file: local-etcd-client.key\n";
    secret.value["data"] = serde_json::json!({ "mesh-2": null });
    secret.value["stringData"] = serde_json::json!({ "mesh-2": config });
    let findings = check(&broken);
    assert!(
        findings.iter().any(|f| f
            .message
            .contains("etcd-client.crt is not in /var/lib/cilium/clustermesh")),
        "a missing certificate file:\n{}",
        findings_text(&findings)
    );
}

/// etcd's flags the checks accept are flags of the etcd `meshwork/etcd:dev` carries (this
/// machine's, Debian's `etcd-server`).
#[test]
#[ignore = "needs etcd (Debian etcd-server): `cargo xtask test` runs it"]
fn the_etcd_flags_the_checks_accept_are_etcds_own() {
    let help = std::process::Command::new("etcd")
        .arg("--help")
        .output()
        .expect("runs etcd");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&help.stdout),
        String::from_utf8_lossy(&help.stderr)
    );
    for (flag, _) in meshwork_deploy::etcd::FLAGS {
        assert!(
            text.contains(&format!("--{flag} ")) || text.contains(&format!("--{flag}\n")),
            "etcd has no --{flag}:\n{text}"
        );
    }
}
