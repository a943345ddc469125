//! Where the lab finds programs and its cache.

use std::path::{Path, PathBuf};

use crate::{LabError, Result};

/// The cache directory shared with `cargo xtask setup`: `$MESHWORK_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/meshwork`, else `$HOME/.cache/meshwork`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("MESHWORK_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("meshwork");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache").join("meshwork")
}

/// The Python venv made by `cargo xtask setup` (moto, boto3, kubernetes-validate, grpcio).
pub fn venv_dir() -> PathBuf {
    cache_dir().join("venv")
}

/// The venv's Python interpreter, or an error naming `cargo xtask setup`.
pub fn venv_python() -> Result<PathBuf> {
    let python = venv_dir().join("bin").join("python");
    if python.exists() {
        Ok(python)
    } else {
        Err(LabError::MissingVenv { path: venv_dir() })
    }
}

/// Finds `program` on `PATH` (and in the sbin directories, which root's PATH may lack).
pub fn find_program(program: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let extra = ["/usr/sbin", "/sbin", "/usr/local/sbin"].map(PathBuf::from);
    std::env::split_paths(&path)
        .chain(extra)
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| LabError::MissingProgram {
            program: program.to_owned(),
        })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
