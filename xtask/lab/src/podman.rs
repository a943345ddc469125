//! A real CNI runtime for tests: Debian's podman with its CNI network backend, running the
//! plugins of a conflist exactly as a kubelet's runtime would.
//!
//! Everything podman keeps is private to one [`Podman`]: its `containers.conf`
//! (`CONTAINERS_CONF`), the conflists, the storage (`--root`, `--runroot`, the `vfs` driver)
//! and the container's root filesystem (`--rootfs`, no image, no registry). Nothing under
//! `/etc/containers` or `/var/lib/containers` is read or changed; the one shared place is
//! libcni's result cache, `/var/lib/cni/results` (podman offers no other), whose entry for a
//! container DEL removes.
//!
//! Podman runs inside a lab namespace (a node), so the plugin it runs puts the host end of a
//! pod's veth there and never in the machine's root namespace. It is entered with `nsenter`
//! (only the network namespace changes): `ip netns exec` remounts `/sys`, which hides the
//! cgroup mounts the runtime needs. The runtime is runc: this host's cgroups are hybrid with a
//! controller on the v2 side, which crun refuses.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::net::{Netns, command_in};
use crate::{LabError, Result, paths, process};

/// The program every container runs: it only has to keep the pod's namespace alive.
const SLEEP: &str = "/bin/sleep";

/// One private podman installation.
#[derive(Debug)]
pub struct Podman {
    dir: tempfile::TempDir,
    podman: PathBuf,
    /// Containers started and not yet removed: (namespace path, container ID).
    running: Vec<(PathBuf, String)>,
}

/// A running container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    /// Podman's container ID (what a CNI plugin sees as `CNI_CONTAINERID`).
    pub id: String,
    /// Its network namespace (`CNI_NETNS`).
    pub netns: PathBuf,
}

impl Podman {
    /// A podman whose CNI backend finds plugins in `plugin_dirs` (then in Debian's
    /// `/usr/lib/cni`).
    pub fn new(plugin_dirs: &[&Path]) -> Result<Self> {
        let podman = paths::find_program("podman")?;
        paths::find_program("runc")?;
        let dir = tempfile::Builder::new()
            .prefix("meshwork-podman-")
            .tempdir()
            .map_err(LabError::io("creating podman's directory"))?;
        let root = dir.path();
        for sub in ["net.d", "root", "runroot"] {
            std::fs::create_dir_all(root.join(sub))
                .map_err(LabError::io(format!("creating podman's {sub}")))?;
        }
        make_rootfs(&root.join("rootfs"))?;
        let mut dirs: Vec<String> = plugin_dirs
            .iter()
            .map(|d| format!("{:?}", d.display().to_string()))
            .collect();
        dirs.push("\"/usr/lib/cni\"".to_owned());
        // default_ulimits: podman's defaults need CAP_SYS_RESOURCE, which this machine lacks.
        let conf = format!(
            "[containers]\ndefault_ulimits = []\n\n[network]\nnetwork_backend = \"cni\"\n\
             cni_plugin_dirs = [{}]\nnetwork_config_dir = {:?}\n",
            dirs.join(", "),
            root.join("net.d").display().to_string(),
        );
        std::fs::write(root.join("containers.conf"), conf)
            .map_err(LabError::io("writing podman's containers.conf"))?;
        Ok(Self {
            dir,
            podman,
            running: Vec::new(),
        })
    }

    /// Adds the conflist `network` (its `name` is what [`Podman::run`] takes).
    pub fn add_network(&self, name: &str, conflist: &serde_json::Value) -> Result<PathBuf> {
        let path = self
            .dir
            .path()
            .join("net.d")
            .join(format!("{name}.conflist"));
        let text =
            serde_json::to_string_pretty(conflist).map_err(|err| LabError::CommandFailed {
                command: format!("conflist {name}"),
                detail: err.to_string(),
            })?;
        std::fs::write(&path, text).map_err(LabError::io(format!("writing {}", path.display())))?;
        Ok(path)
    }

    /// Starts a container on `network` from inside the node namespace `node`: podman runs the
    /// network's plugins (ADD) before the container starts, and fails when one fails.
    pub fn run(&mut self, node: &Netns, network: &str, name: &str) -> Result<Container> {
        let mut command = self.command(node.path());
        command.args(["run", "--detach", "--name", name, "--network", network]);
        command.arg("--rootfs").arg(self.dir.path().join("rootfs"));
        command.args([SLEEP, "infinity"]);
        let id = process::run(&mut command)?.trim().to_owned();
        self.running.push((node.path().to_owned(), id.clone()));
        let netns = self.sandbox(node, &id)?;
        Ok(Container { id, netns })
    }

    /// Stops and removes a container: podman runs the plugins' DEL first.
    pub fn remove(&mut self, node: &Netns, id: &str) -> Result<()> {
        self.running.retain(|(_, running)| running != id);
        let mut command = self.command(node.path());
        command.args(["rm", "--force", "--time", "0", id]);
        process::run(&mut command).map(drop)
    }

    /// The container's network namespace.
    fn sandbox(&self, node: &Netns, id: &str) -> Result<PathBuf> {
        let mut command = self.command(node.path());
        command.args(["inspect", "--format", "{{.NetworkSettings.SandboxKey}}", id]);
        let path = process::run(&mut command)?.trim().to_owned();
        if path.is_empty() {
            return Err(LabError::CommandFailed {
                command: format!("podman inspect {id}"),
                detail: "the container has no network namespace".to_owned(),
            });
        }
        Ok(PathBuf::from(path))
    }

    /// `podman` with this installation's private state, inside the namespace at `netns`.
    fn command(&self, netns: &Path) -> Command {
        let root = self.dir.path();
        let mut command = command_in(netns, &self.podman);
        command
            .arg("--root")
            .arg(root.join("root"))
            .arg("--runroot")
            .arg(root.join("runroot"))
            .args([
                "--storage-driver",
                "vfs",
                "--cgroup-manager",
                "cgroupfs",
                "--events-backend",
                "none",
                "--runtime",
                "runc",
            ])
            .env("CONTAINERS_CONF", root.join("containers.conf"));
        command
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        for (netns, id) in std::mem::take(&mut self.running) {
            let mut command = self.command(&netns);
            command.args(["rm", "--force", "--time", "0", &id]);
            if let Err(err) = process::run(&mut command) {
                tracing::warn!(%id, %err, "removing a podman container");
            }
        }
    }
}

/// A root filesystem holding `sleep` and the libraries it links.
fn make_rootfs(rootfs: &Path) -> Result<()> {
    let ldd = process::run(Command::new(paths::find_program("ldd")?).arg(SLEEP))?;
    let libraries = ldd
        .split_whitespace()
        .filter(|word| word.starts_with('/'))
        .map(str::to_owned);
    for file in std::iter::once(SLEEP.to_owned()).chain(libraries) {
        let source = Path::new(&file);
        let target = rootfs.join(source.strip_prefix("/").unwrap_or(source));
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .map_err(LabError::io(format!("creating {}", parent.display())))?;
        }
        std::fs::copy(source, &target)
            .map_err(LabError::io(format!("copying {file} into the rootfs")))?;
    }
    Ok(())
}
