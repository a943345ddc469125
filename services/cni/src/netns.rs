//! Network namespaces: opened by path, checked to be namespaces, and entered on a thread of
//! their own (a namespace is per thread; the caller's threads stay where they are).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use nix::sched::CloneFlags;
use nix::sys::statfs::{NSFS_MAGIC, fstatfs};

/// Why a namespace could not be opened or entered.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// Nothing at the path: the container (or node) is gone.
    #[error("no network namespace at {}", path.display())]
    NotFound {
        /// The path.
        path: PathBuf,
    },
    /// Something is at the path, but no namespace.
    #[error("{} is not a network namespace (not on nsfs)", path.display())]
    NotANamespace {
        /// The path.
        path: PathBuf,
    },
    /// Opening, stat or setns failed.
    #[error("{what} {}: {error}", path.display())]
    Io {
        /// The step.
        what: &'static str,
        /// The namespace's path.
        path: PathBuf,
        /// The OS error.
        error: io::Error,
    },
    /// setns succeeded, yet the thread is not in the namespace (it was not a network one).
    #[error("after setns the thread is not in {}", path.display())]
    NotEntered {
        /// The namespace's path.
        path: PathBuf,
    },
}

/// An open network namespace (the file keeps it alive while open).
#[derive(Debug)]
pub struct Netns {
    path: PathBuf,
    file: File,
}

impl Netns {
    /// Opens the namespace at `path` (`/run/netns/NAME`, `/proc/PID/ns/net`, `/var/run/…`).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, NetnsError> {
        let path = path.as_ref().to_owned();
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                return Err(NetnsError::NotFound { path });
            }
            Err(error) => {
                return Err(NetnsError::Io {
                    what: "opening",
                    path,
                    error,
                });
            }
        };
        let fs = fstatfs(&file).map_err(|errno| NetnsError::Io {
            what: "statfs",
            path: path.clone(),
            error: errno.into(),
        })?;
        if fs.filesystem_type() != NSFS_MAGIC {
            return Err(NetnsError::NotANamespace { path });
        }
        Ok(Self { path, file })
    }

    /// The calling thread's own namespace.
    pub fn current() -> Result<Self, NetnsError> {
        Self::open("/proc/thread-self/ns/net")
    }

    /// The path it was opened at.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The namespace's file descriptor (what `IFLA_NET_NS_FD` takes).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// True when both handles name the same namespace.
    pub fn same_as(&self, other: &Self) -> Result<bool, NetnsError> {
        Ok(self.id()? == other.id()?)
    }

    fn id(&self) -> Result<(u64, u64), NetnsError> {
        let meta = self.file.metadata().map_err(|error| NetnsError::Io {
            what: "stat",
            path: self.path.clone(),
            error,
        })?;
        Ok((meta.dev(), meta.ino()))
    }

    /// Runs `f` on a new thread that has entered this namespace and returns its result. `f`
    /// never runs unless the thread is verifiably inside; a panic in `f` is resumed here.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, NetnsError> {
        let target = self.id()?;
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    nix::sched::setns(&self.file, CloneFlags::CLONE_NEWNET).map_err(|errno| {
                        NetnsError::Io {
                            what: "setns into",
                            path: self.path.clone(),
                            error: errno.into(),
                        }
                    })?;
                    let now = std::fs::metadata("/proc/thread-self/ns/net").map_err(|error| {
                        NetnsError::Io {
                            what: "stat of the thread's namespace after entering",
                            path: self.path.clone(),
                            error,
                        }
                    })?;
                    if (now.dev(), now.ino()) != target {
                        return Err(NetnsError::NotEntered {
                            path: self.path.clone(),
                        });
                    }
                    Ok(f())
                })
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }
}

/// Where the host end of a veth lives: the caller's own namespace (a real node: the
/// plugin runs in the node's namespace, as the agent does), or another one (a lab node, or
/// a node namespace named by the config's `host-netns`).
#[derive(Debug)]
pub enum HostNetns {
    /// The namespace the caller was in when it was opened ([`HostNetns::open`] with `None`).
    Current(Netns),
    /// Another namespace.
    Other(Netns),
}

impl HostNetns {
    /// The calling thread's namespace for `None`, else the namespace at the path.
    pub fn open(path: Option<&Path>) -> Result<Self, NetnsError> {
        match path {
            None => Netns::current().map(Self::Current),
            Some(path) => Netns::open(path).map(Self::Other),
        }
    }

    /// The namespace.
    pub fn netns(&self) -> &Netns {
        match self {
            Self::Current(netns) | Self::Other(netns) => netns,
        }
    }

    /// Runs `f` in the host namespace: on the calling thread when it is already there (no
    /// setns needed), else on a thread that entered it — so a runtime's blocking pool can
    /// call this whatever namespace its threads were started in.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, NetnsError> {
        if Netns::current()?.same_as(self.netns())? {
            Ok(f())
        } else {
            self.netns().run(f)
        }
    }

    /// What the agent's `Endpoint.netns` takes: the namespace holding the host end; empty
    /// for the caller's own, which is taken to be the agent's (both run in the node's).
    pub fn endpoint_field(&self) -> String {
        match self {
            Self::Current(_) => String::new(),
            Self::Other(netns) => netns.path().display().to_string(),
        }
    }

    /// True when `pod` is this very namespace (a pod must have one of its own).
    pub fn is(&self, pod: &Netns) -> Result<bool, NetnsError> {
        self.netns().same_as(pod)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_tells_missing_from_not_a_namespace() {
        let own = Netns::current().unwrap();
        assert!(
            own.same_as(&Netns::open("/proc/self/ns/net").unwrap())
                .unwrap()
        );
        let host = HostNetns::open(None).unwrap();
        assert!(host.is(&own).unwrap());
        assert_eq!(host.run(|| 7).unwrap(), 7, "runs in place, no setns");
        assert!(matches!(
            Netns::open("/nonexistent/netns").unwrap_err(),
            NetnsError::NotFound { .. }
        ));
        let file = tempfile::NamedTempFile::new().unwrap();
        assert!(matches!(
            Netns::open(file.path()).unwrap_err(),
            NetnsError::NotANamespace { .. }
        ));
        assert_eq!(host.endpoint_field(), "");
    }
}
