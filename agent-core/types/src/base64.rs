//! Standard base64 (RFC 4648, padded), as Go's `encoding/json` writes `[]byte` values.
//!
//! Only IP masks go through here (at most 16 bytes), so a tiny hand-written codec is enough;
//! it can be swapped for the `base64` crate without changing callers.

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Encodes `bytes` with the standard alphabet and `=` padding (Go's `base64.StdEncoding`).
pub(crate) fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for (i, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> shift & 0x3f) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Decodes standard, padded base64 the way Go's `base64.StdEncoding.Decode` does: `\r` and
/// `\n` are skipped, padding is required, data after padding is an error, and (non-strict
/// mode) unused trailing bits are ignored. `None` for invalid input.
pub(crate) fn decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut acc, mut n, mut pad) = (0u32, 0usize, 0usize);
    for &c in text.as_bytes() {
        match c {
            b'\r' | b'\n' => continue,
            b'=' => {
                // Padding may only complete a quantum that already holds 2 or 3 symbols.
                if n < 2 || n + pad >= 4 {
                    return None;
                }
                pad += 1;
                continue;
            }
            _ if pad > 0 => return None,
            _ => {}
        }
        acc = acc << 6 | symbol_value(c)?;
        n += 1;
        if n == 4 {
            out.extend_from_slice(&[(acc >> 16) as u8, (acc >> 8) as u8, acc as u8]);
            (acc, n) = (0, 0);
        }
    }
    match (n, pad) {
        (0, 0) => {}
        (2, 2) => out.push((acc >> 4) as u8),
        (3, 1) => out.extend_from_slice(&[(acc >> 10) as u8, (acc >> 2) as u8]),
        _ => return None,
    }
    Some(out)
}

fn symbol_value(c: u8) -> Option<u32> {
    let v = match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => return None,
    };
    Some(u32::from(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_all_lengths() {
        let data: Vec<u8> = (0u8..=40).map(|i| i.wrapping_mul(37)).collect();
        for len in 0..data.len() {
            let text = encode(&data[..len]);
            assert_eq!(text.len() % 4, 0);
            assert_eq!(decode(&text).as_deref(), Some(&data[..len]), "len {len}");
        }
    }

    #[test]
    fn matches_go_for_masks() {
        // Values from Cilium's node prefix golden test.
        assert_eq!(encode(&[255, 255, 255, 0]), "////AA==");
        assert_eq!(
            encode(&[0xff; 8].iter().chain(&[0; 8]).copied().collect::<Vec<_>>()),
            "//////////8AAAAAAAAAAA=="
        );
        assert_eq!(decode("//8AAA=="), Some(vec![255, 255, 0, 0]));
        assert_eq!(decode("//8A\r\nAA=="), Some(vec![255, 255, 0, 0]));
        assert_eq!(decode(""), Some(vec![]));
    }

    #[test]
    fn rejects_bad_input() {
        for bad in [
            "////AA=",
            "////AA",
            "//8=AA==",
            "////AA==AAAA",
            "////A===",
            "*///",
            "=AAA",
            "////AA===",
        ] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }
}
