//! Kernel WireGuard over generic netlink: messages built with `netlink-packet-wireguard`,
//! sent over a [`GenlSocket`] to the resolved `wireguard` family.
//!
//! The machines this is developed on have no WireGuard kernel module: the requests and the
//! reading of replies are unit-tested (serialised and parsed back), and the family lookup is
//! tested to fail clearly; the exchange itself runs where the module exists.

use std::time::{Duration, SystemTime};

use netlink_packet_core::{NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkMessage};
use netlink_packet_generic::GenlMessage;
use netlink_packet_wireguard::{
    WireguardAddressFamily, WireguardAllowedIp, WireguardAllowedIpAttr, WireguardAttribute,
    WireguardCmd, WireguardMessage, WireguardPeer, WireguardPeerAttribute, WireguardPeerFlags,
};

use super::backend::{Backend, BackendError, DeviceState, DeviceUpdate, PeerState, PeerUpdate};
use super::genl::{GenlError, GenlSocket};
use super::key::Key;
use meshwork_types::IpPrefix;

/// The generic-netlink family of kernel WireGuard.
pub const FAMILY: &str = "wireguard";

/// Peers per `WG_CMD_SET_DEVICE` message: keeps each message far below the socket buffer
/// (a peer with a few allowed IPs is ~150 bytes).
pub const PEERS_PER_MESSAGE: usize = 64;

/// Whether the running kernel has WireGuard (the module is loaded or built in).
pub fn kernel_has_wireguard() -> bool {
    std::path::Path::new("/sys/module/wireguard").exists()
}

/// The `WG_CMD_SET_DEVICE` message for `update` on `device`.
pub fn set_device_message(device: &str, update: &DeviceUpdate) -> WireguardMessage {
    let mut attributes = vec![WireguardAttribute::IfName(device.to_owned())];
    if let Some(key) = &update.private_key {
        attributes.push(WireguardAttribute::PrivateKey(key.0));
    }
    if let Some(port) = update.listen_port {
        attributes.push(WireguardAttribute::ListenPort(port));
    }
    if !update.peers.is_empty() {
        attributes.push(WireguardAttribute::Peers(
            update.peers.iter().map(peer).collect(),
        ));
    }
    WireguardMessage {
        cmd: WireguardCmd::SetDevice,
        attributes,
    }
}

fn peer(update: &PeerUpdate) -> WireguardPeer {
    let mut attrs = vec![WireguardPeerAttribute::PublicKey(update.key.0)];
    if update.remove {
        attrs.push(WireguardPeerAttribute::Flags(WireguardPeerFlags::RemoveMe));
        return WireguardPeer(attrs);
    }
    if update.replace_allowed_ips {
        attrs.push(WireguardPeerAttribute::Flags(
            WireguardPeerFlags::ReplaceAllowedIps,
        ));
    }
    if let Some(endpoint) = update.endpoint {
        attrs.push(WireguardPeerAttribute::Endpoint(endpoint));
    }
    if !update.allowed_ips.is_empty() || update.replace_allowed_ips {
        let ips = update.allowed_ips.iter().map(|prefix| {
            let family = if prefix.addr().is_ipv4() {
                WireguardAddressFamily::Ipv4
            } else {
                WireguardAddressFamily::Ipv6
            };
            WireguardAllowedIp(vec![
                WireguardAllowedIpAttr::Family(family),
                WireguardAllowedIpAttr::IpAddr(prefix.addr()),
                WireguardAllowedIpAttr::Cidr(prefix.prefix_len()),
            ])
        });
        attrs.push(WireguardPeerAttribute::AllowedIps(ips.collect()));
    }
    WireguardPeer(attrs)
}

/// The request as bytes for the `wireguard` genl family `family_id` (NLM_F_REQUEST|ACK).
///
/// The kernel caps one message at a page-ish size; callers with many peers split the update
/// ([`split`]) like `wg` does.
pub fn serialize(family_id: u16, message: WireguardMessage) -> Vec<u8> {
    let mut genl = GenlMessage::from_payload(message);
    genl.set_resolved_family_id(family_id);
    let mut netlink = NetlinkMessage::from(genl);
    netlink.header.flags = NLM_F_REQUEST | NLM_F_ACK;
    netlink.finalize();
    let mut buffer = vec![0; netlink.buffer_len()];
    netlink.serialize(&mut buffer);
    buffer
}

