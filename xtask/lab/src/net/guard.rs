//! The root-namespace `unreachable` routes that keep lab addresses from leaving the machine.
//!
//! Several test processes run at once (nextest starts one per test), so the routes are shared:
//! each range has a lock file under [`LOCK_DIR`]. A live guard holds a *shared* `flock` on it,
//! taken before the route is added. On drop the guard releases its lock and then tries an
//! *exclusive*, non-blocking lock: only when that succeeds — no other guard anywhere holds the
//! range — is the route deleted (while the exclusive lock blocks new guards). A third lock,
//! `check.lock`, is held shared by dropping guards and exclusively by [`with_no_guard_alive`],
//! so a test's check never makes a dropping guard believe another guard is still alive.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use super::cidr::{Cidr, GUARDED_RANGES};
use crate::{LabError, Result, paths, process};

/// Where the per-range lock files live (tmpfs; the files are never deleted).
pub const LOCK_DIR: &str = "/run/meshwork-lab";

/// Holds the root-namespace `unreachable` routes for all [`GUARDED_RANGES`] while alive.
///
/// [`super::LabNet`] owns one; create one directly only for code that assigns lab addresses
/// without a `LabNet`.
#[derive(Debug)]
pub struct RouteGuard {
    held: Vec<(Cidr, Flock<File>)>,
}

impl RouteGuard {
    /// Takes the shared locks and installs the routes (an existing identical route is fine).
    pub fn install() -> Result<Self> {
        let mut guard = Self { held: Vec::new() };
        for range in GUARDED_RANGES {
            let lock =
                Flock::lock(open_lock(&range)?, FlockArg::LockShared).map_err(|(_, errno)| {
                    LabError::Io {
                        context: format!("taking the shared lock for {range}"),
                        error: errno.into(),
                    }
                })?;
            // Pushed before the route is added: if adding fails, drop still cleans up.
            guard.held.push((range, lock));
            add_route(&range)?;
        }
        Ok(guard)
    }

    /// The ranges this guard protects.
    pub fn ranges(&self) -> Vec<Cidr> {
        self.held.iter().map(|(range, _)| *range).collect()
    }
}

impl Drop for RouteGuard {
    fn drop(&mut self) {
        // Shared on the check lock: a concurrent `with_no_guard_alive` never holds a range lock
        // while this guard decides whether it was the last one.
        let check = open_check_lock().and_then(|file| {
            Flock::lock(file, FlockArg::LockShared).map_err(|(_, errno)| LabError::Io {
                context: "taking the shared check lock".to_owned(),
                error: errno.into(),
            })
        });
        for (range, lock) in self.held.drain(..).rev() {
            let Ok(file) = lock.unlock() else {
                continue;
            };
            if let Ok(exclusive) = Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                if let Err(error) = delete_route(&range) {
                    tracing::warn!(%range, %error, "could not delete the guard route");
                }
                drop(exclusive);
            }
        }
        drop(check);
    }
}

/// Runs `check` while no [`RouteGuard`] is alive anywhere on the machine, holding every range's
/// lock exclusively so none can start; returns `None` (without running it) when a guard is
/// alive. For tests that verify the routes are gone after the last guard dropped.
pub fn with_no_guard_alive<T>(check: impl FnOnce() -> T) -> Result<Option<T>> {
    // Exclusive on the check lock waits out guards that are in the middle of dropping.
    let check_lock =
        Flock::lock(open_check_lock()?, FlockArg::LockExclusive).map_err(|(_, errno)| {
            LabError::Io {
                context: "taking the exclusive check lock".to_owned(),
                error: errno.into(),
            }
        })?;
    let mut locks = Vec::new();
    for range in GUARDED_RANGES {
        match Flock::lock(open_lock(&range)?, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => locks.push(lock),
            Err((_, Errno::EWOULDBLOCK)) => return Ok(None),
            Err((_, errno)) => {
                return Err(LabError::Io {
                    context: format!("probing the lock for {range}"),
                    error: errno.into(),
                });
            }
        }
    }
    let value = check();
    drop(locks);
    drop(check_lock);
    Ok(Some(value))
}

