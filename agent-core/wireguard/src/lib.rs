//! WireGuard: one peer per remote node, kept across agent restarts (§6 of the behaviour
//! contract).
//!
//! - [`key`]: keys and the private key file.
//! - [`local_node`]: the agent's own node object, with `WireguardPubKey`.
//! - [`backend`]: the device trait; [`uapi`] (wireguard-go, boringtun) and [`netlink`]
//!   (kernel, over a [`genl`] socket) implement it.
//! - [`userspace`]: starts and supervises a userspace implementation when the kernel has no
//!   WireGuard (`--wireguard-userspace-fallback`).
//! - [`peers`]: the peer table, a plain state machine.
//! - [`device`]: the device supervisor: applies the table's plans, collects restored peers,
//!   recreates a vanished device.
//! - [`status`]: what `meshctl encrypt status` shows.
//! - [`metrics`]: `meshwork_wireguard_*` (rejections, peers).

pub mod backend;
pub mod device;
pub mod genl;
pub mod key;
pub mod local_node;
pub mod metrics;
pub mod netlink;
pub mod peers;
pub mod status;
pub mod uapi;
pub mod userspace;

/// The WireGuard listen port of every node (Cilium's).
pub const LISTEN_PORT: u16 = 51871;

/// The default device name.
pub const DEFAULT_DEVICE: &str = "meshwork_wg0";

/// The private key file's name in the state dir.
pub const PRIVATE_KEY_FILE: &str = "wireguard.key";
