//! A one-pass reader for ipcache values in the plain form Cilium's agents write: a flat
//! object whose keys are spelled exactly like the Go fields and whose strings have no
//! escapes. It borrows the strings it keeps and allocates nothing.
//!
//! It is only a shortcut. Whenever a value leaves that form (a key that matches a field only
//! case-insensitively, an escape, a nested object or array other than `"NamedPorts":null`, a
//! number that is not a plain unsigned integer, a value a field's Go type would reject) the
//! scan gives up and the caller decodes with the full Go-compatible reader, which also words
//! any error. Accepted values decode exactly as the full reader decodes them;
//! `ipcache_shortcut_tests.rs` checks both readers against each other on a generated corpus.

use std::net::{IpAddr, Ipv4Addr};

use super::base64;
use super::go_json::fold_eq;
use super::ipcache_entry::IpCacheWire;
use super::net::{IpMask, parse_go_ip};

/// The fields of an ipcache value that the agent keeps, borrowed from the value.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct ScannedPair<'a> {
    pub ip: Option<IpAddr>,
    pub mask: Option<IpMask>,
    pub host_ip: Option<IpAddr>,
    pub id: u32,
    pub key: u8,
    pub namespace: &'a str,
    pub pod_name: &'a str,
}

/// Reads `value` if it is in the plain form; `None` means "use the full reader".
pub(super) fn scan(value: &[u8]) -> Option<ScannedPair<'_>> {
    let mut scanner = Scanner {
        bytes: value,
        pos: 0,
    };
    let mut pair = ScannedPair::default();
    scanner.expect(b'{')?;
    if scanner.peek()? == b'}' {
        scanner.pos += 1;
    } else {
        loop {
            let name = scanner.string()?;
            scanner.expect(b':')?;
            scanner.field(name, &mut pair)?;
            match scanner.next_token()? {
                b',' => {}
                b'}' => break,
                _ => return None,
            }
        }
    }
    scanner.skip_whitespace();
    (scanner.pos == value.len()).then_some(pair)
}

struct Scanner<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Scanner<'a> {
    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes.get(self.pos) {
            self.pos += 1;
        }
    }

    /// The next byte after whitespace, not consumed.
    fn peek(&mut self) -> Option<u8> {
        self.skip_whitespace();
        self.bytes.get(self.pos).copied()
    }

    /// The next byte after whitespace, consumed.
    fn next_token(&mut self) -> Option<u8> {
        let byte = self.peek()?;
        self.pos += 1;
        Some(byte)
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.next_token()? == byte).then_some(())
    }

    /// A string without escapes or control characters, as raw bytes.
    fn string(&mut self) -> Option<&'a [u8]> {
        self.expect(b'"')?;
        let rest = &self.bytes[self.pos..];
        let len = memchr::memchr2(b'"', b'\\', rest)?;
        let text = &rest[..len];
        // A control character is invalid in JSON: the full reader words that error. Checked
        // without an early exit, so the loop stays branch-free.
        let plain = text.iter().fold(true, |plain, &b| plain & (b >= 0x20));
        self.pos += len + 1;
        (rest[len] == b'"' && plain).then_some(text)
    }

    /// `null`, consumed; `false` (nothing consumed) for anything else.
    fn null(&mut self) -> Option<bool> {
        if self.peek()? != b'n' {
            return Some(false);
        }
        let rest = self.bytes.get(self.pos..self.pos + 4)?;
        self.pos += 4;
        (rest == b"null").then_some(true)
    }

    /// A plain unsigned integer (no sign, fraction, exponent or leading zero) up to `max`.
    fn unsigned(&mut self, max: u32) -> Option<u32> {
        self.skip_whitespace();
        let digits = self.bytes[self.pos..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        let text = &self.bytes[self.pos..self.pos + digits];
        self.pos += digits;
        if text.is_empty() || text.len() > 10 || (text.len() > 1 && text[0] == b'0') {
            return None;
        }
        // Go rejects `1.0` or `1e3` for an integer field; so does the full reader.
        if let Some(b'.' | b'e' | b'E') = self.bytes.get(self.pos) {
            return None;
        }
        let value = text.iter().fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
        u32::try_from(value).ok().filter(|&v| v <= max)
    }

    /// A string field that Go keeps as text: `null` leaves it unchanged.
    fn text(&mut self, field: &mut &'a str) -> Option<()> {
        if !self.null()? {
            *field = std::str::from_utf8(self.string()?).ok()?;
        }
        Some(())
    }

    /// A `net.IP` field: `null` and `""` are no address.
    fn ip(&mut self) -> Option<Option<IpAddr>> {
        if self.null()? {
            return Some(None);
        }
        let text = self.string()?;
        if text.is_empty() {
            return Some(None);
        }
        // Most addresses are dotted IPv4; anything else takes the standard parser.
        let ip = match parse_plain_ipv4(text) {
            Some(v4) => IpAddr::V4(v4),
            None => parse_go_ip(std::str::from_utf8(text).ok()?)?,
        };
        Some(Some(ip))
    }

    /// A `net.IPMask` field: `null` or base64 bytes.
    fn mask(&mut self) -> Option<Option<IpMask>> {
        if self.null()? {
            return Some(None);
        }
        let text = std::str::from_utf8(self.string()?).ok()?;
        Some(Some(IpMask::from_bytes(&base64::decode(text)?)?))
    }

    /// A value the agent does not keep: only scalars are skipped here.
    fn skip_scalar(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(drop),
            b'n' => self.null()?.then_some(()),
            b't' | b'f' => {
                let word: &[u8] = if self.bytes[self.pos] == b't' {
                    b"true"
                } else {
                    b"false"
                };
                let rest = self.bytes.get(self.pos..self.pos + word.len())?;
                self.pos += word.len();
                (rest == word).then_some(())
            }
            _ => self.unsigned(u32::MAX).map(drop),
        }
    }

    /// Reads the value of the field named `name` into `pair`.
    fn field(&mut self, name: &[u8], pair: &mut ScannedPair<'a>) -> Option<()> {
        match name {
            b"IP" => pair.ip = self.ip()?,
            b"HostIP" => pair.host_ip = self.ip()?,
            b"Mask" => pair.mask = self.mask()?,
            b"ID" => {
                if !self.null()? {
                    pair.id = self.unsigned(u32::MAX)?;
                }
            }
            b"Key" => {
                if !self.null()? {
                    pair.key = u8::try_from(self.unsigned(u32::from(u8::MAX))?).ok()?;
                }
            }
            b"K8sNamespace" => self.text(&mut pair.namespace)?,
            b"K8sPodName" => self.text(&mut pair.pod_name)?,
            // Named ports are rare and nested: anything but `null` goes to the full reader.
            b"NamedPorts" => return self.null()?.then_some(()),
            // Written by every Cilium agent and not kept; no field folds onto it.
            b"Metadata" => self.skip_scalar()?,
            _ => {
                let name = std::str::from_utf8(name).ok()?;
                // A key the full reader would fold onto one of its fields is its to read.
                if IpCacheWire::GO_FIELDS
                    .iter()
                    .any(|field| fold_eq(name, field))
                {
                    return None;
                }
                self.skip_scalar()?;
            }
        }
        Some(())
    }
}

