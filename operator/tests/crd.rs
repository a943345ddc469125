//! `meshwork-operator crd`: the CRD printed from the Rust type is accepted by
//! `kubernetes-validate --strict` (the lab's venv, made by `cargo xtask setup`).

use std::process::Command;

#[test]
#[ignore = "needs kubernetes-validate (the lab's Python venv): `cargo xtask test` runs it"]
fn the_printed_crd_passes_kubernetes_validate_strict() {
    let output = Command::new(env!("CARGO_BIN_EXE_meshwork-operator"))
        .arg("crd")
        .output()
        .expect("runs meshwork-operator");
    assert!(output.status.success(), "crd failed: {output:?}");
    let yaml = String::from_utf8(output.stdout).expect("utf-8");
    assert!(yaml.contains("name: ciliumnodes.cilium.io"), "{yaml}");
    assert!(yaml.contains("scope: Cluster"), "{yaml}");

    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("ciliumnodes.yaml");
    std::fs::write(&file, &yaml).expect("write");
    let validator = meshwork_lab::paths::venv_dir()
        .join("bin")
        .join("kubernetes-validate");
    assert!(
        validator.exists(),
        "{} missing: run `cargo xtask setup`",
        validator.display()
    );
    let result = Command::new(&validator)
        .arg("--strict")
        .arg(&file)
        .output()
        .expect("runs kubernetes-validate");
    assert!(
        result.status.success(),
        "kubernetes-validate --strict refused the CRD:\n{}\n{}\n{yaml}",
        String::from_utf8_lossy(&result.stdout),
        String::from_utf8_lossy(&result.stderr)
    );
}