/// The lock file of `range`.
pub fn lock_path(range: &Cidr) -> PathBuf {
    let name = range.network().to_string().replace(['/', ':'], "_");
    PathBuf::from(LOCK_DIR).join(format!("route-{name}.lock"))
}

/// True when the root namespace has an `unreachable` route for exactly `range`.
pub fn route_installed(range: &Cidr) -> Result<bool> {
    let out = process::run(
        ip(range)?
            .args(["route", "show", "type", "unreachable", "exact"])
            .arg(range.network().to_string()),
    )?;
    Ok(!out.trim().is_empty())
}

fn open_lock(range: &Cidr) -> Result<File> {
    open_lock_file(&lock_path(range))
}

fn open_check_lock() -> Result<File> {
    open_lock_file(&Path::new(LOCK_DIR).join("check.lock"))
}

fn open_lock_file(path: &Path) -> Result<File> {
    std::fs::create_dir_all(LOCK_DIR).map_err(LabError::io(format!("creating {LOCK_DIR}")))?;
    File::options()
        .create(true)
        .read(true)
        .write(true)
        .truncate(false)
        .open(path)
        .map_err(LabError::io(format!("opening {}", path.display())))
}

fn ip(range: &Cidr) -> Result<Command> {
    let mut command = Command::new(paths::find_program("ip")?);
    command.arg(if range.is_ipv6() { "-6" } else { "-4" });
    Ok(command)
}

fn add_route(range: &Cidr) -> Result<()> {
    add_unreachable(range)?;
    check_no_overlap(range)
}

/// Fails when the root namespace routes any part of `range` by a more specific route (which
/// would win over the `unreachable` one) or holds an address in it.
fn check_no_overlap(range: &Cidr) -> Result<()> {
    let network = range.network().to_string();
    let routes = process::run(
        ip(range)?
            .args(["route", "show", "table", "all", "root"])
            .arg(&network),
    )?;
    let ours = format!("unreachable {network} ");
    let foreign: Vec<&str> = routes
        .lines()
        .filter(|line| !line.trim().is_empty() && !format!("{line} ").starts_with(&ours))
        .collect();
    if foreign.is_empty() {
        Ok(())
    } else {
        Err(LabError::CommandFailed {
            command: format!("ip route show table all root {network}"),
            detail: format!(
                "the root namespace routes part of the lab range {network} itself; refusing \
                 to use it: {}",
                foreign.join("; ")
            ),
        })
    }
}

fn add_unreachable(range: &Cidr) -> Result<()> {
    let added = process::run(
        ip(range)?
            .args(["route", "add", "unreachable"])
            .arg(range.network().to_string()),
    );
    match added {
        Ok(_) => {
            tracing::debug!(%range, "guard route added");
            Ok(())
        }
        // Another guard (or an earlier run) put it there; make sure it is the unreachable one.
        Err(LabError::CommandFailed { detail, .. }) if detail.contains("File exists") => {
            if route_installed(range)? {
                Ok(())
            } else {
                Err(LabError::CommandFailed {
                    command: format!("ip route add unreachable {range}"),
                    detail: format!(
                        "the root namespace already routes {range} somewhere else; \
                         refusing to use it for the lab"
                    ),
                })
            }
        }
        Err(error) => Err(error),
    }
}

fn delete_route(range: &Cidr) -> Result<()> {
    let deleted = process::run(
        ip(range)?
            .args(["route", "del", "unreachable"])
            .arg(range.network().to_string()),
    );
    match deleted {
        Ok(_) => {
            tracing::debug!(%range, "guard route deleted");
            Ok(())
        }
        Err(LabError::CommandFailed { detail, .. }) if detail.contains("No such process") => Ok(()),
        Err(error) => Err(error),
    }
}
