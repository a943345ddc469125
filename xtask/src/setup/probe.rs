//! Telling whether a component is present, by the program or file its package provides.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::cmd;

/// Directories searched for programs besides `PATH` (root's `PATH` may lack the sbin ones,
/// where `bpftool`, `nft` and `ip` live).
const EXTRA_DIRS: &[&str] = &["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"];

/// The longest version detail shown in the report.
const MAX_DETAIL: usize = 60;

/// Something setup installs from Debian.
pub struct Component {
    /// Its name in the report.
    pub name: &'static str,
    /// The Debian package providing it.
    pub package: &'static str,
    /// How to tell whether it is present.
    check: Check,
}

/// How to tell whether a component is present.
enum Check {
    /// Any of `programs` is found; its version comes from running it with `version_args`.
    Program {
        /// Programs the package provides; one is enough.
        programs: &'static [&'static str],
        /// Arguments that make the program print its version.
        version_args: &'static [&'static str],
    },
    /// This file exists.
    File(&'static str),
    /// Debian's `/usr/bin/python3` can make venvs (its `ensurepip` is installed).
    PythonVenv,
}

/// What a probe found.
pub enum Probe {
    /// Present, with a detail to show (usually its version), if one was cheap to get.
    Present(Option<String>),
    /// Missing: what was looked for and not found.
    Missing(String),
}

impl Probe {
    /// Whether the component is present.
    pub fn is_present(&self) -> bool {
        matches!(self, Probe::Present(_))
    }
}

impl Component {
    /// A component detected by any of `programs`; `version_args` print its version.
    pub const fn program(
        name: &'static str,
        package: &'static str,
        programs: &'static [&'static str],
        version_args: &'static [&'static str],
    ) -> Self {
        let check = Check::Program {
            programs,
            version_args,
        };
        Self {
            name,
            package,
            check,
        }
    }

    /// A component detected by the file at `path`.
    pub const fn file(name: &'static str, package: &'static str, path: &'static str) -> Self {
        Self {
            name,
            package,
            check: Check::File(path),
        }
    }

    /// The component that lets `/usr/bin/python3 -m venv` work.
    pub const fn python_venv(name: &'static str, package: &'static str) -> Self {
        Self {
            name,
            package,
            check: Check::PythonVenv,
        }
    }

    /// Looks for the component.
    pub fn probe(&self) -> Probe {
        match self.check {
            Check::Program {
                programs,
                version_args,
            } => match programs.iter().find_map(|program| find_program(program)) {
                Some(path) => Probe::Present(version_line(&path, version_args)),
                None => Probe::Missing(format!("{} not found", programs.join(" or "))),
            },
            Check::File(path) if Path::new(path).is_file() => {
                Probe::Present(package_version(self.package))
            }
            Check::File(path) => Probe::Missing(format!("{path} missing")),
            Check::PythonVenv => match python_ensurepip() {
                Ok(()) => Probe::Present(package_version(self.package)),
                Err(why) => Probe::Missing(why),
            },
        }
    }
}

/// `PATH` plus the [`EXTRA_DIRS`] it lacks: for finding programs and for running apt-get
/// (dpkg needs `ldconfig` and `start-stop-daemon` from the sbin directories).
pub fn full_path() -> OsString {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    for extra in EXTRA_DIRS.iter().map(PathBuf::from) {
        if !dirs.contains(&extra) {
            dirs.push(extra);
        }
    }
    std::env::join_paths(dirs).unwrap_or(path)
}

/// Finds `program` in [`full_path`].
fn find_program(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&full_path())
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
}

/// Whether `path` is an executable file.
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// The version `program` prints for `args`: its first line with a digit, shortened.
fn version_line(program: &Path, args: &[&str]) -> Option<String> {
    let output = cmd::run(Command::new(program).args(args)).ok()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let line = stdout
        .lines()
        .chain(stderr.lines())
        .find(|line| line.chars().any(|c| c.is_ascii_digit()))?;
    Some(shorten(line))
}

/// Drops a version line's trailing remarks (` (…)`, ` - url`) and a leading program path.
fn shorten(line: &str) -> String {
    let line = line.split(" (").next().unwrap_or(line);
    let line = line.split(" - ").next().unwrap_or(line).trim();
    let line = match line.split_once(' ') {
        Some((first, rest)) if first.starts_with('/') => {
            let program = Path::new(first).file_name().unwrap_or_default();
            format!("{} {rest}", program.to_string_lossy())
        }
        _ => line.to_owned(),
    };
    line.chars().take(MAX_DETAIL).collect()
}

/// `<package> <version>` as dpkg knows it, if installed.
fn package_version(package: &str) -> Option<String> {
    let output =
        cmd::run(Command::new("dpkg-query").args(["-W", "-f=${Version}", package])).ok()?;
    let version = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    (!version.is_empty()).then(|| format!("{package} {version}"))
}

/// Checks that Debian's `/usr/bin/python3` exists and has its `ensurepip` (the part of
/// python3-venv that `python3 -m venv` needs).
fn python_ensurepip() -> Result<(), String> {
    let python = Path::new("/usr/bin/python3");
    if !is_executable(python) {
        return Err(format!("{} not found", python.display()));
    }
    // /usr/bin/python3 -> python3.11; its ensurepip is /usr/lib/python3.11/ensurepip.
    let Ok(target) = std::fs::read_link(python) else {
        return dpkg_says_installed("python3-venv");
    };
    let version = target.file_name().unwrap_or_default();
    let ensurepip = Path::new("/usr/lib")
        .join(version)
        .join("ensurepip/__init__.py");
    if ensurepip.is_file() {
        Ok(())
    } else {
        Err(format!("{} missing", ensurepip.display()))
    }
}

/// Whether dpkg has `package` installed (only where no file says it better).
fn dpkg_says_installed(package: &str) -> Result<(), String> {
    let status = cmd::run(Command::new("dpkg-query").args(["-W", "-f=${Status}", package]));
    match status {
        Ok(output) if String::from_utf8_lossy(&output.stdout).ends_with(" installed") => Ok(()),
        _ => Err(format!("{package} not installed")),
    }
}
