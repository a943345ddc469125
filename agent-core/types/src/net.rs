//! IP prefixes and masks, with Go's `net` package semantics where they reach the wire.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::de::{self, Deserializer, Visitor};
use serde::ser::{SerializeStruct as _, Serializer};
use serde::{Deserialize, Serialize};

use super::base64;
use super::go_json::{GoIp, GoMask, go_struct};

/// Parses an IP the way Go's `net.ParseIP` does (no zones, no leading zeros in IPv4), returning
/// IPv4-mapped IPv6 addresses as IPv4: Go stores both in the same 16-byte form and prints the
/// IPv4 text.
pub(crate) fn parse_go_ip(text: &str) -> Option<IpAddr> {
    text.parse::<IpAddr>().ok().map(go_ip_normalize)
}

/// Maps `::ffff:a.b.c.d` to `a.b.c.d`, as Go's `net.IP` does when printing.
pub(crate) fn go_ip_normalize(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// Number of bits of the address family of `ip` (32 or 128).
pub(crate) fn family_bits(ip: IpAddr) -> u8 {
    if ip.is_ipv4() { 32 } else { 128 }
}

/// A network mask as Go's `net.IPMask` holds it: 0 to 16 raw bytes (4 for IPv4, 16 for IPv6
/// when well formed). Stored inline, so decoding a mask does not allocate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IpMask {
    bytes: [u8; 16],
    len: u8,
}

impl IpMask {
    /// A mask from raw bytes; `None` if longer than 16 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let mut mask = Self {
            bytes: [0; 16],
            len: u8::try_from(bytes.len()).ok()?,
        };
        mask.bytes.get_mut(..bytes.len())?.copy_from_slice(bytes);
        Some(mask)
    }

    /// The canonical mask of `ones` leading one bits out of `bits` (32 or 128), like Go's
    /// `net.CIDRMask`; `None` if `bits` is not 32 or 128 or `ones > bits`.
    pub fn cidr(ones: u8, bits: u8) -> Option<Self> {
        if !(bits == 32 || bits == 128) || ones > bits {
            return None;
        }
        let mut mask = Self {
            bytes: [0; 16],
            len: bits / 8,
        };
        for (i, byte) in mask.bytes[..usize::from(bits / 8)].iter_mut().enumerate() {
            let remaining = usize::from(ones).saturating_sub(i * 8).min(8);
            *byte = !(0xffu8.checked_shr(remaining as u32).unwrap_or(0));
        }
        Some(mask)
    }

    /// The raw mask bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// Total bits in the mask (`8 * byte length`).
    pub fn bits(&self) -> u8 {
        self.len.saturating_mul(8)
    }

    /// Number of leading one bits if the mask is canonical (ones then zeros) and not empty,
    /// the `ones` of Go's `IPMask.Size()`; `None` where Go reports `0, 0`.
    pub fn prefix_len(&self) -> Option<u8> {
        if self.len == 0 {
            return None;
        }
        let mut ones = 0u8;
        let mut seen_zero = false;
        for &byte in self.as_bytes() {
            if seen_zero {
                if byte != 0 {
                    return None;
                }
                continue;
            }
            if byte == 0xff {
                ones += 8;
                continue;
            }
            // A partial byte must be ones followed by zeros.
            if byte.leading_ones() + byte.trailing_zeros() != 8 {
                return None;
            }
            ones += byte.leading_ones() as u8;
            seen_zero = true;
        }
        Some(ones)
    }
}

/// An IP network: an address and a prefix length no longer than its family.
///
/// On the wire (node CIDR fields) it is Cilium's legacy `*cidr.CIDR` encoding, the promoted
/// fields of Go's `net.IPNet`: `{"IP":"10.244.1.0","Mask":"////AA=="}`. Reading also accepts
/// the string form `"10.244.1.0/24"` that newer Cilium versions will switch to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IpPrefix {
    addr: IpAddr,
    len: u8,
}

/// Why a prefix could not be built or parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrefixError {
    /// The prefix length exceeds the address family's bits.
    #[error("prefix length {len} is longer than the {bits} bits of {addr}")]
    TooLong {
        /// The address.
        addr: IpAddr,
        /// The requested length.
        len: u8,
        /// Bits of the address family.
        bits: u8,
    },
    /// Text that is not `<ip>/<len>`.
    #[error("invalid prefix {0:?}")]
    Syntax(String),
}

impl IpPrefix {
    /// A prefix of `len` bits at `addr` (host bits are kept; see [`IpPrefix::masked`]).
    /// IPv4-mapped IPv6 addresses are taken as IPv4, like Go.
    pub fn new(addr: IpAddr, len: u8) -> Result<Self, PrefixError> {
        let addr = go_ip_normalize(addr);
        let bits = family_bits(addr);
        if len > bits {
            return Err(PrefixError::TooLong { addr, len, bits });
        }
        Ok(Self { addr, len })
    }

