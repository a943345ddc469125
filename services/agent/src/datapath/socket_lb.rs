//! Socket-LB as the agent runs it (`--bpf-lb-sock`, Cilium's flag): the node's cgroup2 root
//! (`--cgroup-root`, mounted there if nothing is), then the programs attached to it with their
//! links pinned, replacing the previous agent's; turned off, the pinned links are removed.

use std::path::{Path, PathBuf};

use meshwork_datapath::maps::PinDir;
use meshwork_datapath::socket_lb::{self, SocketLbError};

/// Socket-LB flags.
#[derive(Debug, Clone, clap::Args)]
pub struct SocketLbArgs {
    /// Translate global services' frontends to backends at the socket (connect, sendmsg,
    /// recvmsg, getpeername programs on `--cgroup-root`), as Cilium's socket-LB. The programs
    /// stay attached, through pinned links, while the agent is down or restarting.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub bpf_lb_sock: bool,

    /// The cgroup2 directory socket-LB attaches to: every process below it is translated. On a
    /// node, the host's cgroup2 root; cgroup2 is mounted here when nothing is.
    #[arg(long, default_value = "/run/meshwork/cgroupv2", value_name = "DIR")]
    pub cgroup_root: PathBuf,
}

impl Default for SocketLbArgs {
    /// Off, with the default `--cgroup-root`.
    fn default() -> Self {
        Self {
            bpf_lb_sock: false,
            cgroup_root: PathBuf::from("/run/meshwork/cgroupv2"),
        }
    }
}

/// Why socket-LB could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// The cgroup root is not a cgroup2 mount and mounting one failed.
    #[error("mounting cgroup2 at --cgroup-root {path}: {error}")]
    Mount {
        /// The directory.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The programs could not be attached or detached.
    #[error("socket-LB: {0}")]
    SocketLb(#[from] SocketLbError),
}

/// Whether `path` is the root of a cgroup2 mount.
fn is_cgroup2(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
}

/// Mounts cgroup2 at `path` unless one is there.
fn ensure_cgroup2(path: &Path) -> Result<bool, CgroupError> {
    if is_cgroup2(path) {
        return Ok(false);
    }
    let failed = |error: std::io::Error| CgroupError::Mount {
        path: path.to_owned(),
        error,
    };
    std::fs::create_dir_all(path).map_err(failed)?;
    nix::mount::mount(
        Some("none"),
        path,
        Some("cgroup2"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|errno| failed(errno.into()))?;
    Ok(true)
}

/// Attaches socket-LB (or, when off, removes what a previous agent attached).
pub fn setup(args: &SocketLbArgs, bpf_root: &Path, pins: &PinDir) -> Result<(), CgroupError> {
    let links = socket_lb::links_dir(bpf_root);
    if !args.bpf_lb_sock {
        let removed = socket_lb::detach(&links)?;
        if removed > 0 {
            tracing::info!(removed, links = %links.display(), "socket-LB is off: removed the previous agent's programs");
        }
        return Ok(());
    }
    if ensure_cgroup2(&args.cgroup_root)? {
        tracing::info!(cgroup_root = %args.cgroup_root.display(), "mounted cgroup2");
    }
    let attached = socket_lb::attach(pins, &links, &args.cgroup_root)?;
    tracing::info!(
        cgroup_root = %attached.cgroup.display(),
        replaced = attached.replaced,
        links = %links.display(),
        "socket-LB attached (connect4, sendmsg4, recvmsg4, getpeername4)"
    );
    Ok(())
}
