//! What the WireGuard actor reports (`meshctl encrypt status`).

use std::time::SystemTime;

use meshwork_types::Node;

/// The device and its peers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncryptStatus {
    /// Device name.
    pub device: String,
    /// `userspace` (UAPI socket) or `kernel`.
    pub backend: String,
    /// The node's public key (base64).
    pub public_key: String,
    /// Listen port as the device reports it.
    pub listen_port: u16,
    /// Whether the device answered.
    pub device_up: bool,
    /// PID of the userspace implementation this agent started, if any.
    pub userspace_pid: Option<u32>,
    /// How often the device was found gone and configured again.
    pub device_recreations: u64,
    /// Peers on the device.
    pub peers: Vec<PeerStatus>,
    /// Restored peers or allowed IPs still awaiting garbage collection.
    pub pending_gc: Vec<PendingGc>,
    /// Nodes rejected for a key another node uses.
    pub rejected_duplicate_keys: u64,
    /// Nodes rejected for a malformed key.
    pub rejected_malformed_keys: u64,
    /// The last device error, if the last attempt failed.
    pub last_error: Option<String>,
    /// The agent's own node object, `WireguardPubKey` set.
    pub local_node: Node,
}

/// One peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerStatus {
    /// Public key (base64).
    pub public_key: String,
    /// The remote node using it (`cluster/name`), if any.
    pub node: Option<String>,
    /// Endpoint.
    pub endpoint: Option<String>,
    /// Allowed IPs.
    pub allowed_ips: Vec<String>,
    /// Last handshake.
    pub last_handshake: Option<SystemTime>,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
}

/// Restored state not collected yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingGc {
    /// Public key (base64).
    pub public_key: String,
    /// The wait blocking it: `NodesSynced` (the peer) or `IPIdentitiesSynced` (its
    /// restored allowed IPs).
    pub wait: String,
}
