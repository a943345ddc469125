//! Addresses with a prefix length, and the ranges the lab is allowed to use.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use crate::{LabError, Result};

/// An address with a prefix length, e.g. `10.213.1.2/24` or `fd6d:77::1/64`.
///
/// The address keeps its host bits (an interface address), [`Cidr::network`] clears them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    addr: IpAddr,
    len: u8,
}

/// Node networks: veths between node namespaces and the switch, node-to-node links.
pub const NODE_RANGE: Cidr = Cidr::v4([10, 213, 0, 0], 16);

/// Pod networks: pod namespaces, WireGuard tunnel addresses.
pub const POD_RANGE: Cidr = Cidr::v4([10, 214, 0, 0], 16);

/// The one IPv6 (ULA) range of the lab.
pub const V6_RANGE: Cidr = Cidr {
    addr: IpAddr::V6(Ipv6Addr::new(0xfd6d, 0x77, 0, 0, 0, 0, 0, 0)),
    len: 32,
};

/// Every range the lab may assign addresses from. Each is guarded by an `unreachable` route
/// in the root namespace while any lab is alive (see [`super::RouteGuard`]).
pub const GUARDED_RANGES: [Cidr; 3] = [NODE_RANGE, POD_RANGE, V6_RANGE];

impl Cidr {
    const fn v4(octets: [u8; 4], len: u8) -> Self {
        Self {
            addr: IpAddr::V4(Ipv4Addr::new(octets[0], octets[1], octets[2], octets[3])),
            len,
        }
    }

    /// An address with a prefix length; fails when the length exceeds the family's width.
    pub fn new(addr: IpAddr, len: u8) -> Result<Self> {
        if len > max_len(addr) {
            return Err(invalid(&format!("{addr}/{len}"), "prefix length too long"));
        }
        Ok(Self { addr, len })
    }

    /// Parses `ADDR/LEN`; a bare address gets the full length (/32 or /128).
    pub fn parse(text: &str) -> Result<Self> {
        let (addr, len) = match text.split_once('/') {
            Some((addr, len)) => (addr, Some(len)),
            None => (text, None),
        };
        let addr: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| invalid(text, "not an IP address"))?;
        let len = match len {
            Some(len) => len
                .trim()
                .parse::<u8>()
                .map_err(|_| invalid(text, "bad prefix length"))?,
            None => max_len(addr),
        };
        Self::new(addr, len)
    }

    /// The address (host bits kept).
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.len
    }

    /// True for IPv6.
    pub fn is_ipv6(&self) -> bool {
        self.addr.is_ipv6()
    }

    /// The same prefix with the host bits cleared.
    pub fn network(&self) -> Self {
        let bits = to_bits(self.addr) & mask(self.addr, self.len);
        Self {
            addr: from_bits(self.addr, bits),
            len: self.len,
        }
    }

    /// True when `addr` lies inside this prefix.
    pub fn contains(&self, addr: IpAddr) -> bool {
        addr.is_ipv6() == self.addr.is_ipv6()
            && to_bits(addr) & mask(addr, self.len)
                == to_bits(self.addr) & mask(self.addr, self.len)
    }

    /// True when this whole prefix lies inside `outer`.
    pub fn is_within(&self, outer: &Cidr) -> bool {
        self.len >= outer.len && outer.contains(self.addr)
    }

    /// The `n`-th address of the prefix (0 is the network address), keeping this prefix length;
    /// `None` when `n` does not fit. Handy for numbering nodes and pods: `POD_RANGE.nth(258)`.
    pub fn nth(&self, n: u128) -> Option<Self> {
        let host_bits = u32::from(max_len(self.addr) - self.len);
        if host_bits < 128 && n >> host_bits != 0 {
            return None;
        }
        let bits = (to_bits(self.addr) & mask(self.addr, self.len)) | n;
        Some(Self {
            addr: from_bits(self.addr, bits),
            len: self.len,
        })
    }

    /// The same address with another prefix length.
    pub fn with_len(&self, len: u8) -> Result<Self> {
        Self::new(self.addr, len)
    }

    /// Fails unless this prefix lies inside one of the [`GUARDED_RANGES`].
    pub fn check_guarded(&self) -> Result<()> {
        if GUARDED_RANGES.iter().any(|range| self.is_within(range)) {
            Ok(())
        } else {
            let ranges: Vec<String> = GUARDED_RANGES.iter().map(ToString::to_string).collect();
            Err(invalid(
                &self.to_string(),
                &format!(
                    "outside the lab's guarded ranges ({}); refusing to assign it",
                    ranges.join(", ")
                ),
            ))
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl FromStr for Cidr {
    type Err = LabError;

    fn from_str(text: &str) -> Result<Self> {
        Self::parse(text)
    }
}

fn invalid(text: &str, why: &str) -> LabError {
    LabError::CommandFailed {
        command: format!("address {text}"),
        detail: why.to_owned(),
    }
}

fn max_len(addr: IpAddr) -> u8 {
    if addr.is_ipv4() { 32 } else { 128 }
}

fn to_bits(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn from_bits(family: IpAddr, bits: u128) -> IpAddr {
    match family {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from(u32::try_from(bits).unwrap_or(u32::MAX))),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(bits)),
    }
}

fn mask(addr: IpAddr, len: u8) -> u128 {
    let width = u32::from(max_len(addr));
    let all = if width == 128 {
        u128::MAX
    } else {
        (1u128 << width) - 1
    };
    all & !all.checked_shr(u32::from(len)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_display_contains() {
        let c = Cidr::parse("10.213.1.2/24").unwrap();
        assert_eq!(c.to_string(), "10.213.1.2/24");
        assert_eq!(c.network().to_string(), "10.213.1.0/24");
        assert!(c.contains("10.213.1.200".parse().unwrap()));
        assert!(!c.contains("10.213.2.1".parse().unwrap()));
        assert!(c.is_within(&NODE_RANGE));
        assert!(!c.is_within(&POD_RANGE));
        assert!(c.check_guarded().is_ok());
        assert!(Cidr::parse("10.0.0.1/24").unwrap().check_guarded().is_err());
        assert!(
            Cidr::parse("10.213.0.1/8")
                .unwrap()
                .check_guarded()
                .is_err()
        );
        assert!(
            Cidr::parse("fd6d:77::1/64")
                .unwrap()
                .check_guarded()
                .is_ok()
        );
        assert!(
            Cidr::parse("fd6d:78::1/64")
                .unwrap()
                .check_guarded()
                .is_err()
        );
        assert_eq!(Cidr::parse("10.213.0.5").unwrap().prefix_len(), 32);
        assert!(Cidr::parse("10.213.0.5/33").is_err());
        assert_eq!(POD_RANGE.nth(258).unwrap().to_string(), "10.214.1.2/16");
        assert!(Cidr::parse("10.214.0.0/24").unwrap().nth(256).is_none());
        assert!(
            Cidr::parse("0.0.0.0/0")
                .unwrap()
                .contains("1.2.3.4".parse().unwrap())
        );
        assert_eq!(
            Cidr::parse("fd6d:77::9/32").unwrap().network().to_string(),
            "fd6d:77::/32"
        );
    }
}
