//! The overlays, rendered with `kubectl kustomize` and validated with
//! `kubernetes-validate --strict` (both offline).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The overlays of `deploy/kubernetes/overlays`: two meshed clusters and one on its own.
pub const OVERLAYS: &[&str] = &["mesh-1", "mesh-2", "eni"];

/// The Kubernetes version the manifests are validated against (k8s-openapi's `v1_33`, the
/// API the operator is built for).
pub const KUBERNETES_VERSION: &str = "1.33.0";

/// Why rendering or validating failed.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// The program could not be run.
    #[error("running {program}: {error}")]
    Run {
        /// The program.
        program: String,
        /// Why.
        error: std::io::Error,
    },
    /// It ran and failed.
    #[error("{command} failed ({status}):\n{output}")]
    Failed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// Its stdout and stderr.
        output: String,
    },
}

/// `deploy/kubernetes`.
pub fn kubernetes_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../kubernetes")
}

/// `deploy/kubernetes/overlays/<name>`.
pub fn overlay_dir(name: &str) -> PathBuf {
    kubernetes_dir().join("overlays").join(name)
}

/// `kubectl`: on `PATH`, else Debian's `/usr/bin/kubectl`.
pub fn kubectl() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("kubectl"))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| PathBuf::from("/usr/bin/kubectl"))
}

fn run(command: &mut Command) -> Result<String, RenderError> {
    let line = format!("{command:?}");
    let output = command.output().map_err(|error| RenderError::Run {
        program: line.clone(),
        error,
    })?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() {
        return Ok(stdout);
    }
    Err(RenderError::Failed {
        command: line,
        status: output.status,
        output: format!("{stdout}{}", String::from_utf8_lossy(&output.stderr)),
    })
}

/// `kubectl kustomize DIR`: the rendering as YAML.
pub fn kustomize(dir: &Path) -> Result<String, RenderError> {
    run(Command::new(kubectl()).arg("kustomize").arg(dir))
}

/// `kubernetes-validate --strict` of `file` against [`KUBERNETES_VERSION`]; its report.
pub fn validate(validator: &Path, file: &Path) -> Result<String, RenderError> {
    run(Command::new(validator)
        .arg("--strict")
        .args(["--kubernetes-version", KUBERNETES_VERSION])
        .arg(file))
}
