//! The reading steps of the plain-form shortcuts ([`super::ipcache_scan`],
//! [`super::node_scan`]): JSON as Cilium's agents write it, compact, with keys spelled
//! exactly like the Go fields and strings without escapes. Every step answers `None` as soon
//! as the input leaves that form, and the caller then decodes with the full Go-compatible
//! reader, which also words any error.
//!
//! Why the steps are written the way they are (instruction counts of a profile): field names
//! are recognised in place instead of being read as strings (they are half of the strings of
//! a value), strings end where an eight-byte word first holds a quote, a backslash or a
//! control character, and dotted IPv4 is parsed in one loop.

use std::net::{IpAddr, Ipv4Addr};

use super::base64;
use super::net::{IpMask, parse_go_ip};

const ONES: u64 = u64::from_ne_bytes([1; 8]);
const HIGH_BITS: u64 = u64::from_ne_bytes([0x80; 8]);

/// The high bit of every byte of `word` that is zero (exact up to the first such byte).
#[inline]
fn zero_bytes(word: u64) -> u64 {
    word.wrapping_sub(ONES) & !word & HIGH_BITS
}

/// Where the string body at the start of `rest` ends: the index of its closing quote, or
/// `None` at a backslash, a control character or the end of the input.
pub(super) fn string_end(rest: &[u8]) -> Option<usize> {
    let mut at = 0;
    // Eight bytes a step: the first byte that is a quote, a backslash or below 0x20 is the
    // lowest flagged one (a borrow only runs upwards from a flagged byte).
    while let Some(chunk) = rest.get(at..at + 8) {
        let word = u64::from_le_bytes(chunk.try_into().ok()?);
        let special = zero_bytes(word ^ (ONES * u64::from(b'"')))
            | zero_bytes(word ^ (ONES * u64::from(b'\\')))
            | (word.wrapping_sub(ONES * 0x20) & !word & HIGH_BITS);
        if special != 0 {
            at += special.trailing_zeros() as usize / 8;
            return (rest[at] == b'"').then_some(at);
        }
        at += 8;
    }
    for (i, &byte) in rest.get(at..)?.iter().enumerate() {
        if byte == b'"' {
            return Some(at + i);
        }
        if byte == b'\\' || byte < 0x20 {
            return None;
        }
    }
    None
}

/// A position in a value being read in the plain form.
pub(super) struct Scanner<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) pos: usize,
}

