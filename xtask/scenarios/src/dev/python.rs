//! The moto image's Python: Debian's interpreter and standard library, a venv at
//! `/opt/venv` holding exactly the distributions `moto[server,ec2]` requires (their
//! requirement closure, read from the setup venv's metadata), the lab's patch module
//! (`meshwork_moto`) at `/opt/meshwork/moto`, and the shared libraries `ldd` lists for the
//! interpreter and every extension module among them.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};
use meshwork_lab::moto::MotoServer;

use super::rootfs::Rootfs;

/// The interpreter (what the setup venv's `python3` resolves to).
const PYTHON: &str = "/usr/bin/python3.11";
/// Its standard library.
const STDLIB: &str = "/usr/lib/python3.11";
/// The venv in the image.
pub const VENV: &str = "/opt/venv";
/// The patch module's directory in the image (on `PYTHONPATH`).
pub const MOTO_DIR: &str = "/opt/meshwork/moto";
/// What the image runs.
pub const REQUIREMENT: &str = "moto[server,ec2]";

/// Prints the files (absolute paths) of every distribution in the requirement closure of
/// `sys.argv[1]`, extras and environment markers evaluated as pip evaluates them.
const CLOSURE: &str = r#"
import json, sys
from importlib import metadata
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name

seen, files, todo = {}, set(), [Requirement(sys.argv[1])]
while todo:
    req = todo.pop()
    name, extras = canonicalize_name(req.name), set(req.extras)
    if name in seen and extras <= seen[name]:
        continue
    seen.setdefault(name, set()).update(extras)
    dist = metadata.distribution(req.name)
    files.update(str(dist.locate_file(f)) for f in dist.files or [])
    for text in dist.requires or []:
        sub = Requirement(text)
        if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in seen[name] | {""}):
            todo.append(sub)
print(json.dumps({"distributions": sorted(seen), "files": sorted(files)}))
"#;

/// Lays the Python side of the moto image into `root`; how many distributions it holds.
pub fn lay_out(root: &mut Rootfs) -> anyhow::Result<usize> {
    let venv_python = meshwork_lab::paths::venv_python()?;
    let venv = venv_python
        .parent()
        .and_then(Path::parent)
        .context("the venv of the setup's python")?
        .to_owned();
    let site = venv.join("lib/python3.11/site-packages");
    anyhow::ensure!(
        site.is_dir(),
        "{} is missing: the venv is not Python 3.11's",
        site.display()
    );
    let out = Command::new(&venv_python)
        .args(["-c", CLOSURE, REQUIREMENT])
        .env_remove("PYTHONPATH")
        .output()
        .context("reading the venv's metadata")?;
    if !out.status.success() {
        bail!(
            "the requirement closure of {REQUIREMENT}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let closure: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let distributions = closure["distributions"].as_array().map_or(0, Vec::len);
    let image_site = format!("{VENV}/lib/python3.11/site-packages");
    let mut extensions: Vec<PathBuf> = Vec::new();
    for file in closure["files"].as_array().into_iter().flatten() {
        let host = PathBuf::from(file.as_str().unwrap_or_default());
        // Scripts and data outside site-packages (bin/) are not imported by the server.
        let Ok(relative) = host.strip_prefix(&site) else {
            continue;
        };
        if !host.is_file() {
            continue;
        }
        root.file(&host, &format!("{image_site}/{}", relative.display()))?;
        if is_extension(&host) {
            extensions.push(host);
        }
    }
    root.binary(Path::new(PYTHON), PYTHON)?;
    copy_tree(root, Path::new(STDLIB), STDLIB, &mut extensions)?;
    for extension in &extensions {
        root.libs_of(extension)?;
    }
    root.symlink(PYTHON, &format!("{VENV}/bin/python"))?;
    root.write(
        &format!("{VENV}/pyvenv.cfg"),
        "home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11\n",
    )?;
    let moto = MotoServer::moto_dir().join("meshwork_moto");
    copy_tree(
        root,
        &moto,
        &format!("{MOTO_DIR}/meshwork_moto"),
        &mut Vec::new(),
    )?;
    Ok(distributions)
}

/// Whether `path` is an extension module or a shared library.
fn is_extension(path: &Path) -> bool {
    path.file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| name.ends_with(".so") || name.contains(".so."))
}

/// Copies the directory `host` to `at` in the image (tests and caches of other Pythons
/// left out), noting the extension modules in it.
fn copy_tree(
    root: &mut Rootfs,
    host: &Path,
    at: &str,
    extensions: &mut Vec<PathBuf>,
) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(host).with_context(|| format!("listing {}", host.display()))? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name == "test" || name == "tests" {
            continue;
        }
        let path = entry.path();
        let target = format!("{at}/{name}");
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_tree(root, &path, &target, extensions)?;
        } else if kind.is_file() || path.is_file() {
            root.file(&path, &target)?;
            if is_extension(&path) {
                extensions.push(path);
            }
        }
    }
    Ok(())
}
