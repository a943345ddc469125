//! Names derived from the attachment (container ID and interface), so DEL and CHECK find
//! what ADD made without any state of their own.
//!
//! The attachment `<container id>/<ifname>` is the IPAM owner; the host veth's name and the
//! endpoint ID are hashes of it (FNV-1a 64: stable across builds and Rust versions, unlike
//! `std`'s hasher). Hashing the interface too keeps two interfaces of one container apart.

/// The IPAM owner of an attachment: `<container id>/<ifname>`.
pub fn owner(container_id: &str, ifname: &str) -> String {
    format!("{container_id}/{ifname}")
}

/// The host end of the attachment's veth: `mw` and 11 hex digits (13 characters, within
/// Linux's 15).
pub fn host_ifname(container_id: &str, ifname: &str) -> String {
    let hash = fnv1a(owner(container_id, ifname).as_bytes());
    format!("mw{:011x}", hash >> 20)
}

/// The attachment's endpoint ID on the agent: a hash of the owner, never 0, below 2^53 (so
/// it survives JSON readers that use doubles).
pub fn endpoint_id(container_id: &str, ifname: &str) -> u64 {
    let mut input = b"endpoint:".to_vec();
    input.extend_from_slice(owner(container_id, ifname).as_bytes());
    let id = fnv1a(&input) & ((1 << 53) - 1);
    id.max(1)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |hash, b| (hash ^ u64::from(*b)).wrapping_mul(PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_short_and_distinct() {
        let id = "0f3a9c0e6a1b4e2d8c7f5a3b1e9d7c5a3b1e9d7c5a3b1e9d7c5a3b1e9d7c5a3b";
        let name = host_ifname(id, "eth0");
        assert_eq!(name.len(), 13);
        assert!(name.starts_with("mw") && name[2..].bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(name, host_ifname(id, "eth0"), "deterministic");
        assert_ne!(name, host_ifname(id, "net1"));
        assert_ne!(name, host_ifname("another", "eth0"));
        // Pinned: a change here renames every host veth, and DEL after an upgrade would
        // miss the ones made before it. (Values from an independent FNV-1a computation.)
        assert_eq!(host_ifname("abc", "eth0"), "mw561a69de51a");
        assert_eq!(endpoint_id("abc", "eth0"), 2_498_039_758_585_474);

        assert_ne!(endpoint_id(id, "eth0"), endpoint_id(id, "net1"));
        assert!(endpoint_id(id, "eth0") < 1 << 53);
        assert_eq!(owner(id, "eth0"), format!("{id}/eth0"));
    }
}
