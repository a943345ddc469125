//! A blocking rtnetlink socket (netlink-sys + netlink-packet-route): links, addresses,
//! routes and neighbours of the namespace the socket was opened in.
//!
//! Blocking rather than rtnetlink's async connection: a netlink socket belongs to the
//! namespace of the thread that opens it, so each namespace gets a socket opened on the
//! thread that entered it, used there and closed before the thread ends — no runtime or
//! background task has to follow it across namespaces.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd as _, BorrowedFd};
use std::time::Duration;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkMessage,
    NetlinkPayload,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
use nix::sys::socket::{setsockopt, sockopt};
use nix::sys::time::TimeVal;

/// How long one answer may take (the kernel answers at once; this bounds a stuck call).
const RECV_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a netlink exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// The kernel refused the request.
    #[error("{op}: {error}")]
    Kernel {
        /// What was asked, in words.
        op: String,
        /// The errno (positive).
        errno: i32,
        /// The errno as an I/O error.
        error: io::Error,
    },
    /// Socket trouble (including the receive timeout).
    #[error("netlink socket: {0}")]
    Socket(io::Error),
    /// An answer that does not parse.
    #[error("unreadable netlink answer: {0}")]
    Decode(String),
}

impl NetlinkError {
    /// The kernel's errno, when it was the kernel that refused.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Kernel { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

/// A link as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// Its index.
    pub index: u32,
    /// Its name.
    pub name: String,
    /// Its hardware address.
    pub mac: Vec<u8>,
    /// Administratively up.
    pub up: bool,
    /// Its kind (`veth`, …), when it has one.
    pub kind: Option<String>,
    /// Its MTU.
    pub mtu: Option<u32>,
}

/// A route of the main table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The destination (the unspecified address for a default route).
    pub dst: IpAddr,
    /// The destination's prefix length.
    pub prefix_len: u8,
    /// The gateway, if any.
    pub gateway: Option<IpAddr>,
    /// The output interface's index.
    pub oif: Option<u32>,
    /// Link scope (on-link) rather than universe.
    pub link_scope: bool,
}

/// One `NETLINK_ROUTE` socket in the namespace of the thread that opened it.
pub struct RtSocket {
    socket: Socket,
    seq: u32,
}

impl RtSocket {
    /// Opens and binds a socket in the calling thread's namespace.
    pub fn open() -> Result<Self, NetlinkError> {
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(NetlinkError::Socket)?;
        socket.bind_auto().map_err(NetlinkError::Socket)?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(NetlinkError::Socket)?;
        let timeout = TimeVal::new(i64::try_from(RECV_TIMEOUT.as_secs()).unwrap_or(i64::MAX), 0);
        setsockopt(&socket, sockopt::ReceiveTimeout, &timeout)
            .map_err(|errno| NetlinkError::Socket(errno.into()))?;
        Ok(Self { socket, seq: 0 })
    }

    /// Sends `message` with `NLM_F_REQUEST | NLM_F_ACK | flags` and collects the answers
    /// until the ACK (or, for dumps, `NLMSG_DONE`). `op` names the request in errors.
    fn request(
        &mut self,
        op: impl FnOnce() -> String,
        message: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<Vec<RouteNetlinkMessage>, NetlinkError> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut netlink = NetlinkMessage::from(message);
        netlink.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        netlink.header.sequence_number = seq;
        netlink.finalize();
        let mut buffer = vec![0; netlink.buffer_len()];
        netlink.serialize(&mut buffer);
        self.socket.send(&buffer, 0).map_err(NetlinkError::Socket)?;

        let mut answers = Vec::new();
        loop {
            let (datagram, _) = self.socket.recv_from_full().map_err(NetlinkError::Socket)?;
            let mut offset = 0;
            while offset < datagram.len() {
                let answer =
                    NetlinkMessage::<RouteNetlinkMessage>::deserialize(&datagram[offset..])
                        .map_err(|err| NetlinkError::Decode(err.to_string()))?;
                let length = usize::try_from(answer.header.length).unwrap_or(usize::MAX);
                if length == 0 {
                    return Err(NetlinkError::Decode("a zero-length message".to_owned()));
                }
                // Messages are 4-byte aligned within a datagram.
                offset = offset.saturating_add((length + 3) & !3);
                if answer.header.sequence_number != seq {
                    continue; // a late answer to an earlier request
                }
                match answer.payload {
                    NetlinkPayload::InnerMessage(inner) => answers.push(inner),
                    NetlinkPayload::Done(_) => return Ok(answers),
                    NetlinkPayload::Error(error) => match error.code {
                        None => return Ok(answers), // the ACK
                        Some(code) => {
                            return Err(NetlinkError::Kernel {
                                op: op(),
                                errno: code.get().abs(),
                                error: error.to_io(),
                            });
                        }
                    },
                    _ => {} // Noop, Overrun: nothing for the caller
                }
            }
        }
    }

