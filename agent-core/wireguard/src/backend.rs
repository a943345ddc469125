//! One trait over the two ways to drive a WireGuard device: the cross-platform UAPI socket
//! (wireguard-go, boringtun) and kernel generic netlink.

use std::net::SocketAddr;
use std::time::SystemTime;

use super::key::Key;
use meshwork_types::IpPrefix;

/// Why a device operation failed.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The device is not there (no socket, nobody answering, no such interface).
    #[error("WireGuard device {device} is gone: {detail}")]
    Gone {
        /// The device.
        device: String,
        /// What was seen.
        detail: String,
    },
    /// The device answered with an error.
    #[error("WireGuard device {device} refused the request: errno={errno}")]
    Refused {
        /// The device.
        device: String,
        /// The errno it answered.
        errno: i64,
    },
    /// Transport trouble, an unreadable answer, or an unsupported backend.
    #[error("WireGuard device {device}: {detail}")]
    Other {
        /// The device.
        device: String,
        /// What went wrong.
        detail: String,
    },
}

impl BackendError {
    /// Whether the device has vanished (and may be recreated).
    pub fn is_gone(&self) -> bool {
        matches!(self, Self::Gone { .. })
    }
}

/// A peer as the device reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerState {
    /// Public key.
    pub key: Key,
    /// Endpoint, if known.
    pub endpoint: Option<SocketAddr>,
    /// Allowed IPs.
    pub allowed_ips: Vec<IpPrefix>,
    /// Last handshake (`None`: never).
    pub last_handshake: Option<SystemTime>,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
}

/// A device as it reports itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceState {
    /// Listen port (0: none).
    pub listen_port: u16,
    /// Whether a private key is set.
    pub has_private_key: bool,
    /// Peers.
    pub peers: Vec<PeerState>,
}

/// A change of one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerUpdate {
    /// Public key.
    pub key: Key,
    /// Remove the peer (everything else ignored).
    pub remove: bool,
    /// New endpoint.
    pub endpoint: Option<SocketAddr>,
    /// Replace the allowed IPs by `allowed_ips` rather than adding them.
    pub replace_allowed_ips: bool,
    /// Allowed IPs to add (or the whole set with `replace_allowed_ips`).
    pub allowed_ips: Vec<IpPrefix>,
}

impl PeerUpdate {
    /// Removal of `key`.
    pub fn remove(key: Key) -> Self {
        Self {
            key,
            remove: true,
            endpoint: None,
            replace_allowed_ips: false,
            allowed_ips: Vec::new(),
        }
    }
}

/// One request to the device: device settings and peer changes, applied in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceUpdate {
    /// Private key to set.
    pub private_key: Option<Key>,
    /// Listen port to set.
    pub listen_port: Option<u16>,
    /// Peer changes.
    pub peers: Vec<PeerUpdate>,
}

impl DeviceUpdate {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.private_key.is_none() && self.listen_port.is_none() && self.peers.is_empty()
    }
}

/// Drives one WireGuard device. Calls block (bounded by the backend's I/O timeouts): whoever
/// owns a backend runs on a thread of its own.
pub trait Backend: Send {
    /// The device name.
    fn device(&self) -> &str;
    /// `userspace` or `kernel`.
    fn kind(&self) -> &'static str;
    /// Reads the device.
    fn get(&mut self) -> Result<DeviceState, BackendError>;
    /// Applies `update` in one request.
    fn set(&mut self, update: &DeviceUpdate) -> Result<(), BackendError>;
    /// Checks that the device is there, as cheaply as the backend can (the health probe
    /// runs every second: it must not read thousands of peers).
    fn probe(&mut self) -> Result<(), BackendError> {
        self.get().map(drop)
    }
}