/// Splits an update into requests of at most `peers_per_message` peers, device settings in
/// the first.
pub fn split(update: &DeviceUpdate, peers_per_message: usize) -> Vec<DeviceUpdate> {
    let mut parts: Vec<DeviceUpdate> = update
        .peers
        .chunks(peers_per_message.max(1))
        .map(|peers| DeviceUpdate {
            peers: peers.to_vec(),
            ..DeviceUpdate::default()
        })
        .collect();
    if parts.is_empty() {
        parts.push(DeviceUpdate::default());
    }
    parts[0].private_key = update.private_key;
    parts[0].listen_port = update.listen_port;
    parts
}

/// The `WG_CMD_GET_DEVICE` dump request for `device`.
pub fn get_device_message(device: &str) -> WireguardMessage {
    WireguardMessage {
        cmd: WireguardCmd::GetDevice,
        attributes: vec![WireguardAttribute::IfName(device.to_owned())],
    }
}

/// Reads the replies of a `WG_CMD_GET_DEVICE` dump. A peer whose allowed IPs did not fit
/// one message continues at the start of the next one, under the same key.
pub fn device_state(replies: &[WireguardMessage]) -> Result<DeviceState, String> {
    let mut device = DeviceState::default();
    for reply in replies {
        for attribute in &reply.attributes {
            match attribute {
                WireguardAttribute::ListenPort(port) => device.listen_port = *port,
                WireguardAttribute::PrivateKey(key) => device.has_private_key = *key != [0; 32],
                WireguardAttribute::Peers(peers) => {
                    for peer in peers {
                        let state = peer_state(peer)?;
                        match device.peers.last_mut() {
                            Some(last) if last.key == state.key => {
                                last.allowed_ips.extend(state.allowed_ips);
                            }
                            _ => device.peers.push(state),
                        }
                    }
                }
                _ => {}
            }
        }
    }
    Ok(device)
}

fn peer_state(peer: &WireguardPeer) -> Result<PeerState, String> {
    let mut key = None;
    let mut state = PeerState {
        key: Key([0; 32]),
        endpoint: None,
        allowed_ips: Vec::new(),
        last_handshake: None,
        rx_bytes: 0,
        tx_bytes: 0,
    };
    for attribute in &peer.0 {
        match attribute {
            WireguardPeerAttribute::PublicKey(bytes) => key = Some(Key(*bytes)),
            WireguardPeerAttribute::Endpoint(endpoint) => state.endpoint = Some(*endpoint),
            WireguardPeerAttribute::RxBytes(bytes) => state.rx_bytes = *bytes,
            WireguardPeerAttribute::TxBytes(bytes) => state.tx_bytes = *bytes,
            WireguardPeerAttribute::LastHandshake(time) => {
                let secs = u64::try_from(time.seconds).unwrap_or(0);
                let nanos = u32::try_from(time.nano_seconds).unwrap_or(0);
                state.last_handshake = (secs != 0 || nanos != 0)
                    .then(|| SystemTime::UNIX_EPOCH + Duration::new(secs, nanos.min(999_999_999)));
            }
            WireguardPeerAttribute::AllowedIps(ips) => {
                for ip in ips {
                    state.allowed_ips.push(allowed_ip(ip)?);
                }
            }
            _ => {}
        }
    }
    state.key = key.ok_or("a peer without a public key")?;
    Ok(state)
}

fn allowed_ip(ip: &WireguardAllowedIp) -> Result<IpPrefix, String> {
    let (mut addr, mut len) = (None, None);
    for attribute in &ip.0 {
        match attribute {
            WireguardAllowedIpAttr::IpAddr(a) => addr = Some(*a),
            WireguardAllowedIpAttr::Cidr(c) => len = Some(*c),
            _ => {}
        }
    }
    let (Some(addr), Some(len)) = (addr, len) else {
        return Err(format!("an incomplete allowed IP: {ip:?}"));
    };
    IpPrefix::new(addr, len).map_err(|err| format!("allowed IP {addr}/{len}: {err}"))
}

/// The kernel backend: one generic-netlink socket, the family ID resolved on first use.
pub struct KernelBackend {
    device: String,
    socket: Option<(GenlSocket, u16)>,
}

impl std::fmt::Debug for KernelBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelBackend")
            .field("device", &self.device)
            .field("family_id", &self.socket.as_ref().map(|(_, id)| *id))
            .finish()
    }
}

impl KernelBackend {
    /// The kernel device `device`.
    pub fn new(device: &str) -> Self {
        Self {
            device: device.to_owned(),
            socket: None,
        }
    }