    /// The link named `name`, or `None` when there is none.
    pub fn link(&mut self, name: &str) -> Result<Option<Link>, NetlinkError> {
        let mut message = LinkMessage::default();
        message
            .attributes
            .push(LinkAttribute::IfName(name.to_owned()));
        match self.request(
            || format!("looking up link {name}"),
            RouteNetlinkMessage::GetLink(message),
            0,
        ) {
            Ok(answers) => Ok(answers.into_iter().find_map(|answer| match answer {
                RouteNetlinkMessage::NewLink(link) => Some(link_from(link)),
                _ => None,
            })),
            Err(err) if err.errno() == Some(libc::ENODEV) => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// Creates the veth pair `host` (here) ↔ `peer` (made directly inside the namespace
    /// `peer_netns`, under its final name), both with `mtu` if given. Fails with EEXIST when
    /// either name is taken in its namespace.
    pub fn create_veth(
        &mut self,
        host: &str,
        peer: &str,
        peer_netns: BorrowedFd<'_>,
        mtu: Option<u32>,
    ) -> Result<(), NetlinkError> {
        let mut peer_message = LinkMessage::default();
        peer_message
            .attributes
            .push(LinkAttribute::IfName(peer.to_owned()));
        peer_message
            .attributes
            .push(LinkAttribute::NetNsFd(peer_netns.as_raw_fd()));
        let mut message = LinkMessage::default();
        message
            .attributes
            .push(LinkAttribute::IfName(host.to_owned()));
        if let Some(mtu) = mtu {
            message.attributes.push(LinkAttribute::Mtu(mtu));
            peer_message.attributes.push(LinkAttribute::Mtu(mtu));
        }
        message.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer_message))),
        ]));
        self.request(
            || format!("creating veth {host} with peer {peer} in the pod's namespace"),
            RouteNetlinkMessage::NewLink(message),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(drop)
    }

    /// Sets the link up.
    pub fn set_up(&mut self, link: &Link) -> Result<(), NetlinkError> {
        let mut message = LinkMessage::default();
        message.header.index = link.index;
        message.header.flags = LinkFlags::Up;
        message.header.change_mask = LinkFlags::Up;
        self.request(
            || format!("setting {} up", link.name),
            RouteNetlinkMessage::SetLink(message),
            0,
        )
        .map(drop)
    }

    /// Deletes the link named `name` (a veth takes its peer along); false when there was
    /// none.
    pub fn delete_link(&mut self, name: &str) -> Result<bool, NetlinkError> {
        let mut message = LinkMessage::default();
        message
            .attributes
            .push(LinkAttribute::IfName(name.to_owned()));
        match self.request(
            || format!("deleting link {name}"),
            RouteNetlinkMessage::DelLink(message),
            0,
        ) {
            Ok(_) => Ok(true),
            Err(err) if err.errno() == Some(libc::ENODEV) => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// Adds `ip/prefix_len` to the link.
    pub fn add_address(
        &mut self,
        link: &Link,
        ip: IpAddr,
        prefix_len: u8,
    ) -> Result<(), NetlinkError> {
        let mut message = AddressMessage::default();
        message.header.family = family(ip);
        message.header.prefix_len = prefix_len;
        message.header.index = link.index;
        message.attributes.push(AddressAttribute::Local(ip));
        message.attributes.push(AddressAttribute::Address(ip));
        self.request(
            || format!("adding {ip}/{prefix_len} to {}", link.name),
            RouteNetlinkMessage::NewAddress(message),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(drop)
    }

    /// The addresses of the link with index `index`.
    pub fn addresses(&mut self, index: u32) -> Result<Vec<(IpAddr, u8)>, NetlinkError> {
        let answers = self.request(
            || "listing addresses".to_owned(),
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            NLM_F_DUMP,
        )?;
        Ok(answers
            .into_iter()
            .filter_map(|answer| match answer {
                RouteNetlinkMessage::NewAddress(a) if a.header.index == index => {
                    let prefix_len = a.header.prefix_len;
                    a.attributes.into_iter().find_map(|attr| match attr {
                        AddressAttribute::Local(ip) => Some((ip, prefix_len)),
                        _ => None,
                    })
                }
                _ => None,
            })
            .collect())
    }

    /// Adds `route` (static, main table). `replace`: overwrite a route to the same
    /// destination; else an existing one is EEXIST.
    pub fn add_route(&mut self, route: &Route, replace: bool) -> Result<(), NetlinkError> {
        let mut message = RouteMessage::default();
        message.header.address_family = family(route.dst);
        message.header.destination_prefix_length = route.prefix_len;
        message.header.table = RouteHeader::RT_TABLE_MAIN;
        message.header.protocol = RouteProtocol::Static;
        message.header.scope = if route.link_scope {
            RouteScope::Link
        } else {
            RouteScope::Universe
        };
        message.header.kind = RouteType::Unicast;
        if route.prefix_len > 0 {
            message
                .attributes
                .push(RouteAttribute::Destination(RouteAddress::from(route.dst)));
        }
        if let Some(gateway) = route.gateway {
            message
                .attributes
                .push(RouteAttribute::Gateway(RouteAddress::from(gateway)));
        }
        if let Some(oif) = route.oif {
            message.attributes.push(RouteAttribute::Oif(oif));
        }
        let flags = NLM_F_CREATE | if replace { NLM_F_REPLACE } else { NLM_F_EXCL };
        self.request(
            || format!("adding route {route}"),
            RouteNetlinkMessage::NewRoute(message),
            flags,
        )
        .map(drop)
    }

    /// The main table's routes of `ip`'s family.
    pub fn routes(&mut self, ip: IpAddr) -> Result<Vec<Route>, NetlinkError> {
        let mut request = RouteMessage::default();
        request.header.address_family = family(ip);
        let answers = self.request(
            || "listing routes".to_owned(),
            RouteNetlinkMessage::GetRoute(request),
            NLM_F_DUMP,
        )?;
        let unspecified = match ip {
            IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
        };
        Ok(answers
            .into_iter()
            .filter_map(|answer| match answer {
                RouteNetlinkMessage::NewRoute(r) => Some(r),
                _ => None,
            })
            .filter(|r| table(r) == u32::from(RouteHeader::RT_TABLE_MAIN))
            .map(|r| {
                let mut route = Route {
                    dst: unspecified,
                    prefix_len: r.header.destination_prefix_length,
                    gateway: None,
                    oif: None,
                    link_scope: r.header.scope == RouteScope::Link,
                };
                for attr in r.attributes {
                    match attr {
                        RouteAttribute::Destination(dst) => {
                            if let Some(ip) = route_ip(&dst) {
                                route.dst = ip;
                            }
                        }
                        RouteAttribute::Gateway(gw) => route.gateway = route_ip(&gw),
                        RouteAttribute::Oif(oif) => route.oif = Some(oif),
                        _ => {}
                    }
                }
                route
            })
            .collect())
    }

    /// Sets a permanent neighbour entry `ip` → `mac` on the link (replacing one there).
    pub fn set_neighbour(
        &mut self,
        link: &Link,
        ip: IpAddr,
        mac: &[u8],
    ) -> Result<(), NetlinkError> {
        let mut message = NeighbourMessage::default();
        message.header.family = family(ip);
        message.header.ifindex = link.index;
        message.header.state = NeighbourState::Permanent;
        message.header.kind = RouteType::Unicast;
        message
            .attributes
            .push(NeighbourAttribute::Destination(match ip {
                IpAddr::V4(v4) => NeighbourAddress::Inet(v4),
                IpAddr::V6(v6) => NeighbourAddress::Inet6(v6),
            }));
        message
            .attributes
            .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
        self.request(
            || format!("setting neighbour {ip} on {}", link.name),
            RouteNetlinkMessage::NewNeighbour(message),
            NLM_F_CREATE | NLM_F_REPLACE,
        )
        .map(drop)
    }
}

impl std::fmt::Display for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.prefix_len == 0 {
            f.write_str("default")?;
        } else {
            write!(f, "{}/{}", self.dst, self.prefix_len)?;
        }
        if let Some(gateway) = self.gateway {
            write!(f, " via {gateway}")?;
        }
        if let Some(oif) = self.oif {
            write!(f, " oif {oif}")?;
        }
        if self.link_scope {
            f.write_str(" scope link")?;
        }
        Ok(())
    }
}

