//! Network namespaces, veths, a bridge "switch", routes and partitions — made by the lab and
//! removed when their handles drop (also while a test unwinds from a panic).
//!
//! # Safety rule
//!
//! The root namespace of the machines this runs on routes private ranges (10.x …) off-host.
//! So:
//! - every address the lab assigns lives inside a namespace the lab made, and must lie in
//!   one of the [`GUARDED_RANGES`] ([`NODE_RANGE`] `10.213.0.0/16`, [`POD_RANGE`]
//!   `10.214.0.0/16`, [`V6_RANGE`] `fd6d:77::/32`); [`Netns::add_addr`] refuses others;
//! - [`LabNet::new`] installs `unreachable` routes for those ranges in the root namespace
//!   before anything else ([`RouteGuard`]; shared across processes with `flock`s, removed
//!   by the last guard to drop);
//! - nothing connects to a namespace address from the root namespace: probes run *inside*
//!   a namespace ([`Netns::can_reach`], [`Netns::enter`], [`Netns::command`]).
//!
//! # Shape
//!
//! ```no_run
//! # fn main() -> meshwork_lab::Result<()> {
//! use std::time::Duration;
//! use meshwork_lab::net::LabNet;
//!
//! let lab = LabNet::new()?; // guard routes + stale sweep
//! let switch = lab.switch("sw")?; // namespace with bridge br0
//! let a = lab.netns("a")?; // mw<pid>-<n>-a, loopback up
//! let b = lab.netns("b")?;
//! switch.connect(&a, "eth0", "10.213.0.1/24")?;
//! switch.connect(&b, "eth0", "10.213.0.2/24")?;
//! a.wait_reachable("10.213.0.2".parse().unwrap(), Duration::from_secs(5))?;
//! let cut = a.drop_traffic("10.213.0.2")?; // nft black hole, heals on drop
//! assert!(!a.can_reach("10.213.0.2".parse().unwrap(), Duration::from_secs(1))?);
//! cut.heal()?;
//! # Ok(())
//! # }
//! ```
//!
//! Every object cleans up after itself on drop; locals drop in reverse order of creation.
//! [`Netns`] drop stops every process still inside it (SIGTERM, then SIGKILL, by PID) and
//! deletes it, which also removes its veths, bridge and nft tables. Each object holds a clone
//! of its [`LabNet`], so the guard routes stay until the last of them is gone.
//!
//! Pods: `pod.veth_to("eth0", &node, "lxc1")?`, `pod.add_addr("eth0", "10.214.1.5/32")?`,
//! `pod.add_route_dev("10.213.0.1/32", "eth0")` … and routes on the node to match; node
//! namespaces that route call [`Netns::enable_forwarding`].
//!
//! Programs run inside with `nsenter -F --net=/run/netns/NAME` ([`Netns::command`],
//! [`Netns::spawn`]) — never `ip netns exec`, which remounts `/sys`. Rust code runs inside
//! with [`Netns::enter`] (a thread that `setns`es first); sockets made there stay in the
//! namespace, which is how tests open TCP streams between pods.

mod bridge;
mod cidr;
mod guard;
mod netns;
mod partition;
mod veth;

use std::path::Path;
use std::sync::Arc;

pub use bridge::{BRIDGE, Switch};
pub use cidr::{Cidr, GUARDED_RANGES, NODE_RANGE, POD_RANGE, V6_RANGE};
pub use guard::{LOCK_DIR, RouteGuard, lock_path, route_installed, with_no_guard_alive};
pub use netns::{
    NETNS_DIR, Netns, PROBE_PORT, command_in, list_netns, own_prefix, owner_pid, pids_in_netns,
    sweep_stale,
};
pub use partition::{LinkDown, NftPartition};
pub use veth::{MAX_IFNAME, Veth, check_ifname};

use crate::{LabError, Result, paths};

/// The lab's network handle: owns the [`RouteGuard`] and a log directory, and makes
/// namespaces and switches. Cheap to clone (shared); the guard lives until the last clone and
/// the last object made through it are dropped.
#[derive(Debug, Clone)]
pub struct LabNet {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    logs: tempfile::TempDir,
    _guard: RouteGuard,
}

impl LabNet {
    /// Checks the tools, installs the guard routes, then deletes stale lab namespaces and
    /// wireguard-go sockets of dead processes ([`sweep_stale`],
    /// [`crate::wireguard::sweep_stale_sockets`]).
    pub fn new() -> Result<Self> {
        for program in ["ip", "nsenter", "nft"] {
            paths::find_program(program)?;
        }
        let guard = RouteGuard::install()?;
        sweep_stale();
        crate::wireguard::sweep_stale_sockets();
        let logs = tempfile::Builder::new()
            .prefix(&format!("meshwork-net-{}-", std::process::id()))
            .tempdir()
            .map_err(LabError::io("creating the lab log directory"))?;
        Ok(Self {
            inner: Arc::new(Inner {
                logs,
                _guard: guard,
            }),
        })
    }

    /// Makes a namespace named `mw<pid>-<n>-<name>` (`name`: 1–24 of `[A-Za-z0-9_-]`).
    pub fn netns(&self, name: &str) -> Result<Netns> {
        Netns::create(self, name)
    }

    /// Makes a switch: a namespace (named after `name`) holding the bridge [`BRIDGE`].
    pub fn switch(&self, name: &str) -> Result<Switch> {
        Switch::create(self.netns(name)?)
    }

    /// Where processes spawned in this lab's namespaces log (removed with the lab).
    pub fn log_dir(&self) -> &Path {
        self.inner.logs.path()
    }
}
