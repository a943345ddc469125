//! A "switch": a namespace holding a Linux bridge that node namespaces plug into.

use std::sync::atomic::{AtomicU32, Ordering};

use super::netns::Netns;
use super::veth::Veth;
use crate::Result;

/// The bridge's name inside the switch namespace.
pub const BRIDGE: &str = "br0";

/// A namespace holding the bridge [`BRIDGE`] (STP off, so ports forward at once). Dropping it
/// deletes the namespace, which unplugs every node.
#[derive(Debug)]
pub struct Switch {
    netns: Netns,
    ports: AtomicU32,
}

impl Switch {
    pub(super) fn create(netns: Netns) -> Result<Self> {
        netns.ip(&[
            "link",
            "add",
            BRIDGE,
            "type",
            "bridge",
            "stp_state",
            "0",
            "forward_delay",
            "0",
        ])?;
        netns.link_up(BRIDGE)?;
        Ok(Self {
            netns,
            ports: AtomicU32::new(0),
        })
    }

    /// The switch's namespace (e.g. to take a port down: `switch.netns().link_down(port)`).
    pub fn netns(&self) -> &Netns {
        &self.netns
    }

    /// Plugs `node` in: a veth from `dev` in `node` (which gets `addr`, e.g. `10.213.0.1/24`,
    /// from the guarded ranges) to a new bridge port `p<n>` in the switch. The returned
    /// [`Veth`] has the node end first and the port as `peer_dev`.
    pub fn connect(&self, node: &Netns, dev: &str, addr: &str) -> Result<Veth> {
        let port = format!("p{}", self.ports.fetch_add(1, Ordering::Relaxed));
        let veth = node.veth_to(dev, &self.netns, &port)?;
        self.netns.ip(&["link", "set", &port, "master", BRIDGE])?;
        node.add_addr(dev, addr)?;
        Ok(veth)
    }
}