    /// The socket and the `wireguard` family ID, opened and resolved on first use.
    fn socket(&mut self) -> Result<(&mut GenlSocket, u16), BackendError> {
        if self.socket.is_none() {
            let mut socket = GenlSocket::open().map_err(|err| self.error(err))?;
            let family = socket
                .resolve_family(FAMILY)
                .map_err(|err| self.error(err))?;
            self.socket = Some((socket, family));
        }
        let (socket, family) = self.socket.as_mut().expect("opened above");
        Ok((socket, *family))
    }

    fn error(&self, err: GenlError) -> BackendError {
        let device = self.device.clone();
        match err {
            // No such interface: the device vanished (and may be recreated).
            GenlError::Kernel {
                errno,
                error: source,
            } if errno == -libc::ENODEV => BackendError::Gone {
                device,
                detail: source.to_string(),
            },
            GenlError::Kernel { errno, .. } => BackendError::Refused {
                device,
                errno: i64::from(errno),
            },
            other => BackendError::Other {
                device,
                detail: other.to_string(),
            },
        }
    }

    fn exchange(
        &mut self,
        message: WireguardMessage,
        extra_flags: u16,
    ) -> Result<Vec<WireguardMessage>, BackendError> {
        let (socket, family) = self.socket()?;
        let mut genl = GenlMessage::from_payload(message);
        genl.set_resolved_family_id(family);
        match socket.request(genl, extra_flags) {
            Ok(replies) => Ok(replies.into_iter().map(|genl| genl.payload).collect()),
            Err(err) => {
                if matches!(err, GenlError::Io(_) | GenlError::Decode(_)) {
                    // The socket's state is unknown: open a fresh one next time.
                    self.socket = None;
                }
                Err(self.error(err))
            }
        }
    }
}

impl Backend for KernelBackend {
    fn device(&self) -> &str {
        &self.device
    }

