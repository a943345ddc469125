//! The root filesystem of a `FROM scratch` image, laid out in a build context: binaries at
//! their paths and exactly the shared libraries `ldd` lists for them (the dynamic loader
//! included), in Debian's merged-`/usr` layout (`/lib` → `usr/lib`, as on the host).

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

/// The directories merged into `/usr` on Debian 12, linked as the host links them.
const MERGED: &[(&str, &str)] = &[
    ("lib", "usr/lib"),
    ("lib64", "usr/lib64"),
    ("bin", "usr/bin"),
    ("sbin", "usr/sbin"),
];

/// A root filesystem being laid out under `dir`.
pub struct Rootfs {
    dir: PathBuf,
    /// Libraries already placed (by the path `ldd` named).
    libs: BTreeSet<PathBuf>,
}

impl Rootfs {
    /// An empty root at `dir` (created) with the merged-`/usr` links, `/run`, `/var/run` →
    /// `../run` and a world-writable `/tmp`.
    pub fn new(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut root = Self {
            dir: dir.to_owned(),
            libs: BTreeSet::new(),
        };
        for (link, target) in MERGED {
            std::fs::create_dir_all(dir.join(target))?;
            std::os::unix::fs::symlink(target, dir.join(link))?;
        }
        root.dir_with_mode("run", 0o755)?;
        root.dir_with_mode("var", 0o755)?;
        std::os::unix::fs::symlink("../run", dir.join("var/run"))?;
        root.dir_with_mode("tmp", 0o1777)?;
        Ok(root)
    }

    /// Where `path` (absolute, in the image) lies in the build context.
    pub fn path(&self, path: &str) -> PathBuf {
        self.dir.join(path.trim_start_matches('/'))
    }

    /// Creates the directory `path` with `mode`.
    pub fn dir_with_mode(&mut self, path: &str, mode: u32) -> anyhow::Result<()> {
        use std::os::unix::fs::PermissionsExt as _;
        let at = self.path(path);
        std::fs::create_dir_all(&at).with_context(|| format!("creating {}", at.display()))?;
        std::fs::set_permissions(&at, std::fs::Permissions::from_mode(mode))?;
        Ok(())
    }

    /// Places the executable `host` at `path` in the image, with the libraries it links.
    pub fn binary(&mut self, host: &Path, path: &str) -> anyhow::Result<()> {
        self.file(host, path)?;
        self.libs_of(host)
    }

    /// Places the file `host` (its content, symlinks followed) at `path` in the image.
    pub fn file(&mut self, host: &Path, path: &str) -> anyhow::Result<()> {
        let at = self.path(path);
        place(host, &at)
    }

    /// Writes `content` at `path` in the image.
    pub fn write(&mut self, path: &str, content: &str) -> anyhow::Result<()> {
        let at = self.path(path);
        if let Some(parent) = at.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&at, content).with_context(|| format!("writing {}", at.display()))
    }

    /// A symbolic link at `path` in the image to `target`.
    pub fn symlink(&mut self, target: &str, path: &str) -> anyhow::Result<()> {
        let at = self.path(path);
        if let Some(parent) = at.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::os::unix::fs::symlink(target, &at)
            .with_context(|| format!("linking {} to {target}", at.display()))
    }

    /// Places the shared libraries `ldd` lists for `host` (an executable or a library): each
    /// at the path `ldd` names, under its directory as merged into `/usr`. A static
    /// executable links none.
    pub fn libs_of(&mut self, host: &Path) -> anyhow::Result<()> {
        for lib in ldd(host)? {
            if self.libs.insert(lib.clone()) {
                let at = self.dir.join(merged(&lib)?);
                place(&lib, &at)?;
            }
        }
        Ok(())
    }
}

/// The libraries `ldd` lists for `path` (the loader included; the vDSO is no file).
pub fn ldd(path: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(path)
        .output()
        .context("running ldd (Debian's libc-bin)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        // A static executable: `not a dynamic executable` (on stdout or stderr).
        let all = format!("{text}{}", String::from_utf8_lossy(&out.stderr));
        if all.contains("not a dynamic executable") || all.contains("statically linked") {
            return Ok(Vec::new());
        }
        bail!("ldd {}: {}", path.display(), all.trim());
    }
    let mut libs = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.contains("=> not found") {
            bail!("ldd {}: {line}", path.display());
        }
        let file = match line.split_once("=>") {
            Some((_, rest)) => rest.trim(),
            None => line,
        };
        let file = file.split(" (").next().unwrap_or_default().trim();
        if file.starts_with('/') {
            libs.push(PathBuf::from(file));
        }
    }
    Ok(libs)
}

/// `path` (absolute, on the host) with its directory resolved as the host resolves it
/// (`/lib/x86_64-linux-gnu` is `/usr/lib/x86_64-linux-gnu`), relative to the root.
fn merged(path: &Path) -> anyhow::Result<PathBuf> {
    let parent = path.parent().context("a library at the root")?;
    let name = path.file_name().context("a library without a name")?;
    let parent =
        std::fs::canonicalize(parent).with_context(|| format!("resolving {}", parent.display()))?;
    Ok(parent
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect::<PathBuf>()
        .join(name))
}

/// Places `host`'s content at `at`: a hard link to the real file where possible, else a copy.
fn place(host: &Path, at: &Path) -> anyhow::Result<()> {
    let real =
        std::fs::canonicalize(host).with_context(|| format!("resolving {}", host.display()))?;
    if let Some(parent) = at.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    if std::fs::hard_link(&real, at).is_err() {
        std::fs::copy(&real, at)
            .with_context(|| format!("copying {} to {}", real.display(), at.display()))?;
    }
    Ok(())
}
