//! WireGuard between the mesh's clusters ([`super::MeshSpec::wireguard`]): each node gets a
//! wireguard-go device in its own namespace, and its routes to every other cluster's pod
//! CIDRs go out through that device instead of over the underlay. The node's agent owns the
//! device's configuration (`--enable-wireguard --wireguard-userspace-fallback`): its key, its
//! port and one peer per remote node, learnt from the remote clusters' node objects.
//!
//! The lab starts wireguard-go itself, before the agent, so it can end it by PID when the mesh
//! goes; the agent finds it answering and reuses it, as a restarted agent reuses the one its
//! predecessor started. Should it vanish, the agent starts its own through a wrapper that
//! runs wireguard-go inside the node's namespace, never in the root one.

use std::path::Path;

use anyhow::Context as _;
use meshwork_lab::wireguard::{WireguardGo, netns_wrapper, unique_device_name};

use super::net::{MeshNet, NodeAddrs};

/// One node's WireGuard device, stopped on drop.
pub struct NodeTunnel {
    /// Held to be stopped on drop.
    _wg: WireguardGo,
    flags: Vec<String>,
}

impl NodeTunnel {
    /// Starts the device of node `addrs` (its wrapper written under `dir`), brings it up and
    /// routes every other cluster's pod CIDR through it.
    pub fn start(net: &MeshNet, addrs: &NodeAddrs, dir: &Path) -> anyhow::Result<Self> {
        let node = net
            .node(&addrs.name)
            .with_context(|| format!("no namespace for node {}", addrs.name))?;
        let device = unique_device_name();
        let wg = WireguardGo::start(node, &device)
            .with_context(|| format!("starting {}'s WireGuard device", addrs.name))?;
        node.link_up(&device)?;
        for other in net.nodes().filter(|n| n.cluster_id != addrs.cluster_id) {
            node.replace_route_dev(&other.pod_cidr, &device)?;
        }
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let wrapper = netns_wrapper(node, dir)?;
        let flags = vec![
            "--enable-wireguard".to_owned(),
            format!("--wireguard-device={device}"),
            "--wireguard-userspace-fallback".to_owned(),
            format!("--wireguard-userspace-bin={}", wrapper.display()),
        ];
        Ok(Self { _wg: wg, flags })
    }

    /// The agent's WireGuard flags for this device.
    pub fn agent_flags(&self) -> &[String] {
        &self.flags
    }
}
