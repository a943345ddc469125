//! IPv4 networks: the pod CIDR of cluster-pool mode, ENI subnets and VPC CIDRs.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

/// An IPv4 network: its address (host bits cleared) and prefix length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ipv4Cidr {
    network: Ipv4Addr,
    len: u8,
}

/// Text that is not an IPv4 CIDR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    /// Not `<a.b.c.d>/<len>`.
    #[error("{0:?} is not an IPv4 CIDR (a.b.c.d/len)")]
    Syntax(String),
    /// A prefix length above 32.
    #[error("prefix length {0} is longer than 32")]
    TooLong(u8),
}

impl Ipv4Cidr {
    /// The network of `len` bits holding `addr` (host bits are cleared, as Go's
    /// `net.ParseCIDR` does).
    pub fn new(addr: Ipv4Addr, len: u8) -> Result<Self, CidrError> {
        if len > 32 {
            return Err(CidrError::TooLong(len));
        }
        let mask = mask(len);
        Ok(Self {
            network: Ipv4Addr::from(u32::from(addr) & mask),
            len,
        })
    }

    /// The network address.
    pub fn network(&self) -> Ipv4Addr {
        self.network
    }

    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.len
    }

    /// The broadcast address (the network's last).
    pub fn broadcast(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.network) | !mask(self.len))
    }

    /// The first address after the network's: an ENI subnet's gateway (AWS's `.1`), the
    /// cluster pool's router IP. For a /32 it is the address itself.
    pub fn first_host(&self) -> Ipv4Addr {
        if self.len == 32 {
            return self.network;
        }
        Ipv4Addr::from(u32::from(self.network) + 1)
    }

    /// Whether `ip` is in the network.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & mask(self.len) == u32::from(self.network)
    }

    /// Whether `ip` is one of its host addresses: in it, neither the network nor the
    /// broadcast address (networks of /31 and /32 have none).
    pub fn is_host(&self, ip: Ipv4Addr) -> bool {
        self.len <= 30 && self.contains(ip) && ip != self.network && ip != self.broadcast()
    }

    /// How many host addresses it has (0 for /31 and /32).
    pub fn hosts(&self) -> u32 {
        if self.len > 30 {
            return 0;
        }
        (!mask(self.len)) - 1
    }
}

fn mask(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len))
    }
}

impl FromStr for Ipv4Cidr {
    type Err = CidrError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let syntax = || CidrError::Syntax(text.to_owned());
        let (addr, len) = text.split_once('/').ok_or_else(syntax)?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| syntax())?;
        // Digits only: `u8::from_str` would take a leading `+`.
        if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) {
            return Err(syntax());
        }
        let len: u8 = len.parse().map_err(|_| syntax())?;
        Self::new(addr, len)
    }
}

impl fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.len)
    }
}

impl serde::Serialize for Ipv4Cidr {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Ipv4Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> Ipv4Addr {
        text.parse().unwrap()
    }

    #[test]
    fn parses_masks_and_names_its_addresses() {
        let cidr: Ipv4Cidr = "10.1.2.77/24".parse().unwrap();
        assert_eq!(cidr.to_string(), "10.1.2.0/24");
        assert_eq!(cidr.first_host(), ip("10.1.2.1"));
        assert_eq!(cidr.broadcast(), ip("10.1.2.255"));
        assert_eq!(cidr.hosts(), 254);
        assert!(cidr.contains(ip("10.1.2.255")) && !cidr.contains(ip("10.1.3.0")));
        assert!(cidr.is_host(ip("10.1.2.254")));
        assert!(!cidr.is_host(ip("10.1.2.0")) && !cidr.is_host(ip("10.1.2.255")));

        let all: Ipv4Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("255.1.2.3")));
        let one: Ipv4Cidr = "10.0.0.9/32".parse().unwrap();
        assert_eq!((one.hosts(), one.first_host()), (0, ip("10.0.0.9")));
        assert_eq!("10.0.0.0/30".parse::<Ipv4Cidr>().unwrap().hosts(), 2);
    }

    #[test]
    fn refuses_what_is_not_an_ipv4_cidr() {
        for text in [
            "10.0.0.0",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "fd00::/64",
            "x/8",
            "10.0.0.0/8/8",
        ] {
            assert_eq!(
                text.parse::<Ipv4Cidr>(),
                Err(CidrError::Syntax(text.to_owned())),
                "{text}"
            );
        }
        assert_eq!(
            "10.0.0.0/33".parse::<Ipv4Cidr>(),
            Err(CidrError::TooLong(33))
        );
    }
}
