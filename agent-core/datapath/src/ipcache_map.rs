//! The `cilium_ipcache` map's key and value, byte for byte as Cilium lays them out (§5), and the
//! checks an entry passes before it may be written.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use meshwork_types::IpCacheEntry;

/// Bits of the key after `prefixlen` that precede the IP: pad (16), cluster ID (8), family (8).
pub const STATIC_PREFIX_BITS: u32 = 32;
/// `family` of an IPv4 key.
pub const FAMILY_IPV4: u8 = 1;
/// `family` of an IPv6 key.
pub const FAMILY_IPV6: u8 = 2;
/// The map's capacity, as Cilium sizes it.
pub const MAX_ENTRIES: u32 = 512_000;

/// The 24-byte LPM key.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IpCacheKey {
    /// [`STATIC_PREFIX_BITS`] + the IP prefix length.
    pub prefixlen: u32,
    /// Zero.
    pub pad1: u16,
    /// The cluster the prefix belongs to when prefixes overlap across clusters; 0 otherwise.
    pub cluster_id: u8,
    /// [`FAMILY_IPV4`] or [`FAMILY_IPV6`].
    pub family: u8,
    /// The IP, network order; an IPv4 address fills the first 4 bytes.
    pub ip: [u8; 16],
}

/// The 12-byte value (`struct remote_endpoint_info`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IpCacheValue {
    /// The security identity.
    pub sec_identity: u32,
    /// The node hosting the prefix, IPv4 in network order; 0 for the local node.
    pub tunnel_endpoint: [u8; 4],
    /// Zero.
    pub pad: u16,
    /// The encryption key index.
    pub key: u8,
    /// Zero.
    pub pad2: u8,
}

// SAFETY: both are repr(C), made only of integers and byte arrays, with no implicit padding
// (24 and 12 bytes, asserted below), so every bit pattern is a valid value.
#[allow(unsafe_code)]
unsafe impl aya::Pod for IpCacheKey {}
#[allow(unsafe_code)]
unsafe impl aya::Pod for IpCacheValue {}

const _: () = assert!(size_of::<IpCacheKey>() == 24);
const _: () = assert!(size_of::<IpCacheValue>() == 12);

/// Why an entry is not written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// The IP text does not parse.
    #[error("unparsable IP {0:?}")]
    UnparsableIp(String),
    /// The mask is longer than the address family allows.
    #[error("prefix length {len} is longer than the {bits} bits of {addr}")]
    MaskTooLong {
        /// The address.
        addr: IpAddr,
        /// The requested length.
        len: u8,
        /// The family's width.
        bits: u8,
    },
    /// Identity 0 is never valid in the datapath.
    #[error("identity 0 for {0}")]
    ZeroIdentity(String),
}

impl EntryError {
    /// Every [`Self::reason`], so metrics can show each from the start.
    pub const REASONS: [&'static str; 3] = ["unparsable_ip", "mask_too_long", "zero_identity"];

    /// A short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::UnparsableIp(_) => "unparsable_ip",
            Self::MaskTooLong { .. } => "mask_too_long",
            Self::ZeroIdentity(_) => "zero_identity",
        }
    }
}

impl IpCacheKey {
    /// The key of `addr/len`, the host bits cleared.
    pub fn new(addr: IpAddr, len: u8, cluster_id: u8) -> Result<Self, EntryError> {
        let bits = if addr.is_ipv4() { 32 } else { 128 };
        if len > bits {
            return Err(EntryError::MaskTooLong { addr, len, bits });
        }
        let mut ip = [0u8; 16];
        let family = match addr {
            IpAddr::V4(v4) => {
                let masked = u32::from(v4) & mask_u32(len);
                ip[..4].copy_from_slice(&masked.to_be_bytes());
                FAMILY_IPV4
            }
            IpAddr::V6(v6) => {
                let masked = u128::from(v6) & mask_u128(len);
                ip.copy_from_slice(&masked.to_be_bytes());
                FAMILY_IPV6
            }
        };
        Ok(Self {
            prefixlen: STATIC_PREFIX_BITS + u32::from(len),
            pad1: 0,
            cluster_id,
            family,
            ip,
        })
    }

    /// aya's LPM key of this key: the prefix length, then the rest of Cilium's key as bytes
    /// (exactly what the kernel sees).
    pub fn to_aya(&self) -> aya::maps::lpm_trie::Key<crate::maps::IpCacheKeyData> {
        let mut data = [0u8; 20];
        data[..2].copy_from_slice(&self.pad1.to_ne_bytes());
        data[2] = self.cluster_id;
        data[3] = self.family;
        data[4..].copy_from_slice(&self.ip);
        aya::maps::lpm_trie::Key::new(self.prefixlen, data)
    }

    /// Parses `ip` or `ip/len` (the forms of the kvstore and of `meshctl`).
    pub fn parse(text: &str, cluster_id: u8) -> Result<Self, EntryError> {
        let (ip, len) = match text.split_once('/') {
            Some((ip, len)) => (ip, Some(len)),
            None => (text, None),
        };
        let addr: IpAddr = ip
            .parse()
            .map_err(|_| EntryError::UnparsableIp(text.to_owned()))?;
        let len = match len {
            None if addr.is_ipv4() => 32,
            None => 128,
            Some(len) => len
                .parse()
                .map_err(|_| EntryError::UnparsableIp(text.to_owned()))?,
        };
        Self::new(addr, len, cluster_id)
    }