    /// The single-address prefix of `addr` (/32 or /128).
    pub fn host(addr: IpAddr) -> Self {
        let addr = go_ip_normalize(addr);
        Self {
            addr,
            len: family_bits(addr),
        }
    }

    /// The address as given (possibly with host bits set).
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length in bits.
    pub fn prefix_len(&self) -> u8 {
        self.len
    }

    /// Whether this is a single address (/32 or /128).
    pub fn is_host(&self) -> bool {
        self.len == family_bits(self.addr)
    }

    /// The same prefix with host bits cleared (the network address).
    pub fn masked(&self) -> Self {
        let addr = match self.addr {
            IpAddr::V4(v4) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.len)).unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask))
            }
            IpAddr::V6(v6) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.len))
                    .unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
            }
        };
        Self {
            addr,
            len: self.len,
        }
    }

    /// The canonical mask of this prefix (4 bytes for IPv4, 16 for IPv6).
    pub fn mask(&self) -> IpMask {
        IpMask::cidr(self.len, family_bits(self.addr)).unwrap_or_default()
    }

    /// Whether `ip` lies in this prefix.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = go_ip_normalize(ip);
        ip.is_ipv4() == self.addr.is_ipv4()
            && Self {
                addr: ip,
                len: self.len,
            }
            .masked()
                == self.masked()
    }
}

impl fmt::Display for IpPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl FromStr for IpPrefix {
    type Err = PrefixError;

    /// Parses `<ip>/<len>` strictly, like Go's `netip.ParsePrefix` (decimal length without sign
    /// or leading zeros).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let syntax = || PrefixError::Syntax(text.to_owned());
        let (ip, len) = text.split_once('/').ok_or_else(syntax)?;
        let canonical_len = !len.is_empty()
            && len.bytes().all(|b| b.is_ascii_digit())
            && (len == "0" || !len.starts_with('0'));
        if !canonical_len {
            return Err(syntax());
        }
        let addr = ip.parse::<IpAddr>().map_err(|_| syntax())?;
        Self::new(addr, len.parse().map_err(|_| syntax())?)
    }
}

impl Serialize for IpPrefix {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let masked = self.masked();
        let mut st = serializer.serialize_struct("CIDR", 2)?;
        st.serialize_field("IP", &format_args!("{}", masked.addr))?;
        st.serialize_field("Mask", &base64::encode(self.mask().as_bytes()))?;
        st.end()
    }
}

go_struct! {
    /// The legacy object form of a node CIDR (Go's `net.IPNet` fields).
    struct LegacyCidr {
        ip: Option<IpAddr> => "IP" as GoIp,
        mask: Option<IpMask> => "Mask" as GoMask,
    }
}

