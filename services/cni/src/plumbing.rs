//! A pod's network, as plain functions over two namespaces: the host's (where the host end
//! of the veth and the route to the pod go) and the pod's.
//!
//! ```text
//!  host namespace                         pod namespace
//!  mwXXXXXXXXXXX (up, proxy_arp if < /32)  ── veth ──  eth0 (up) 10.0.1.5/P
//!  route 10.0.1.5/32 dev mwXXX scope link             lo up
//!                                                     [gw dev eth0 scope link]  when gw ∉ 10.0.1.5/P
//!                                                     neigh gw lladdr <host end's MAC> permanent
//!                                                     default via gw dev eth0
//! ```
//!
//! The gateway resolves through a permanent neighbour entry pointing at the host end (as
//! the AWS VPC CNI does): the node need not own the gateway's address nor answer ARP for
//! it. When the prefix is shorter than /32, other addresses of the subnet are on-link for
//! the pod; `proxy_arp` on the host end makes the node answer for them, so that traffic
//! too crosses the node (and the endpoints' programs). Forwarding on the node is the
//! node's business (the agent or the lab turns it on), not the plugin's.
//!
//! The peer is created directly inside the pod's namespace under its final name (one
//! `RTM_NEWLINK` with `IFLA_NET_NS_FD` on the peer): it never exists in the host's
//! namespace, so no temporary name can clash there and nothing is left half-moved.

use std::net::{IpAddr, Ipv4Addr};

use crate::netlink::{Link, NetlinkError, Route, RtSocket};
use crate::netns::{HostNetns, Netns, NetnsError};

/// What an attachment's network is to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodNetwork {
    /// The host end of the veth (see [`crate::naming::host_ifname`]).
    pub host_ifname: String,
    /// The pod's end (CNI_IFNAME).
    pub pod_ifname: String,
    /// The pod's address.
    pub ip: Ipv4Addr,
    /// Its prefix length (32 for ENI addresses).
    pub prefix_len: u8,
    /// The pod's default gateway.
    pub gateway: Ipv4Addr,
    /// The MTU of both ends; `None`: the kernel's default.
    pub mtu: Option<u32>,
}

impl PodNetwork {
    /// True when the gateway lies outside the pod's prefix (then it needs an on-link route).
    pub fn gateway_off_subnet(&self) -> bool {
        let mask = u32::MAX
            .checked_shl(32 - u32::from(self.prefix_len))
            .unwrap_or(0);
        u32::from(self.gateway) & mask != u32::from(self.ip) & mask
    }

    fn host_route(&self, host: &Link) -> Route {
        Route {
            dst: IpAddr::V4(self.ip),
            prefix_len: 32,
            gateway: None,
            oif: Some(host.index),
            link_scope: true,
        }
    }

    fn gateway_route(&self, pod: &Link) -> Route {
        Route {
            dst: IpAddr::V4(self.gateway),
            prefix_len: 32,
            gateway: None,
            oif: Some(pod.index),
            link_scope: true,
        }
    }

    fn default_route(&self, pod: &Link) -> Route {
        Route {
            dst: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            prefix_len: 0,
            gateway: Some(IpAddr::V4(self.gateway)),
            oif: Some(pod.index),
            link_scope: false,
        }
    }
}

/// Both ends of a veth made by [`setup`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attached {
    /// The host end.
    pub host: Link,
    /// The pod's end.
    pub pod: Link,
}

/// Why the network could not be set up, torn down or inspected.
#[derive(Debug, thiserror::Error)]
pub enum PlumbingError {
    /// A namespace could not be opened or entered.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The kernel refused a request.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    /// The pod's namespace already has an interface of that name.
    #[error("the pod's namespace already has an interface {0}")]
    PodIfnameTaken(String),
    /// A link was not there right after it was made.
    #[error("{0} is missing right after it was created")]
    Vanished(String),
    /// A sysctl could not be written.
    #[error("writing {path}: {error}")]
    Sysctl {
        /// The /proc/sys path.
        path: String,
        /// The error.
        error: std::io::Error,
    },
}

/// Makes the pod's network (see the module docs). A host end of the same name left by an
/// earlier ADD of the same attachment is replaced. On failure, what was made is removed
/// again before the error is returned.
pub fn setup(host: &HostNetns, pod: &Netns, net: &PodNetwork) -> Result<Attached, PlumbingError> {
    let host_link = host.run(|| setup_host(pod, net))??;
    let pod_side = pod
        .run(|| setup_pod(net, &host_link))
        .map_err(PlumbingError::from)
        .and_then(|outcome| outcome);
    match pod_side {
        Ok(pod_link) => Ok(Attached {
            host: host_link,
            pod: pod_link,
        }),
        Err(err) => {
            // The pair goes with its host end; the error that counts is the first one.
            let _ = teardown(host, &net.host_ifname);
            Err(err)
        }
    }
}

/// Removes the attachment's veth (its peer goes with it, and the routes through it);
/// false when it was not there. Idempotent.
pub fn teardown(host: &HostNetns, host_ifname: &str) -> Result<bool, PlumbingError> {
    let deleted = host.run(|| -> Result<bool, PlumbingError> {
        Ok(RtSocket::open()?.delete_link(host_ifname)?)
    })??;
    Ok(deleted)
}

/// What differs from what [`setup`] makes, one line each; empty when nothing does.
pub fn check(
    host: &HostNetns,
    pod: &Netns,
    net: &PodNetwork,
) -> Result<Vec<String>, PlumbingError> {
    let mut problems = host.run(|| check_host(net))??;
    problems.extend(pod.run(|| check_pod(net))??);
    Ok(problems)
}