    /// The IP prefix length.
    pub fn prefix_len(&self) -> u8 {
        u8::try_from(self.prefixlen.saturating_sub(STATIC_PREFIX_BITS)).unwrap_or(u8::MAX)
    }

    /// The address.
    pub fn addr(&self) -> IpAddr {
        if self.family == FAMILY_IPV6 {
            IpAddr::V6(Ipv6Addr::from(self.ip))
        } else {
            IpAddr::V4(Ipv4Addr::new(
                self.ip[0], self.ip[1], self.ip[2], self.ip[3],
            ))
        }
    }
}

impl std::fmt::Display for IpCacheKey {
    /// `addr/len`, with `@cluster` when the key carries a cluster ID (as `cilium-dbg` shows it).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr(), self.prefix_len())?;
        if self.cluster_id != 0 {
            write!(f, "@{}", self.cluster_id)?;
        }
        Ok(())
    }
}

impl IpCacheValue {
    /// The value for `identity` hosted on `tunnel` (None: the local node).
    pub fn new(identity: u32, tunnel: Option<Ipv4Addr>, key: u8) -> Self {
        Self {
            sec_identity: identity,
            tunnel_endpoint: tunnel.map(|ip| ip.octets()).unwrap_or_default(),
            pad: 0,
            key,
            pad2: 0,
        }
    }

    /// The tunnel endpoint, None for the local node.
    pub fn tunnel(&self) -> Option<Ipv4Addr> {
        (self.tunnel_endpoint != [0; 4]).then(|| Ipv4Addr::from(self.tunnel_endpoint))
    }
}

/// The key and value of a remote or local ipcache entry. The tunnel endpoint is the entry's
/// host IPv4 unless that is `local_node` (Cilium leaves IPv6 host IPs out of the value).
pub fn encode(
    entry: &IpCacheEntry,
    local_node: Option<IpAddr>,
) -> Result<(IpCacheKey, IpCacheValue), EntryError> {
    let key = IpCacheKey::new(entry.prefix.addr(), entry.prefix.prefix_len(), 0)?;
    if entry.identity == 0 {
        return Err(EntryError::ZeroIdentity(entry.key_name()));
    }
    let tunnel = match entry.host_ip {
        Some(IpAddr::V4(host)) if Some(IpAddr::V4(host)) != local_node => Some(host),
        _ => None,
    };
    Ok((
        key,
        IpCacheValue::new(entry.identity, tunnel, entry.encrypt_key),
    ))
}

fn mask_u32(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len))
    }
}

fn mask_u128(len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<T: Copy>(value: &T) -> Vec<u8> {
        let size = size_of::<T>();
        let ptr = std::ptr::from_ref(value).cast::<u8>();
        // Test-only view of a Pod value's bytes.
        #[allow(unsafe_code)]
        unsafe { std::slice::from_raw_parts(ptr, size) }.to_vec()
    }

    #[test]
    fn ipv4_key_is_cilium_layout() {
        let key = IpCacheKey::parse("10.214.2.9", 0).unwrap();
        let mut expected = vec![64, 0, 0, 0, 0, 0, 0, FAMILY_IPV4, 10, 214, 2, 9];
        expected.resize(24, 0);
        assert_eq!(bytes(&key), expected);
        assert_eq!(key.to_string(), "10.214.2.9/32");
    }

    #[test]
    fn ipv6_prefix_is_masked() {
        let key = IpCacheKey::parse("fd6d:77::1:2/64", 3).unwrap();
        assert_eq!(key.prefixlen, 96);
        assert_eq!(key.family, FAMILY_IPV6);
        assert_eq!(key.to_string(), "fd6d:77::/64@3");
    }

    #[test]
    fn value_layout_keeps_tunnel_in_network_order() {
        let value = IpCacheValue::new(0x0102_0304, Some(Ipv4Addr::new(10, 213, 0, 2)), 7);
        assert_eq!(
            bytes(&value),
            [4, 3, 2, 1, 10, 213, 0, 2, 0, 0, 7, 0],
            "identity is host order (little endian here), the tunnel network order"
        );
        assert_eq!(value.tunnel(), Some(Ipv4Addr::new(10, 213, 0, 2)));
    }

    #[test]
    fn bad_entries_are_rejected() {
        assert!(matches!(
            IpCacheKey::parse("10.0.0.300", 0),
            Err(EntryError::UnparsableIp(_))
        ));
        assert!(matches!(
            IpCacheKey::parse("10.0.0.1/33", 0),
            Err(EntryError::MaskTooLong { bits: 32, .. })
        ));
        assert!(matches!(
            IpCacheKey::parse("fd00::1/129", 0),
            Err(EntryError::MaskTooLong { bits: 128, .. })
        ));
        assert!(matches!(
            IpCacheKey::parse("fd00::1/x", 0),
            Err(EntryError::UnparsableIp(_))
        ));
    }

    #[test]
    fn every_reason_is_listed() {
        let errors = [
            EntryError::UnparsableIp("x".to_owned()),
            EntryError::MaskTooLong {
                addr: Ipv4Addr::LOCALHOST.into(),
                len: 33,
                bits: 32,
            },
            EntryError::ZeroIdentity("10.0.0.1".to_owned()),
        ];
        assert_eq!(errors.map(|e| e.reason()), EntryError::REASONS);
    }
}
