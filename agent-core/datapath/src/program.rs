//! Loading an endpoint's program bound to the maps pinned now, and attaching it to the host side
//! of the endpoint's veth — inside the network namespace that holds that interface.
//!
//! Attachments use netlink TC (not TCX): a netlink filter stays in the kernel after the agent
//! exits, which is what keeps established connections flowing across an agent restart. A
//! filter already there (from the previous agent) has its program replaced in place.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use aya::maps::HashMap as BpfHashMap;
use aya::programs::tc::{NlOptions, SchedClassifierLink, TcAttachOptions, TcHandle};
use aya::programs::{SchedClassifier, TcAttachType, tc};

use super::maps::{MapsError, POLICY_MAP, PinDir};

/// The program's name in the object.
pub const PROGRAM: &str = "meshwork_endpoint";
/// The filter's priority and handle: fixed, so a restarted agent finds and replaces it.
const PRIORITY: u16 = 1;
const HANDLE: TcHandle = TcHandle::new(0, 1);

/// Where an endpoint's program goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachPoint {
    /// The network namespace holding the interface (a `/run/netns/NAME` path); None: the
    /// agent's own.
    pub netns: Option<PathBuf>,
    /// The host side of the endpoint's veth.
    pub interface: String,
}

/// Why a program could not be loaded or attached.
#[derive(Debug, thiserror::Error)]
pub enum ProgramError {
    /// Maps could not be opened or created.
    #[error(transparent)]
    Maps(#[from] MapsError),
    /// The object lacks something the agent expects (a build mismatch).
    #[error("the endpoint object has no {0}")]
    Missing(&'static str),
    /// aya refused the program or the attachment.
    #[error("{what}: {error}")]
    Aya {
        /// The step.
        what: &'static str,
        /// The error.
        error: aya::programs::ProgramError,
    },
    /// Writing the policy map failed.
    #[error("writing the policy map: {0}")]
    Policy(aya::maps::MapError),
    /// Entering the network namespace failed.
    #[error("entering the network namespace {path}: {error}")]
    Netns {
        /// The namespace.
        path: PathBuf,
        /// The error.
        error: io::Error,
    },
    /// The interface is gone or tc refused the qdisc.
    #[error("preparing {interface}: {error}")]
    Qdisc {
        /// The interface.
        interface: String,
        /// The error.
        error: tc::TcError,
    },
}

/// Loads a fresh copy of the endpoint program (bound to the maps pinned in `pins` now, with
/// its own policy map holding `allowed`) and attaches it at `at`, replacing the program of a
/// filter already there.
pub fn load_and_attach(
    pins: &PinDir,
    at: &AttachPoint,
    allowed: &[u32],
) -> Result<(), ProgramError> {
    let mut ebpf = pins.load_object()?;
    let policy = ebpf
        .map_mut(POLICY_MAP)
        .ok_or(ProgramError::Missing(POLICY_MAP))?;
    let mut policy: BpfHashMap<_, u32, u8> =
        BpfHashMap::try_from(policy).map_err(ProgramError::Policy)?;
    for identity in allowed {
        policy
            .insert(identity, 1, 0)
            .map_err(ProgramError::Policy)?;
    }
    let program: &mut SchedClassifier = ebpf
        .program_mut(PROGRAM)
        .ok_or(ProgramError::Missing(PROGRAM))?
        .try_into()
        .map_err(|source| ProgramError::Aya {
            what: "not a TC program",
            error: source,
        })?;
    program.load().map_err(|source| ProgramError::Aya {
        what: "loading the endpoint program",
        error: source,
    })?;
    in_netns(at.netns.as_deref(), || attach(program, &at.interface))?
}

fn attach(program: &mut SchedClassifier, interface: &str) -> Result<(), ProgramError> {
    if let Err(source) = tc::qdisc_add_clsact(interface) {
        // EEXIST: the qdisc is there from an earlier attachment.
        let exists = matches!(&source, tc::TcError::NetlinkError(e) if e.raw_os_error() == Some(libc::EEXIST));
        if !exists {
            return Err(ProgramError::Qdisc {
                interface: interface.to_owned(),
                error: source,
            });
        }
    }
    let existing =
        SchedClassifierLink::attached(interface, TcAttachType::Ingress, PRIORITY, HANDLE, None)
            .map_err(|source| ProgramError::Qdisc {
                interface: interface.to_owned(),
                error: tc::TcError::IoError(source),
            })?;
    let link = match program.attach_to_link(existing) {
        Ok(link) => link,
        // No filter yet (first attachment): create it.
        Err(_) => program
            .attach_with_options(
                interface,
                TcAttachType::Ingress,
                TcAttachOptions::Netlink(NlOptions {
                    priority: PRIORITY,
                    handle: HANDLE,
                    classid: None,
                }),
            )
            .map_err(|source| ProgramError::Aya {
                what: "attaching the endpoint program",
                error: source,
            })?,
    };
    let link = program
        .take_link(link)
        .map_err(|source| ProgramError::Aya {
            what: "taking the attachment",
            error: source,
        })?;
    // The filter must outlive this process: dropping the link would detach it.
    std::mem::forget(link);
    Ok(())
}

/// Detaches the endpoint's filter (the endpoint was deleted).
pub fn detach(at: &AttachPoint) -> Result<(), ProgramError> {
    in_netns(at.netns.as_deref(), || {
        match tc::qdisc_detach_program(&at.interface, TcAttachType::Ingress, PROGRAM) {
            Ok(()) => Ok(()),
            // The interface or the filter is already gone: nothing to detach.
            Err(tc::TcError::IoError(err)) if err.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(ProgramError::Qdisc {
                interface: at.interface.clone(),
                error: source,
            }),
        }
    })?
}

/// Runs `f` on a thread that joined `netns` (a thread's namespace is its own; the agent's
/// other threads stay where they are).
fn in_netns<T: Send>(
    netns: Option<&Path>,
    f: impl FnOnce() -> T + Send,
) -> Result<T, ProgramError> {
    let Some(path) = netns else {
        return Ok(f());
    };
    let file = File::open(path).map_err(|source| ProgramError::Netns {
        path: path.to_owned(),
        error: source,
    })?;
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|err| {
                    ProgramError::Netns {
                        path: path.to_owned(),
                        error: err.into(),
                    }
                })?;
                Ok(f())
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}
