//! Socket-LB (§10): the cgroup `sock_addr` programs of `bpf/sock_lb.c`, which translate a
//! service's frontend to a backend at `connect(2)` and `sendmsg(2)` and back at `recvmsg(2)`
//! and `getpeername(2)`, reading the pinned lb4 maps the agent writes.
//!
//! They attach to a cgroup2 directory (the node's `--cgroup-root`) through BPF links pinned at
//! Cilium's path, `<bpf-root>/cilium/socketlb/links/cgroup/<program>`, so they keep
//! translating while the agent is down. A restarted agent attaches its programs next to the
//! running ones, then renames each new link's pin over the old one: the old link goes with its
//! last reference (once the kernel frees the pin's inode, after an RCU grace period), and a
//! socket never finds the cgroup without a program. Both running for a moment is harmless: the
//! second sees a backend, which is no frontend, and leaves it alone. (Cilium swaps the program
//! inside the pinned link with `BPF_LINK_UPDATE`, which aya 0.14 does not offer.)

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use aya::EbpfLoader;
use aya::programs::links::FdLink;
use aya::programs::{CgroupAttachMode, CgroupSockAddr, ProgramError};

use super::maps::{MapsError, PinDir};

/// The socket-LB object file, built from `bpf/sock_lb.c` by the build script.
pub static SOCKET_LB_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sock_lb.o"));

/// The programs, by Cilium's names: connect4, sendmsg4, recvmsg4, getpeername4.
pub const PROGRAMS: [&str; 4] = [
    "cil_sock4_connect",
    "cil_sock4_sendmsg",
    "cil_sock4_recvmsg",
    "cil_sock4_getpeername",
];

/// Why socket-LB could not be attached or detached.
#[derive(Debug, thiserror::Error)]
pub enum SocketLbError {
    /// A filesystem step (the cgroup, the links' pin directory) failed.
    #[error("{what} {path}: {error}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        error: io::Error,
    },
    /// The object or its maps could not be loaded.
    #[error(transparent)]
    Maps(#[from] MapsError),
    /// A program could not be loaded, attached or pinned.
    #[error("socket-LB program {name}: {error}")]
    Program {
        /// The program.
        name: &'static str,
        /// What failed.
        error: String,
    },
}

/// What [`attach`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attached {
    /// The cgroup the programs run for.
    pub cgroup: PathBuf,
    /// Links a previous agent had pinned, now replaced.
    pub replaced: usize,
}

/// `<bpf_root>/cilium/socketlb/links/cgroup`, where the links are pinned (Cilium's path).
pub fn links_dir(bpf_root: &Path) -> PathBuf {
    bpf_root
        .join("cilium")
        .join("socketlb")
        .join("links")
        .join("cgroup")
}

fn program_error(name: &'static str) -> impl Fn(ProgramError) -> SocketLbError {
    move |error| SocketLbError::Program {
        name,
        error: error.to_string(),
    }
}

fn io_error(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> SocketLbError {
    let path = path.to_owned();
    move |error| SocketLbError::Io { what, path, error }
}

/// Loads the programs against the lb4 maps pinned in `pins` (created if missing) and attaches
/// them to the cgroup2 directory `cgroup`, their links pinned under `links` (see
/// [`links_dir`]), replacing the links pinned there before.
///
/// `cgroup` is every process below it: on a node the host's cgroup2 root, in tests a child
/// cgroup the test made, never the machine's root.
pub fn attach(pins: &PinDir, links: &Path, cgroup: &Path) -> Result<Attached, SocketLbError> {
    let cgroup_dir = File::open(cgroup).map_err(io_error("opening the cgroup", cgroup))?;
    pins.ensure()?;
    let mut object = EbpfLoader::new()
        .default_map_pin_directory(pins.path())
        .load(SOCKET_LB_OBJECT)
        .map_err(MapsError::from)?;
    std::fs::create_dir_all(links).map_err(io_error("creating", links))?;
    let mut replaced = 0;
    for name in PROGRAMS {
        let missing = || SocketLbError::Program {
            name,
            error: "not in the object".to_owned(),
        };
        let program: &mut CgroupSockAddr = object
            .program_mut(name)
            .ok_or_else(missing)?
            .try_into()
            .map_err(program_error(name))?;
        program.load().map_err(program_error(name))?;
        // A BPF link always runs beside the cgroup's other programs; the kernel refuses the
        // multi-attach flag on links (aya#1078), so aya's default mode is the one to pass.
        let id = program
            .attach(&cgroup_dir, CgroupAttachMode::Single)
            .map_err(program_error(name))?;
        let link = program.take_link(id).map_err(program_error(name))?;
        let link = FdLink::try_from(link).map_err(|error| SocketLbError::Program {
            name,
            error: format!("the kernel gave no BPF link (kernels before 5.7): {error}"),
        })?;
        let pin = links.join(name);
        // bpffs refuses names with a dot.
        let staged = links.join(format!("{name}_new"));
        remove_if_present(&staged)?;
        let pinned = link.pin(&staged).map_err(|error| SocketLbError::Program {
            name,
            error: format!("pinning its link at {}: {error}", staged.display()),
        })?;
        replaced += usize::from(pin.exists());
        // The old link's pin goes in the same step; the new program already runs.
        if let Err(error) = std::fs::rename(&staged, &pin) {
            // Unpinned, the staged link goes: no extra program stays attached.
            let _ = remove_if_present(&staged);
            return Err(io_error("pinning", &pin)(error));
        }
        // The pin holds the link now, not this file descriptor.
        drop(pinned);
    }
    Ok(Attached {
        cgroup: cgroup.to_owned(),
        replaced,
    })
}

/// Removes the pinned links under `links` (socket-LB turned off): the programs stop running
/// once nothing else holds them. How many there were.
pub fn detach(links: &Path) -> Result<usize, SocketLbError> {
    let mut removed = 0;
    for name in PROGRAMS {
        removed += usize::from(remove_if_present(&links.join(name))?);
    }
    Ok(removed)
}

/// Which of [`PROGRAMS`] have a pinned link under `links`.
pub fn pinned(links: &Path) -> Vec<&'static str> {
    PROGRAMS
        .into_iter()
        .filter(|name| links.join(name).exists())
        .collect()
}

fn remove_if_present(path: &Path) -> Result<bool, SocketLbError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(error) => Err(SocketLbError::Io {
            what: "removing",
            path: path.to_owned(),
            error,
        }),
    }
}