impl<'a> Scanner<'a> {
    /// A scanner at the start of `bytes`.
    #[inline]
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    #[inline]
    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes.get(self.pos) {
            self.pos += 1;
        }
    }

    /// Whether only whitespace is left.
    #[inline]
    pub(super) fn at_end(&mut self) -> bool {
        self.skip_whitespace();
        self.pos == self.bytes.len()
    }

    /// The next byte after whitespace, not consumed.
    #[inline]
    pub(super) fn peek(&mut self) -> Option<u8> {
        let byte = *self.bytes.get(self.pos)?;
        // Compact JSON (what Cilium writes) has no whitespace: one compare decides.
        if byte > b' ' {
            return Some(byte);
        }
        self.skip_whitespace();
        self.bytes.get(self.pos).copied()
    }

    /// The next byte after whitespace, consumed.
    #[inline]
    pub(super) fn next_token(&mut self) -> Option<u8> {
        let byte = self.peek()?;
        self.pos += 1;
        Some(byte)
    }

    #[inline]
    pub(super) fn expect(&mut self, byte: u8) -> Option<()> {
        (self.next_token()? == byte).then_some(())
    }

    /// After an object's `{` or an array's `[`: whether it is empty, with its `close`
    /// consumed if so.
    #[inline]
    pub(super) fn empty(&mut self, close: u8) -> Option<bool> {
        if self.peek()? == close {
            self.pos += 1;
            return Some(true);
        }
        Some(false)
    }

    /// After a member or an element: whether another follows (`,`), or the object or array
    /// ends (`close`, consumed); `None` for anything else.
    #[inline]
    pub(super) fn more(&mut self, close: u8) -> Option<bool> {
        match self.next_token()? {
            b',' => Some(true),
            byte if byte == close => Some(false),
            _ => None,
        }
    }

    /// The rest of a string whose opening quote was consumed: its raw bytes, without escapes
    /// or control characters.
    pub(super) fn string_body(&mut self) -> Option<&'a [u8]> {
        let rest = self.bytes.get(self.pos..)?;
        let len = string_end(rest)?;
        self.pos += len + 1;
        Some(&rest[..len])
    }

    /// A string without escapes or control characters, as raw bytes.
    pub(super) fn string(&mut self) -> Option<&'a [u8]> {
        self.expect(b'"')?;
        self.string_body()
    }

    /// The name of a member whose opening quote was consumed, and its closing quote: the
    /// field of `names` (exact names, each with its closing quote) it spells exactly, else
    /// the name as written.
    #[inline]
    pub(super) fn field_name<F: Copy>(
        &mut self,
        names: &[(&[u8], F)],
    ) -> Option<Result<F, &'a [u8]>> {
        let rest = self.bytes.get(self.pos..)?;
        let first = *rest.first()?;
        for &(name, field) in names {
            if name[0] == first && rest.starts_with(name) {
                self.pos += name.len();
                return Some(Ok(field));
            }
        }
        self.string_body().map(Err)
    }

    /// `null`, consumed; `false` (nothing consumed) for anything else.
    #[inline]
    pub(super) fn null(&mut self) -> Option<bool> {
        if self.peek()? != b'n' {
            return Some(false);
        }
        let rest = self.bytes.get(self.pos..self.pos + 4)?;
        self.pos += 4;
        (rest == b"null").then_some(true)
    }

    /// A plain unsigned integer (no sign, fraction, exponent or leading zero) up to `max`.
    pub(super) fn unsigned(&mut self, max: u32) -> Option<u32> {
        self.peek()?;
        let start = self.pos;
        let mut value = 0u64;
        while let Some(&digit) = self.bytes.get(self.pos)
            && digit.is_ascii_digit()
        {
            // Eleven digits already exceed a u32: stop before the sum could overflow.
            if self.pos - start == 10 {
                return None;
            }
            value = value * 10 + u64::from(digit - b'0');
            self.pos += 1;
        }
        let digits = self.pos - start;
        if digits == 0 || (digits > 1 && self.bytes[start] == b'0') {
            return None;
        }
        // Go rejects `1.0` or `1e3` for an integer field; so does the full reader.
        if let Some(b'.' | b'e' | b'E') = self.bytes.get(self.pos) {
            return None;
        }
        u32::try_from(value).ok().filter(|&v| v <= max)
    }

    /// A string field that Go reads as text and the reader does not keep. Text that is not
    /// UTF-8 goes to the full reader even when a later duplicate replaces it, as there.
    pub(super) fn text(&mut self) -> Option<()> {
        if !self.null()? {
            let text = self.string()?;
            if !text.is_ascii() {
                std::str::from_utf8(text).ok()?;
            }
        }
        Some(())
    }

    /// A `net.IP` field: `null` and `""` are no address.
    pub(super) fn ip(&mut self) -> Option<Option<IpAddr>> {
        if self.null()? {
            return Some(None);
        }
        self.expect(b'"')?;
        // Most addresses are dotted IPv4 read with their closing quote, in one pass; anything
        // else ends as a string first and takes the parsers below.
        if let Some((v4, len)) = quoted_ipv4(&self.bytes[self.pos..]) {
            self.pos += len;
            return Some(Some(IpAddr::V4(v4)));
        }
        let text = self.string_body()?;
        if text.is_empty() {
            return Some(None);
        }
        let ip = match parse_plain_ipv4(text) {
            Some(v4) => IpAddr::V4(v4),
            None => parse_go_ip(std::str::from_utf8(text).ok()?)?,
        };
        Some(Some(ip))
    }

    /// A `net.IPMask` field: `null` or base64 bytes.
    pub(super) fn mask(&mut self) -> Option<Option<IpMask>> {
        if self.null()? {
            return Some(None);
        }
        let text = std::str::from_utf8(self.string()?).ok()?;
        Some(Some(IpMask::from_bytes(&base64::decode(text)?)?))
    }

    /// A value the reader does not keep: only scalars are skipped here.
    pub(super) fn skip_scalar(&mut self) -> Option<()> {
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
}

/// `a.b.c.d` with each part 0 to 255 written without leading zeros, the only IPv4 form Go
/// and Rust both accept; `None` for anything else, which the caller parses the standard way.
pub(super) fn parse_plain_ipv4(text: &[u8]) -> Option<Ipv4Addr> {
    // An octet at a time rather than a byte at a time: two addresses a value made this the
    // scan's largest cost (callgrind, `sync_profile store`).
    let (a, rest) = octet(text)?;
    let (b, rest) = octet(rest.strip_prefix(b".")?)?;
    let (c, rest) = octet(rest.strip_prefix(b".")?)?;
    let (d, rest) = octet(rest.strip_prefix(b".")?)?;
    rest.is_empty().then(|| Ipv4Addr::new(a, b, c, d))
}

/// What [`parse_plain_ipv4`] reads from a string body, read from the bytes after the opening
/// quote up to and with the closing quote: the address and how many bytes it took. `None`
/// whenever the body is anything else (the caller then reads it as a string).
fn quoted_ipv4(rest: &[u8]) -> Option<(Ipv4Addr, usize)> {
    let mut octets = [0; 4];
    let mut rest_at = rest;
    for (i, slot) in octets.iter_mut().enumerate() {
        let (value, after) = octet(rest_at)?;
        let (&separator, after) = after.split_first()?;
        if separator != if i == 3 { b'"' } else { b'.' } {
            return None;
        }
        *slot = value;
        rest_at = after;
    }
    Some((Ipv4Addr::from(octets), rest.len() - rest_at.len()))
}

