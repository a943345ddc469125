//! Kernel WireGuard over generic netlink: request building with `netlink-packet-wireguard`.
//!
//! The machines this is developed on have no WireGuard kernel module, so the requests are
//! built and checked here (serialised and parsed back); sending them needs the resolved
//! `wireguard` genl family ID and a netlink socket, which [`KernelBackend`] reports as
//! unsupported until a machine with the module can test it.

use netlink_packet_core::{NLM_F_ACK, NLM_F_REQUEST, NetlinkMessage};
use netlink_packet_generic::GenlMessage;
use netlink_packet_wireguard::{
    WireguardAddressFamily, WireguardAllowedIp, WireguardAllowedIpAttr, WireguardAttribute,
    WireguardCmd, WireguardMessage, WireguardPeer, WireguardPeerAttribute, WireguardPeerFlags,
};

use super::backend::{Backend, BackendError, DeviceState, DeviceUpdate, PeerUpdate};

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

/// The kernel backend. See the module docs: sending is not implemented yet.
#[derive(Debug, Clone)]
pub struct KernelBackend {
    device: String,
}

impl KernelBackend {
    /// The kernel device `device`.
    pub fn new(device: &str) -> Self {
        Self {
            device: device.to_owned(),
        }
    }

    fn unsupported(&self) -> BackendError {
        BackendError::Other {
            device: self.device.clone(),
            detail: "kernel WireGuard over netlink is not supported yet; use \
                     --wireguard-userspace-fallback"
                .to_owned(),
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
        Err(self.unsupported())
    }

    fn set(&mut self, _: &DeviceUpdate) -> Result<(), BackendError> {
        Err(self.unsupported())
    }
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::NetlinkPayload;

    use super::*;
    use crate::wireguard::key::Key;

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
}
