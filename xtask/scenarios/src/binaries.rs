//! The workspace's own binaries that scenarios run as real processes, found next to this
//! scenario binary: `meshwork-agent`, `meshctl` and `meshwork-apiserver` built there first
//! ([`build`]), or any of them (`meshwork-operator`, `meshwork-cni` too) as `cargo xtask
//! bench` built them ([`beside`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};

/// Paths of the binaries a scenario runs.
pub struct Binaries {
    /// `meshwork-agent`.
    pub agent: PathBuf,
    /// `meshctl`.
    pub meshctl: PathBuf,
    /// `meshwork-apiserver`.
    pub apiserver: PathBuf,
}

/// Builds `meshwork-agent`, `meshctl` and `meshwork-apiserver` with the profile this binary was built with (a
/// no-op when they are up to date, so the demo never runs a stale agent), then returns their
/// paths next to this binary.
///
/// When the workspace is not where this binary was built from, the binaries must already
/// be next to it.
pub fn build() -> anyhow::Result<Binaries> {
    let exe = std::env::current_exe().context("finding the scenario binary's path")?;
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    if workspace.join("Cargo.toml").is_file() {
        cargo_build(&workspace, &exe)?;
    }
    built()
}

/// The paths of `meshwork-agent`, `meshctl` and `meshwork-apiserver` next to this binary,
/// without building them: for a test, whose workspace build already put them there. (A
/// build from a test would compile them a second time: the test build's features differ,
/// tokio's `test-util` among them.)
pub fn built() -> anyhow::Result<Binaries> {
    let exe = std::env::current_exe().context("finding the scenario binary's path")?;
    let binaries = Binaries {
        agent: exe.with_file_name("meshwork-agent"),
        meshctl: exe.with_file_name("meshctl"),
        apiserver: exe.with_file_name("meshwork-apiserver"),
    };
    for path in [&binaries.agent, &binaries.meshctl, &binaries.apiserver] {
        if !path.is_file() {
            bail!(
                "{} is missing: build it with `cargo build -p meshwork-agent -p meshctl -p meshwork-apiserver` \
                 (into the target directory of {})",
                path.display(),
                exe.display()
            );
        }
    }
    Ok(binaries)
}

/// `cargo build -p meshwork-agent -p meshctl -p meshwork-apiserver` in `workspace`, with the profile `exe` was
/// built with (its directory is `target/<profile dir>/`).
fn cargo_build(workspace: &Path, exe: &Path) -> anyhow::Result<()> {
    let profile = match exe
        .parent()
        .and_then(Path::file_name)
        .and_then(|name| name.to_str())
    {
        Some("debug") | None => "dev",
        Some(other) => other,
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(&cargo);
    command
        .current_dir(workspace)
        .args(["build", "--quiet", "--profile", profile])
        .args(["--package", "meshwork-agent", "--package", "meshctl"])
        .args(["--package", "meshwork-apiserver"])
        // The package set `cargo xtask demo|proof` builds: the same set unifies features the
        // same way, so this build is a no-op there instead of a second set of dependencies.
        .args(["--package", "meshwork-scenarios"]);
    print!(
        "Building meshwork-agent, meshctl and meshwork-apiserver (cargo build, profile {profile}) ... "
    );
    // Shown before cargo's own output, if it has any.
    std::io::Write::flush(&mut std::io::stdout()).context("writing to stdout")?;
    let started = Instant::now();
    let status = command
        .status()
        .with_context(|| format!("running {command:?}"))?;
    if !status.success() {
        println!("failed");
        bail!(
            "`cargo build -p meshwork-agent -p meshctl -p meshwork-apiserver` in {} failed ({status})",
            workspace.display()
        );
    }
    println!("done in {:.1} s\n", started.elapsed().as_secs_f64());
    Ok(())
}

/// The workspace binary `name` next to this scenario binary (`cargo xtask bench` builds
/// what each benchmark runs first); an error naming the build when it is missing.
pub fn beside(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("finding the scenario binary's path")?;
    let path = exe.with_file_name(name);
    if !path.is_file() {
        bail!(
            "{} is missing: build it with `cargo build --release -p {name}` (`cargo xtask bench` does)",
            path.display()
        );
    }
    Ok(path)
}