/// The decimal octet at the start of `text` (one to three digits, no leading zero, at most
/// 255) and what follows it. A fourth digit is left in the rest, where the caller refuses it.
fn octet(text: &[u8]) -> Option<(u8, &[u8])> {
    let digit = |at: usize| {
        text.get(at)
            .map(|b| b.wrapping_sub(b'0'))
            .filter(|&d| d < 10)
    };
    let first = digit(0)?;
    let Some(second) = digit(1) else {
        return Some((first, &text[1..]));
    };
    if first == 0 {
        return None;
    }
    let Some(third) = digit(2) else {
        return Some((first * 10 + second, &text[2..]));
    };
    let value = u16::from(first) * 100 + u16::from(second) * 10 + u16::from(third);
    Some((u8::try_from(value).ok()?, &text[3..]))
}

#[cfg(test)]
mod tests {
    use super::*;

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
            "1.2.3.0",
            "0.1.2.3",
            "1.2.3.00",
            "1.2.3.256",
            "1.2.3.1000",
            "1.2.3.4.",
            "1.2.3..4",
            "255.255.255.255.255",
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
    fn plain_ipv4_accepts_exactly_what_the_standard_parser_accepts() {
        // Every octet spelling that matters (bounds, leading zeros, a fourth digit, empty,
        // a sign, a letter) in every position, and every string of up to seven bytes over the
        // characters an address is made of.
        let parts = [
            "0", "1", "9", "10", "99", "100", "199", "200", "249", "250", "255", "256", "299",
            "300", "999", "1000", "00", "01", "010", "001", "", "-1", "1a", " 1",
        ];
        let mut texts: Vec<String> = Vec::new();
        for a in parts {
            for b in parts {
                texts.push(format!("{a}.{b}.1.2"));
                texts.push(format!("1.{a}.2.{b}"));
                texts.push(format!("{a}.2.{b}.3"));
            }
            texts.extend([format!("{a}.1.2"), format!("1.2.3.4.{a}"), a.to_owned()]);
        }
        let alphabet = b"0125.";
        let mut short = vec![Vec::new()];
        for _ in 0..7 {
            let longer: Vec<Vec<u8>> = short
                .iter()
                .filter(|text| text.len() == short.last().map_or(0, Vec::len))
                .flat_map(|text| {
                    alphabet.iter().map(move |&byte| {
                        let mut next = text.clone();
                        next.push(byte);
                        next
                    })
                })
                .collect();
            short.extend(longer);
        }
        texts.extend(
            short
                .into_iter()
                .map(|bytes| String::from_utf8(bytes).unwrap()),
        );
        for text in &texts {
            assert_eq!(
                parse_plain_ipv4(text.as_bytes()),
                text.parse::<Ipv4Addr>().ok(),
                "{text:?}"
            );
        }
    }

    #[test]
    fn a_quoted_address_reads_as_its_string_body_does() {
        // Each body followed by its closing quote and more, or cut short, or unterminated:
        // read in one pass exactly when the body reads as plain IPv4.
        let bodies = [
            "10.1.2.3",
            "0.0.0.0",
            "255.255.255.255",
            "256.1.1.1",
            "01.1.1.1",
            "1.1.1",
            "1.1.1.1.1",
            "1..1.1",
            "1.1.1.",
            "1111.1.1.1",
            "1.2.3.1000",
            "1.2.3.00",
            "fd00::1",
            "",
            "1.1.1.1 ",
            "1.2.3.4a",
            "::ffff:1.2.3.4",
        ];
        for body in bodies {
            let expected = parse_plain_ipv4(body.as_bytes());
            let quoted = format!("{body}\",\"ID\":5}}");
            assert_eq!(
                quoted_ipv4(quoted.as_bytes()),
                expected.map(|ip| (ip, body.len() + 1)),
                "{body:?}"
            );
            assert_eq!(
                quoted_ipv4(body.as_bytes()),
                None,
                "{body:?} without its quote"
            );
            let escaped = format!("{body}\\\"");
            assert_eq!(
                quoted_ipv4(escaped.as_bytes()),
                None,
                "{body:?} then an escape"
            );
        }
    }

    #[test]
    fn strings_end_at_the_first_quote_in_any_word_position() {
        // Bodies of every length around the eight-byte steps, each special byte at each place.
        for len in 0..20 {
            let body = vec![b'a'; len];
            let mut text = body.clone();
            text.extend_from_slice(b"\"tail\"");
            assert_eq!(string_end(&text), Some(len), "{len}");
            for at in 0..len {
                for (special, expected) in [(b'"', Some(at)), (b'\\', None), (0x1f, None)] {
                    let mut text = text.clone();
                    text[at] = special;
                    assert_eq!(string_end(&text), expected, "{len} {at} {special}");
                }
                // Bytes above 0x7f and DEL are plain string bytes.
                let mut text = text.clone();
                text[at] = 0xe9;
                assert_eq!(string_end(&text), Some(len), "{len} {at}");
            }
            assert_eq!(string_end(&body), None, "no closing quote");
        }
    }
}
