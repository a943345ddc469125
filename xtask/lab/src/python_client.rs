//! The Python gRPC client (`proto/clients/python/check_server.py`, on grpcio from the venv):
//! a client of Meshwork's servers that no Meshwork code wrote.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::paths::venv_python;
use crate::{LabError, Result};

/// The repository's `proto/` directory, which holds `meshwork/` and the client.
fn proto_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto")
}

/// What the client printed: one `ok <check>` or `FAIL <check>: why` line per check.
#[derive(Debug)]
pub struct Checks {
    /// Every check passed (the client exited 0).
    pub passed: bool,
    /// Its standard output and error.
    pub output: String,
}

impl Checks {
    /// Whether a check named `name` passed.
    pub fn passed_check(&self, name: &str) -> bool {
        self.output
            .lines()
            .any(|line| line == format!("ok {name}") || line.starts_with(&format!("ok {name}: ")))
    }
}

/// Runs the client against `target` (`unix:PATH` or `HOST:PORT`); `component` is its
/// subcommand and arguments (`["agent", "--clusters", "1"]`, `["operator", "--node", "n"]`).
pub fn check_server(target: &str, component: &[&str]) -> Result<Checks> {
    let python = venv_python()?;
    let script = proto_dir().join("clients/python/check_server.py");
    let output = Command::new(&python)
        .arg(&script)
        .arg("--proto-dir")
        .arg(proto_dir())
        .args(["--target", target])
        .args(component)
        .env_remove("PYTHONPATH")
        .stdin(Stdio::null())
        .output()
        .map_err(LabError::io(format!("running {}", script.display())))?;
    Ok(Checks {
        passed: output.status.success(),
        output: format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    })
}