fn family(ip: IpAddr) -> AddressFamily {
    match ip {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    }
}

fn table(route: &RouteMessage) -> u32 {
    route
        .attributes
        .iter()
        .find_map(|attr| match attr {
            RouteAttribute::Table(table) => Some(*table),
            _ => None,
        })
        .unwrap_or_else(|| u32::from(route.header.table))
}

fn route_ip(address: &RouteAddress) -> Option<IpAddr> {
    match address {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

fn link_from(message: LinkMessage) -> Link {
    let mut link = Link {
        index: message.header.index,
        name: String::new(),
        mac: Vec::new(),
        up: message.header.flags.contains(LinkFlags::Up),
        kind: None,
        mtu: None,
    };
    for attr in message.attributes {
        match attr {
            LinkAttribute::IfName(name) => link.name = name,
            LinkAttribute::Address(mac) => link.mac = mac,
            LinkAttribute::Mtu(mtu) => link.mtu = Some(mtu),
            LinkAttribute::LinkInfo(infos) => {
                link.kind = infos.into_iter().find_map(|info| match info {
                    LinkInfo::Kind(kind) => Some(kind.to_string()),
                    _ => None,
                });
            }
            _ => {}
        }
    }
    link
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(mac: &[u8]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_own_namespace_without_privileges() {
        // Reads only: GET requests need no CAP_NET_ADMIN.
        let mut socket = RtSocket::open().unwrap();
        let lo = socket.link("lo").unwrap().expect("every namespace has lo");
        assert_eq!(lo.name, "lo");
        assert!(socket.link("mw-no-such-link").unwrap().is_none());
        let addresses = socket.addresses(lo.index).unwrap();
        if lo.up {
            assert!(
                addresses.contains(&("127.0.0.1".parse().unwrap(), 8)),
                "{addresses:?}"
            );
        }
        socket.routes("0.0.0.0".parse().unwrap()).unwrap();
        assert_eq!(format_mac(&[0, 0x1b, 0xff]), "00:1b:ff");
    }
}
