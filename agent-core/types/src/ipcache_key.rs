//! The key of an ipcache entry, Cilium's `PrefixString()`: `<ip>` for a host entry (no mask),
//! else `<ip>/<len>`, rendered on the stack.
//!
//! Decoders compare it with the key a value arrived under, and a store that keeps ipcache
//! entries without their keys renders it to find them again, so it must not allocate. IPv4
//! (the bulk of a large ipcache) is written by hand; IPv6 goes through `Display`, whose text is
//! what the key must match anyway.

use std::fmt::{self, Write as _};
use std::net::IpAddr;

/// Room for the longest key: a full IPv6 address (39 bytes) and `/128`.
const CAPACITY: usize = 48;

/// The decimal text of every byte value (up to three digits, zero-padded at the end) and its
/// length: rendering an IPv4 key is then four table lookups, not a dozen divisions.
const DECIMAL: [[u8; 4]; 256] = {
    let mut table = [[0; 4]; 256];
    let mut n = 0;
    while n < 256 {
        let (hundreds, tens, ones) = ((n / 100) as u8, (n / 10 % 10) as u8, (n % 10) as u8);
        table[n] = if n >= 100 {
            [b'0' + hundreds, b'0' + tens, b'0' + ones, 3]
        } else if n >= 10 {
            [b'0' + tens, b'0' + ones, 0, 2]
        } else {
            [b'0' + ones, 0, 0, 1]
        };
        n += 1;
    }
    table
};

/// A rendered ipcache key.
pub(crate) struct PrefixKey {
    buf: [u8; CAPACITY],
    len: usize,
}

impl PrefixKey {
    /// The key of `ip` with a mask of `mask_len` ones, or of a host entry (`None`).
    pub(crate) fn new(ip: IpAddr, mask_len: Option<u8>) -> Self {
        let mut key = Self {
            buf: [0; CAPACITY],
            len: 0,
        };
        match ip {
            IpAddr::V4(v4) => {
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        key.push(b'.');
                    }
                    key.push_decimal(octet);
                }
            }
            // Cannot fail: `write_str` refuses only what exceeds the buffer, and no address
            // does.
            IpAddr::V6(_) => drop(write!(key, "{ip}")),
        }
        if let Some(len) = mask_len {
            key.push(b'/');
            key.push_decimal(len);
        }
        key
    }

    /// The key's text, as bytes: comparing and hashing need no UTF-8 check.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// The key as text.
    pub(crate) fn as_str(&self) -> &str {
        // Only ASCII is ever written; an empty key is the unreachable fallback.
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }

    fn push(&mut self, byte: u8) {
        if let Some(slot) = self.buf.get_mut(self.len) {
            *slot = byte;
            self.len += 1;
        }
    }

    fn push_decimal(&mut self, n: u8) {
        // Three bytes are written and the length moves by the digits: the bytes past it are
        // overwritten next or never read. A key is never within three bytes of the capacity.
        let [digits @ .., len] = DECIMAL[usize::from(n)];
        if let Some(slot) = self.buf.get_mut(self.len..self.len + 3) {
            slot.copy_from_slice(&digits);
            self.len += usize::from(len);
        }
    }
}

impl fmt::Write for PrefixKey {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        self.buf
            .get_mut(self.len..end)
            .ok_or(fmt::Error)?
            .copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_octet_renders_like_display() {
        for n in 0..=255u8 {
            let ip = IpAddr::from([n, 255 - n, n / 3, 7]);
            assert_eq!(
                PrefixKey::new(ip, Some(n % 33)).as_str(),
                format!("{ip}/{}", n % 33)
            );
        }
    }

    #[test]
    fn renders_like_display() {
        for (ip, len, expected) in [
            ("0.0.0.0", Some(0), "0.0.0.0/0"),
            ("255.255.255.255", None, "255.255.255.255"),
            ("1.20.100.9", Some(32), "1.20.100.9/32"),
            ("10.0.0.0", Some(8), "10.0.0.0/8"),
            ("fd00:10::", Some(64), "fd00:10::/64"),
            ("fd00::1", None, "fd00::1"),
            (
                "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
                Some(128),
                "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128",
            ),
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(PrefixKey::new(ip, len).as_str(), expected);
            assert_eq!(PrefixKey::new(ip, len).as_bytes(), expected.as_bytes());
        }
    }
}