    fn kind(&self) -> &'static str {
        "kernel"
    }

    fn get(&mut self) -> Result<DeviceState, BackendError> {
        let replies = self.exchange(get_device_message(&self.device), NLM_F_DUMP)?;
        device_state(&replies).map_err(|detail| BackendError::Other {
            device: self.device.clone(),
            detail,
        })
    }

    fn set(&mut self, update: &DeviceUpdate) -> Result<(), BackendError> {
        if update.is_empty() {
            return Ok(());
        }
        for part in split(update, PEERS_PER_MESSAGE) {
            self.exchange(set_device_message(&self.device, &part), 0)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::NetlinkPayload;

    use super::*;
    use crate::key::Key;

    fn update() -> DeviceUpdate {
        DeviceUpdate {
            private_key: Some(Key([1; 32])),
            listen_port: Some(51871),
            peers: vec![
                PeerUpdate {
                    key: Key([2; 32]),
                    remove: false,
                    endpoint: Some("10.213.0.2:51871".parse().unwrap()),
                    replace_allowed_ips: true,
                    allowed_ips: vec![
                        "10.214.2.0/24".parse().unwrap(),
                        "fd6d:77::/64".parse().unwrap(),
                    ],
                },
                PeerUpdate::remove(Key([3; 32])),
            ],
        }
    }

    #[test]
    fn set_device_request_round_trips_with_flags_and_families() {
        let bytes = serialize(0x1d, set_device_message("meshwork_wg0", &update()));
        // nlmsghdr: length, then type = the family ID, flags = REQUEST|ACK.
        assert_eq!(
            u32::from_ne_bytes(bytes[0..4].try_into().unwrap()) as usize,
            bytes.len()
        );
        assert_eq!(u16::from_ne_bytes([bytes[4], bytes[5]]), 0x1d);
        assert_eq!(
            u16::from_ne_bytes([bytes[6], bytes[7]]),
            NLM_F_REQUEST | NLM_F_ACK
        );

        let parsed = NetlinkMessage::<GenlMessage<WireguardMessage>>::deserialize(&bytes).unwrap();
        let NetlinkPayload::InnerMessage(genl) = parsed.payload else {
            panic!("not a genl message: {parsed:?}");
        };
        let message = genl.payload;
        assert_eq!(message.cmd, WireguardCmd::SetDevice);
        assert_eq!(message, set_device_message("meshwork_wg0", &update()));
        let WireguardAttribute::Peers(peers) = &message.attributes[3] else {
            panic!("peers expected: {:?}", message.attributes);
        };
        assert!(peers[0].0.contains(&WireguardPeerAttribute::Flags(
            WireguardPeerFlags::ReplaceAllowedIps
        )));
        assert_eq!(
            peers[1].0,
            vec![
                WireguardPeerAttribute::PublicKey([3; 32]),
                WireguardPeerAttribute::Flags(WireguardPeerFlags::RemoveMe)
            ]
        );
    }

    #[test]
    fn split_keeps_device_settings_in_the_first_part_only() {
        let parts = split(&update(), 1);
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].listen_port, Some(51871));
        assert_eq!(parts[1].listen_port, None);
        assert_eq!(parts[1].peers, vec![PeerUpdate::remove(Key([3; 32]))]);
        assert_eq!(split(&DeviceUpdate::default(), 10).len(), 1);
    }

    #[test]
    fn get_device_replies_are_read_with_peers_continued_across_messages() {
        let bytes = serialize(0x1d, get_device_message("meshwork_wg0"));
        let parsed = NetlinkMessage::<GenlMessage<WireguardMessage>>::deserialize(&bytes).unwrap();
        let NetlinkPayload::InnerMessage(genl) = parsed.payload else {
            panic!("not a genl message: {parsed:?}");
        };
        assert_eq!(genl.payload.cmd, WireguardCmd::GetDevice);

        let ip = |addr: &str, len: u8| {
            WireguardAllowedIp(vec![
                WireguardAllowedIpAttr::Family(WireguardAddressFamily::Ipv4),
                WireguardAllowedIpAttr::IpAddr(addr.parse().unwrap()),
                WireguardAllowedIpAttr::Cidr(len),
            ])
        };
        let first = WireguardMessage {
            cmd: WireguardCmd::GetDevice,
            attributes: vec![
                WireguardAttribute::ListenPort(51871),
                WireguardAttribute::PrivateKey([9; 32]),
                WireguardAttribute::Peers(vec![WireguardPeer(vec![
                    WireguardPeerAttribute::PublicKey([2; 32]),
                    WireguardPeerAttribute::Endpoint("10.213.0.2:51871".parse().unwrap()),
                    WireguardPeerAttribute::RxBytes(20),
                    WireguardPeerAttribute::AllowedIps(vec![ip("10.214.2.0", 24)]),
                ])]),
            ],
        };
        // The dump's next message: the same peer's remaining allowed IPs, then another peer.
        let second = WireguardMessage {
            cmd: WireguardCmd::GetDevice,
            attributes: vec![WireguardAttribute::Peers(vec![
                WireguardPeer(vec![
                    WireguardPeerAttribute::PublicKey([2; 32]),
                    WireguardPeerAttribute::AllowedIps(vec![ip("10.214.9.9", 32)]),
                ]),
                WireguardPeer(vec![WireguardPeerAttribute::PublicKey([3; 32])]),
            ])],
        };
        let device = device_state(&[first, second]).unwrap();
        assert_eq!(device.listen_port, 51871);
        assert!(device.has_private_key);
        assert_eq!(device.peers.len(), 2);
        assert_eq!(device.peers[0].key, Key([2; 32]));
        assert_eq!(device.peers[0].rx_bytes, 20);
        assert_eq!(
            device.peers[0].allowed_ips,
            vec![
                "10.214.2.0/24".parse().unwrap(),
                "10.214.9.9/32".parse().unwrap()
            ]
        );
        assert_eq!(device.peers[1].key, Key([3; 32]));
        let keyless = WireguardMessage {
            cmd: WireguardCmd::GetDevice,
            attributes: vec![WireguardAttribute::Peers(vec![WireguardPeer(vec![])])],
        };
        assert!(device_state(&[keyless]).is_err());
    }

    #[test]
    fn without_the_module_the_kernel_backend_fails_clearly() {
        if kernel_has_wireguard() {
            return; // this machine has the module: the failure cannot be shown here
        }
        let err = GenlSocket::open()
            .unwrap()
            .resolve_family(FAMILY)
            .unwrap_err();
        assert!(
            matches!(&err, GenlError::FamilyNotFound { family } if family == "wireguard"),
            "{err:?}"
        );
        let mut backend = KernelBackend::new("meshwork_wg0");
        let err = backend.get().unwrap_err();
        assert!(!err.is_gone(), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("meshwork_wg0") && text.contains("WireGuard kernel module"),
            "{text}"
        );
        let update = DeviceUpdate {
            listen_port: Some(51871),
            ..DeviceUpdate::default()
        };
        assert!(backend.set(&update).is_err());
    }
}
