//! The Python venv in the cache dir: moto's server (a fake EC2 API), boto3,
//! kubernetes-validate, and grpcio with its tools, health and reflection clients (the gRPC
//! client no Meshwork code wrote), on Debian's `/usr/bin/python3`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::cmd;

/// What pip installs into the venv. Changing this list makes the next setup reinstall.
const REQUIREMENTS: &[&str] = &[
    "moto[server,ec2]",
    "boto3",
    "kubernetes-validate",
    "grpcio",
    "grpcio-tools",
    "grpcio-health-checking",
    "grpcio-reflection",
];

/// The Python that makes the venv: Debian's, not pyenv's.
const SYSTEM_PYTHON: &str = "/usr/bin/python3";

/// The file in the venv recording the requirement list it was filled from.
const STAMP: &str = "meshwork-requirements.txt";

/// Imports what the lab uses (moto's server needs flask) and prints the versions.
const IMPORT_CHECK: &str = "import moto, boto3, kubernetes_validate, flask, grpc, grpc_tools, \
                            grpc_health.v1.health_pb2, grpc_reflection.v1alpha.reflection_pb2; \
                            print(f'moto {moto.__version__}, boto3 {boto3.__version__}, \
                            grpcio {grpc.__version__}')";

/// Why the venv is not ready.
pub enum Missing {
    /// There is no venv.
    NoVenv,
    /// The venv lacks packages, or was filled from another requirement list: why.
    Packages(String),
    /// The venv was made by another Python; setup won't delete it on its own.
    Foreign(String),
}

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Missing::NoVenv => f.write_str("no venv"),
            Missing::Packages(why) | Missing::Foreign(why) => f.write_str(why),
        }
    }
}

/// Checks that the venv at `venv` is ready; if so, returns the moto, boto3 and grpcio
/// versions.
pub fn check(venv: &Path) -> Result<String, Missing> {
    if !python(venv).is_file() {
        return Err(Missing::NoVenv);
    }
    if let Some(home) = venv_home(venv)
        && home != Path::new(SYSTEM_PYTHON).parent().unwrap_or(Path::new("/"))
    {
        return Err(Missing::Foreign(format!(
            "{} was made by the Python in {}, not {SYSTEM_PYTHON}; remove it and run setup again",
            venv.display(),
            home.display()
        )));
    }
    match std::fs::read_to_string(venv.join(STAMP)) {
        Ok(stamp) if stamp == stamp_text() => {}
        Ok(_) => return Err(Missing::Packages("requirement list changed".to_owned())),
        Err(_) => return Err(Missing::Packages(format!("no {STAMP}"))),
    }
    import_check(venv).map_err(Missing::Packages)
}

/// Makes the venv ready, given what [`check`] found missing; returns what `check` would.
pub fn ensure(venv: &Path, missing: &Missing) -> Result<String, String> {
    match missing {
        Missing::Foreign(why) => return Err(why.clone()),
        Missing::NoVenv => {
            eprintln!("creating the venv at {}", venv.display());
            create(venv)?;
        }
        Missing::Packages(why) => eprintln!("updating the venv at {} ({why})", venv.display()),
    }
    pip_install(venv)?;
    let detail = import_check(venv).map_err(|why| format!("after pip install: {why}"))?;
    std::fs::write(venv.join(STAMP), stamp_text())
        .map_err(|err| format!("cannot write {}: {err}", venv.join(STAMP).display()))?;
    Ok(detail)
}

/// The venv's Python.
fn python(venv: &Path) -> PathBuf {
    venv.join("bin").join("python")
}

/// The stamp file's contents: the requirement list, one per line.
fn stamp_text() -> String {
    REQUIREMENTS.iter().map(|req| format!("{req}\n")).collect()
}

/// The directory of the Python that made the venv (`home` in `pyvenv.cfg`).
fn venv_home(venv: &Path) -> Option<PathBuf> {
    let config = std::fs::read_to_string(venv.join("pyvenv.cfg")).ok()?;
    config.lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        (key.trim() == "home").then(|| PathBuf::from(value.trim()))
    })
}

/// Creates the venv with Debian's Python.
fn create(venv: &Path) -> Result<(), String> {
    if let Some(parent) = venv.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|err| format!("cannot create {}: {err}", parent.display()))?;
    }
    cmd::run(
        python_command(Path::new(SYSTEM_PYTHON))
            .args(["-m", "venv"])
            .arg(venv),
    )
    .map(drop)
    .map_err(|why| format!("{SYSTEM_PYTHON} -m venv: {why}"))
}

/// Installs [`REQUIREMENTS`] with the venv's pip, quietly.
fn pip_install(venv: &Path) -> Result<(), String> {
    let pip_args = [
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-input",
    ];
    cmd::run(
        python_command(&python(venv))
            .args(pip_args)
            .args(REQUIREMENTS),
    )
    .map(drop)
    .map_err(|why| format!("pip install: {why}"))
}

/// Checks that the venv's Python imports what the lab uses and has `moto_server`; returns
/// the moto, boto3 and grpcio versions.
fn import_check(venv: &Path) -> Result<String, String> {
    let moto_server = venv.join("bin").join("moto_server");
    if !moto_server.is_file() {
        return Err(format!("{} missing", moto_server.display()));
    }
    // A failed import's last line says what is missing.
    let output = cmd::run_keeping(python_command(&python(venv)).args(["-c", IMPORT_CHECK]), 1)?;
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// A command running `python`, unaffected by the caller's Python environment variables.
fn python_command(python: &Path) -> Command {
    let mut command = Command::new(python);
    command
        .env_remove("PYTHONHOME")
        .env_remove("PYTHONPATH")
        .env_remove("VIRTUAL_ENV")
        .env("PIP_ROOT_USER_ACTION", "ignore");
    command
}