impl<'de> Deserialize<'de> for IpPrefix {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PrefixVisitor;
        impl<'de> Visitor<'de> for PrefixVisitor {
            type Value = IpPrefix;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#"a CIDR as {"IP":..,"Mask":..} or "<ip>/<len>""#)
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<IpPrefix, E> {
                text.parse::<IpPrefix>()
                    .map(|p| p.masked())
                    .map_err(E::custom)
            }

            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<IpPrefix, A::Error> {
                let legacy = LegacyCidr::deserialize(de::value::MapAccessDeserializer::new(map))?;
                let addr = legacy
                    .ip
                    .ok_or_else(|| de::Error::custom("invalid IP in node CIDR"))?;
                // Like Cilium: the mask must be canonical; its length need not match the
                // family as long as the prefix fits.
                let ones = legacy
                    .mask
                    .and_then(|mask| mask.prefix_len())
                    .ok_or_else(|| de::Error::custom("non-canonical mask in node CIDR"))?;
                IpPrefix::new(addr, ones)
                    .map(|p| p.masked())
                    .map_err(de::Error::custom)
            }
        }
        deserializer.deserialize_any(PrefixVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix(text: &str) -> IpPrefix {
        text.parse().unwrap()
    }

    #[test]
    fn masks() {
        assert_eq!(IpMask::cidr(24, 32).unwrap().as_bytes(), [255, 255, 255, 0]);
        assert_eq!(IpMask::cidr(0, 32).unwrap().as_bytes(), [0, 0, 0, 0]);
        assert_eq!(IpMask::cidr(13, 32).unwrap().as_bytes(), [255, 248, 0, 0]);
        assert_eq!(IpMask::cidr(128, 128).unwrap().as_bytes(), [255; 16]);
        assert_eq!(IpMask::cidr(33, 32), None);
        for ones in 0..=32 {
            assert_eq!(IpMask::cidr(ones, 32).unwrap().prefix_len(), Some(ones));
        }
        assert_eq!(
            IpMask::from_bytes(&[255, 0, 255, 0]).unwrap().prefix_len(),
            None
        );
        assert_eq!(
            IpMask::from_bytes(&[255, 254, 1, 0]).unwrap().prefix_len(),
            None
        );
        assert_eq!(
            IpMask::from_bytes(&[0xf0, 0, 0, 0]).unwrap().prefix_len(),
            Some(4)
        );
        assert_eq!(
            IpMask::from_bytes(&[0x0f, 0, 0, 0]).unwrap().prefix_len(),
            None
        );
        assert_eq!(IpMask::from_bytes(&[]).unwrap().prefix_len(), None);
        assert_eq!(IpMask::from_bytes(&[0; 17]), None);
    }

    #[test]
    fn go_ip_text() {
        assert_eq!(
            parse_go_ip("::ffff:10.1.2.3"),
            Some("10.1.2.3".parse().unwrap())
        );
        assert_eq!(parse_go_ip("010.1.2.3"), None, "Go rejects leading zeros");
        assert_eq!(
            parse_go_ip("fe80::1%eth0"),
            None,
            "Go's ParseIP rejects zones"
        );
        // Go prints IPv4-compatible addresses in hex, like Rust.
        assert_eq!(parse_go_ip("::1.2.3.4").unwrap().to_string(), "::102:304");
        assert_eq!(
            parse_go_ip("FD00:0:0::0001").unwrap().to_string(),
            "fd00::1"
        );
        assert_eq!(
            parse_go_ip("1:0:0:1:0:0:0:1").unwrap().to_string(),
            "1:0:0:1::1"
        );
        assert_eq!(
            parse_go_ip("1:0:0:1:0:0:1:1").unwrap().to_string(),
            "1::1:0:0:1:1"
        );
    }

    #[test]
    fn prefixes() {
        let p = prefix("10.244.1.5/24");
        assert_eq!(p.masked(), prefix("10.244.1.0/24"));
        assert!(p.contains("10.244.1.200".parse().unwrap()));
        assert!(!p.contains("10.244.2.1".parse().unwrap()));
        assert!(!p.contains("::1".parse().unwrap()));
        assert!(IpPrefix::host("fd00::1".parse().unwrap()).is_host());
        assert_eq!(prefix("0.0.0.0/0").masked(), prefix("0.0.0.0/0"));
        assert_eq!(prefix("fd00::1/64").masked().to_string(), "fd00::/64");
        for bad in [
            "10.0.0.0/33",
            "10.0.0.0",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "10.0.0.0/08",
            "x/8",
            "fd00::/129",
        ] {
            assert!(bad.parse::<IpPrefix>().is_err(), "{bad}");
        }
    }

    #[test]
    fn legacy_cidr_json_matches_cilium_golden() {
        // Golden values from Cilium's pkg/node/types/prefix_test.go.
        for (text, json) in [
            ("10.244.1.0/24", r#"{"IP":"10.244.1.0","Mask":"////AA=="}"#),
            (
                "fd00::/64",
                r#"{"IP":"fd00::","Mask":"//////////8AAAAAAAAAAA=="}"#,
            ),
        ] {
            let p = prefix(text);
            assert_eq!(
                String::from_utf8(super::super::go_json::to_vec(&p).unwrap()).unwrap(),
                json
            );
            assert_eq!(serde_json::from_str::<IpPrefix>(json).unwrap(), p);
            assert_eq!(
                serde_json::from_str::<IpPrefix>(&format!("{text:?}")).unwrap(),
                p
            );
        }
        // Host bits are masked on the way out, as upstream does.
        let out = super::super::go_json::to_vec(&prefix("10.244.1.5/24")).unwrap();
        assert_eq!(out, br#"{"IP":"10.244.1.0","Mask":"////AA=="}"#);
        // Case-insensitive field names, like any Go struct.
        assert_eq!(
            serde_json::from_str::<IpPrefix>(r#"{"ip":"10.11.0.0","mask":"//8AAA=="}"#).unwrap(),
            prefix("10.11.0.0/16")
        );
    }

    #[test]
    fn legacy_cidr_rejects_garbage() {
        for bad in [
            r#""not-a-cidr""#,
            r#"{"IP":"garbage","Mask":"////AA=="}"#,
            r#"{"IP":"10.0.0.0","Mask":"/w8AAA=="}"#,
            r#"{"IP":"10.0.0.0"}"#,
            r#"{"Mask":"////AA=="}"#,
            r#"{"IP":"10.0.0.0","Mask":"/////////////////////w=="}"#,
            "42",
        ] {
            assert!(serde_json::from_str::<IpPrefix>(bad).is_err(), "{bad}");
        }
    }
}
