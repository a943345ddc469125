//! veth pairs between two lab namespaces.

use std::process::Command;

use super::netns::Netns;
use crate::{LabError, Result, paths, process};

/// The longest interface name Linux accepts (`IFNAMSIZ - 1`).
pub const MAX_IFNAME: usize = 15;

/// Fails unless `name` is a valid interface name: 1–15 characters, no `/`, `:` or whitespace.
pub fn check_ifname(name: &str) -> Result<()> {
    let valid = !name.is_empty()
        && name.len() <= MAX_IFNAME
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace() || !c.is_ascii());
    if valid {
        Ok(())
    } else {
        Err(LabError::CommandFailed {
            command: format!("interface name {name:?}"),
            detail: format!("must be 1-{MAX_IFNAME} ASCII characters without '/', ':' or spaces"),
        })
    }
}

/// A veth pair: `dev` in namespace `netns`, `peer_dev` in `peer_netns`.
///
/// Plain data, no drop action: the pair lives until either namespace is deleted (or
/// [`Veth::delete`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Veth {
    /// Namespace of the first end.
    pub netns: String,
    /// Interface name of the first end.
    pub dev: String,
    /// Namespace of the second end.
    pub peer_netns: String,
    /// Interface name of the second end.
    pub peer_dev: String,
}

impl Veth {
    pub(super) fn create(a: &Netns, dev: &str, b: &Netns, peer_dev: &str) -> Result<Self> {
        check_ifname(dev)?;
        check_ifname(peer_dev)?;
        // Created directly in the two namespaces: the names never exist in the root namespace.
        process::run(
            Command::new(paths::find_program("ip")?)
                .args([
                    "-n",
                    a.name(),
                    "link",
                    "add",
                    dev,
                    "type",
                    "veth",
                    "peer",
                    "name",
                ])
                .args([peer_dev, "netns", b.name()]),
        )?;
        let veth = Self {
            netns: a.name().to_owned(),
            dev: dev.to_owned(),
            peer_netns: b.name().to_owned(),
            peer_dev: peer_dev.to_owned(),
        };
        a.link_up(dev)?;
        b.link_up(peer_dev)?;
        Ok(veth)
    }

    /// Deletes the pair (both ends).
    pub fn delete(self) -> Result<()> {
        process::run(Command::new(paths::find_program("ip")?).args([
            "-n",
            &self.netns,
            "link",
            "del",
            &self.dev,
        ]))
        .map(drop)
    }
}
