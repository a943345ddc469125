//! Installing Debian packages with apt-get.

use std::collections::HashMap;
use std::process::Command;

use super::{cmd, probe};

/// `apt-get install`'s arguments before the package names.
const INSTALL: &[&str] = &["install", "-y", "--no-install-recommends"];

/// Installs `packages`: `apt-get update` once, then one `apt-get install` for all of them;
/// if that fails, each package on its own, so that the result says which failed and why.
pub fn install(packages: &[&'static str]) -> HashMap<&'static str, Result<(), String>> {
    eprintln!("apt-get update");
    if let Err(why) = cmd::run(apt_get().arg("update")) {
        eprintln!("apt-get update failed (trying to install anyway): {why}");
    }
    eprintln!("apt-get install {}", packages.join(" "));
    if cmd::run(apt_get().args(INSTALL).args(packages)).is_ok() {
        return packages.iter().map(|&package| (package, Ok(()))).collect();
    }
    eprintln!("apt-get install failed; retrying the packages one by one");
    packages
        .iter()
        .map(|&package| {
            let outcome = cmd::run(apt_get().args(INSTALL).arg(package)).map(drop);
            (package, outcome)
        })
        .collect()
}

/// A quiet, non-interactive `apt-get` that waits for a busy dpkg lock and has the sbin
/// directories on its `PATH` (dpkg needs them).
fn apt_get() -> Command {
    let mut command = Command::new("apt-get");
    command
        .env("DEBIAN_FRONTEND", "noninteractive")
        .env("PATH", probe::full_path())
        .args(["-qq", "-o", "DPkg::Lock::Timeout=300"]);
    command
}