/// `a.b.c.d` with each part 0 to 255 written without leading zeros, the only IPv4 form Go
/// and Rust both accept; `None` for anything else, which the caller parses the standard way.
fn parse_plain_ipv4(text: &[u8]) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut parts = text.split(|&b| b == b'.');
    for octet in &mut octets {
        let part = parts.next()?;
        let plain = matches!(part.len(), 1..=3)
            && part.iter().all(u8::is_ascii_digit)
            && (part.len() == 1 || part[0] != b'0');
        if !plain {
            return None;
        }
        let value = part.iter().fold(0u16, |n, &d| n * 10 + u16::from(d - b'0'));
        *octet = u8::try_from(value).ok()?;
    }
    parts.next().is_none().then_some(Ipv4Addr::from(octets))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_plain_form() {
        let value = br#"{"IP":"10.6.6.43","Mask":null,"HostIP":"10.5.1.132","ID":12928,"Key":3,"Metadata":"cilium-global:default:k8s-node1:432","K8sNamespace":"istio-system","K8sPodName":"gw-1"}"#;
        let pair = scan(value).expect("the form Cilium writes");
        assert_eq!(pair.ip, Some("10.6.6.43".parse().unwrap()));
        assert_eq!(pair.host_ip, Some("10.5.1.132".parse().unwrap()));
        assert_eq!((pair.id, pair.key, pair.mask), (12928, 3, None));
        assert_eq!((pair.namespace, pair.pod_name), ("istio-system", "gw-1"));

        let spaced = b" {\n  \"IP\" : \"fd00::1\",\t\"Mask\": \"/////w==\" , \"ID\": 0 }\n";
        let pair = scan(spaced).expect("whitespace between tokens");
        assert_eq!(pair.ip, Some("fd00::1".parse().unwrap()));
        assert_eq!(pair.mask.and_then(|m| m.prefix_len()), Some(32));
        assert_eq!(scan(b"{}"), Some(ScannedPair::default()));
    }

    #[test]
    fn plain_ipv4_agrees_with_the_standard_parser() {
        for text in [
            "0.0.0.0",
            "10.1.2.3",
            "255.255.255.255",
            "1.22.133.4",
            "256.1.1.1",
            "01.1.1.1",
            "1.1.1",
            "1.1.1.1.1",
            "1..1.1",
            "1.1.1.",
            ".1.1.1",
            "1.1.1.1a",
            "1.1.1.-1",
            "1111.1.1.1",
            "fd00::1",
            "",
            "1.1.1.1 ",
        ] {
            if let Some(ip) = parse_plain_ipv4(text.as_bytes()) {
                assert_eq!(Some(IpAddr::V4(ip)), parse_go_ip(text), "{text}");
            }
        }
        assert_eq!(
            parse_plain_ipv4(b"10.1.2.3"),
            Some(Ipv4Addr::new(10, 1, 2, 3))
        );
        assert_eq!(parse_plain_ipv4(b"01.1.1.1"), None);
        assert_eq!(parse_plain_ipv4(b"256.1.1.1"), None);
    }

    #[test]
    fn leaves_everything_else_to_the_full_reader() {
        for value in [
            r#"{"ip":"10.0.0.1","ID":5}"#,
            r#"{"IP":"10.0.0.1","ID":5.0}"#,
            r#"{"IP":"10.0.0.1","ID":-5}"#,
            r#"{"IP":"10.0.0.1","ID":05}"#,
            r#"{"IP":"10.0.0.1","ID":4294967296}"#,
            r#"{"IP":"10.0.0.1","Key":256}"#,
            r#"{"IP":"10.0.0.1","K8sPodName":"a\"b"}"#,
            r#"{"IP":"10.0.0.1","NamedPorts":[]}"#,
            r#"{"IP":"10.0.0.1","Extra":{"a":1}}"#,
            r#"{"IP":"10.0.0.300"}"#,
            r#"{"IP":"10.0.0.1","Mask":"***"}"#,
            r#"{"IP":"10.0.0.1"} x"#,
            r#"{"IP":"10.0.0.1",}"#,
            r#"{"IP":"10.0.0.1""#,
            r#"{"IP":nul}"#,
            r#"null"#,
        ] {
            assert_eq!(scan(value.as_bytes()), None, "{value}");
        }
    }
}