fn setup_host(pod: &Netns, net: &PodNetwork) -> Result<Link, PlumbingError> {
    let mut socket = RtSocket::open()?;
    // Our own name: a leftover of this attachment (an ADD that crashed, or repeated).
    socket.delete_link(&net.host_ifname)?;
    match socket.create_veth(&net.host_ifname, &net.pod_ifname, pod.fd(), net.mtu) {
        Ok(()) => {}
        Err(err) if err.errno() == Some(libc::EEXIST) => {
            return Err(PlumbingError::PodIfnameTaken(net.pod_ifname.clone()));
        }
        Err(err) => return Err(err.into()),
    }
    let result = (|| {
        let link = socket
            .link(&net.host_ifname)?
            .ok_or_else(|| PlumbingError::Vanished(net.host_ifname.clone()))?;
        if net.prefix_len < 32 {
            write_sysctl(&format!("net/ipv4/conf/{}/proxy_arp", net.host_ifname), "1")?;
        }
        socket.set_up(&link)?;
        // Replace: a route to this IP through a veth that is gone, or a stale one, is wrong now.
        socket.add_route(&net.host_route(&link), true)?;
        // Read back for the up flag as it is now.
        socket
            .link(&net.host_ifname)?
            .ok_or_else(|| PlumbingError::Vanished(net.host_ifname.clone()))
    })();
    if result.is_err() {
        let _ = socket.delete_link(&net.host_ifname);
    }
    result
}

fn setup_pod(net: &PodNetwork, host: &Link) -> Result<Link, PlumbingError> {
    let mut socket = RtSocket::open()?;
    if let Some(lo) = socket.link("lo")?
        && !lo.up
    {
        socket.set_up(&lo)?;
    }
    let link = socket
        .link(&net.pod_ifname)?
        .ok_or_else(|| PlumbingError::Vanished(net.pod_ifname.clone()))?;
    socket.add_address(&link, IpAddr::V4(net.ip), net.prefix_len)?;
    socket.set_up(&link)?;
    if net.gateway_off_subnet() {
        socket.add_route(&net.gateway_route(&link), false)?;
    }
    socket.set_neighbour(&link, IpAddr::V4(net.gateway), &host.mac)?;
    socket.add_route(&net.default_route(&link), false)?;
    // Read back for the MAC and the up flag as they are now.
    socket
        .link(&net.pod_ifname)?
        .ok_or_else(|| PlumbingError::Vanished(net.pod_ifname.clone()))
}

fn check_host(net: &PodNetwork) -> Result<Vec<String>, PlumbingError> {
    let mut socket = RtSocket::open()?;
    let Some(link) = socket.link(&net.host_ifname)? else {
        return Ok(vec![format!("host veth {} is missing", net.host_ifname)]);
    };
    let mut problems = Vec::new();
    if link.kind.as_deref() != Some("veth") {
        problems.push(format!("{} is not a veth ({:?})", link.name, link.kind));
    }
    if !link.up {
        problems.push(format!("{} is down", link.name));
    }
    let want = net.host_route(&link);
    let routes = socket.routes(want.dst)?;
    if !routes
        .iter()
        .any(|r| r.dst == want.dst && r.prefix_len == 32 && r.oif == want.oif)
    {
        problems.push(format!("the host has no route {want}"));
    }
    Ok(problems)
}

fn check_pod(net: &PodNetwork) -> Result<Vec<String>, PlumbingError> {
    let mut socket = RtSocket::open()?;
    let Some(link) = socket.link(&net.pod_ifname)? else {
        return Ok(vec![format!("the pod has no interface {}", net.pod_ifname)]);
    };
    let mut problems = Vec::new();
    if link.kind.as_deref() != Some("veth") {
        problems.push(format!("{} is not a veth ({:?})", link.name, link.kind));
    }
    if !link.up {
        problems.push(format!("{} in the pod is down", link.name));
    }
    let addresses = socket.addresses(link.index)?;
    if !addresses.contains(&(IpAddr::V4(net.ip), net.prefix_len)) {
        problems.push(format!(
            "{} has no address {}/{} (it has {addresses:?})",
            link.name, net.ip, net.prefix_len
        ));
    }
    let want = net.default_route(&link);
    let routes = socket.routes(want.dst)?;
    if !routes
        .iter()
        .any(|r| r.prefix_len == 0 && r.gateway == want.gateway && r.oif == want.oif)
    {
        problems.push(format!("the pod has no route {want}"));
    }
    Ok(problems)
}

/// Writes `/proc/sys/<key>` in the calling thread's namespace (net sysctls are per
/// namespace, resolved at open).
fn write_sysctl(key: &str, value: &str) -> Result<(), PlumbingError> {
    let path = format!("/proc/sys/{key}");
    std::fs::write(&path, value).map_err(|error| PlumbingError::Sysctl { path, error })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(ip: [u8; 4], prefix_len: u8, gateway: [u8; 4]) -> PodNetwork {
        PodNetwork {
            host_ifname: "mw0".into(),
            pod_ifname: "eth0".into(),
            ip: ip.into(),
            prefix_len,
            gateway: gateway.into(),
            mtu: None,
        }
    }

    #[test]
    fn an_eni_address_needs_an_on_link_route_to_its_gateway() {
        assert!(net([10, 0, 1, 5], 32, [10, 0, 1, 1]).gateway_off_subnet());
        assert!(!net([10, 0, 1, 5], 24, [10, 0, 1, 1]).gateway_off_subnet());
        assert!(net([10, 0, 1, 5], 24, [10, 0, 2, 1]).gateway_off_subnet());
        assert!(!net([10, 0, 1, 5], 0, [192, 168, 0, 1]).gateway_off_subnet());
    }
}
