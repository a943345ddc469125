//! The node's own cgroup2 mount, where the agent attaches its socket-LB programs. Attached at
//! a hierarchy's root, those programs run for every process under it: with the host's cgroup
//! namespace (Docker's default on a cgroup-v1 host) a fresh cgroup2 mount shows the machine's
//! root, and the hooks would translate every connect on the machine. So the mount is made
//! only after checking that this container has a cgroup namespace of its own, and used only
//! if it then lists this container's processes alone.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context as _, bail, ensure};
use nix::mount::{MsFlags, mount};
use nix::sys::statfs::{CGROUP2_SUPER_MAGIC, statfs};

/// Mounts cgroup2 at `dir` (unless one is there) after checking that this process sits at
/// the root of its cgroup namespace, then checks that every process the mount lists is one
/// of this container's (a process of another PID namespace reads as PID 0); returns how many
/// it lists.
pub fn mount_private(dir: &Path) -> anyhow::Result<usize> {
    let own = std::fs::read_to_string("/proc/self/cgroup").context("reading /proc/self/cgroup")?;
    let unified = own
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .context("/proc/self/cgroup has no cgroup2 line")?;
    ensure!(
        unified == "/",
        "this container sees itself in cgroup {unified:?} of the cgroup2 hierarchy, not at the \
         root of a cgroup namespace of its own: its cgroup namespace is the host's (run dockerd \
         with --default-cgroupns-mode private, as `cargo xtask setup` does); socket-LB must not \
         attach there"
    );
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mounted = statfs(dir).is_ok_and(|fs| fs.filesystem_type() == CGROUP2_SUPER_MAGIC);
    if !mounted {
        mount(
            Some("none"),
            dir,
            Some("cgroup2"),
            MsFlags::empty(),
            None::<&str>,
        )
        .with_context(|| format!("mounting cgroup2 at {}", dir.display()))?;
    }
    let pids = pids_under(dir)?;
    if let Some(pid) = pids
        .iter()
        .find(|pid| !Path::new("/proc").join(pid.to_string()).exists())
    {
        bail!(
            "the cgroup2 mount at {} lists process {pid}, which is not this container's: \
             refusing to let socket-LB attach there",
            dir.display()
        );
    }
    ensure!(
        pids.contains(&std::process::id()),
        "the cgroup2 mount at {} does not list this process",
        dir.display()
    );
    Ok(pids.len())
}

/// Every PID in `cgroup.procs` of `dir` and of the cgroups below it.
fn pids_under(dir: &Path) -> anyhow::Result<BTreeSet<u32>> {
    let mut pids = BTreeSet::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(cgroup) = pending.pop() {
        let procs = cgroup.join("cgroup.procs");
        let text = std::fs::read_to_string(&procs)
            .with_context(|| format!("reading {}", procs.display()))?;
        for line in text.lines() {
            pids.insert(
                line.trim()
                    .parse()
                    .with_context(|| format!("{}: {line:?}", procs.display()))?,
            );
        }
        for entry in std::fs::read_dir(&cgroup)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                pending.push(entry.path());
            }
        }
    }
    Ok(pids)
}
