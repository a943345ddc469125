//! The ipcache fast path ([`super::ipcache_scan`]) must decode every value exactly as the full
//! Go-compatible reader does: a generated corpus of right and wrong values goes through both.

use super::super::ipcache::IpCacheDecoder;
use super::super::ipcache_scan;
use super::IpCacheEntryDecoder;
use crate::Decoder;
use crate::shortcut_corpus::{self, Variants};

/// Values for each field, right and wrong, as raw JSON (`None`: the field is absent).
const VARIANTS: &Variants = &[
    (
        "IP",
        &[
            Some(br#""10.1.2.3""#),
            Some(br#""fd00::1""#),
            Some(br#""::ffff:10.1.2.3""#),
            Some(br#""""#),
            Some(b"null"),
            Some(br#""10.1.2.300""#),
            Some(br#""010.1.2.3""#),
            Some(br#""10.1.2.0""#),
            Some(br#""10.1.2.3.4""#),
            Some(br#""10.1.2""#),
            Some(br#""10.1.2.""#),
            Some(br#""10..2.3""#),
            Some(br#""10.1.2.256""#),
            Some(br#""10.1.2.1000""#),
            Some(br#""10.1.2.00""#),
            Some(br#""10.1.2.3\u0000""#),
            None,
        ],
    ),
    (
        "Mask",
        &[
            Some(b"null"),
            Some(br#""/////w==""#),
            Some(br#""////AA==""#),
            Some(br#""/wD/AA==""#),
            Some(br#""/////////////////////w==""#),
            Some(br#""***""#),
            Some(b"7"),
            None,
        ],
    ),
    (
        "HostIP",
        &[
            Some(br#""10.5.1.1""#),
            Some(br#""""#),
            Some(b"null"),
            Some(br#""bad""#),
            Some(br#""0.0.0.0""#),
            Some(br#""255.255.255.255""#),
            Some(br#""::ffff:10.5.1.1""#),
            Some(b"\"10.5.1\x011\""),
            None,
        ],
    ),
    (
        "ID",
        &[
            Some(b"65536"),
            Some(b"0"),
            Some(b"5"),
            Some(b"131072"),
            Some(b"4294967295"),
            Some(b"4294967296"),
            Some(b"-1"),
            Some(b"1.0"),
            Some(b"7e4"),
            Some(b"070000"),
            Some(b"12345678901"),
            Some(b"99999999999999999999"),
            Some(b"00"),
            Some(b"1E3"),
            Some(b"null"),
            Some(br#""65536""#),
            None,
        ],
    ),
    (
        "Key",
        &[
            Some(b"0"),
            Some(b"3"),
            Some(b"255"),
            Some(b"256"),
            Some(b"null"),
            Some(b"true"),
            None,
        ],
    ),
    (
        "Metadata",
        &[
            Some(br#""cilium-global:default:node-1:7""#),
            Some(br#""cilium-global:default:a-much-longer-node-name-than-usual:123456""#),
            Some(b"\"cilium-global:default:node-1\x1f:7\""),
            Some(br#""cilium-global:default:node-1:7\"""#),
            Some("\"\u{e9}\"".as_bytes()),
            Some(b"\"\xff\""),
            Some(br#""a\"b""#),
            Some(b"{}"),
            Some(b"[1]"),
            Some(b"true"),
            Some(b"-2.5"),
            Some(b"null"),
            None,
        ],
    ),
    (
        "K8sNamespace",
        &[
            Some(br#""default""#),
            Some(br#""""#),
            Some(b"null"),
            Some(br#""n\u00e9""#),
            Some("\"n\u{e9}-\u{4e2d}\"".as_bytes()),
            Some(br#""kube-system-with-a-name-past-sixteen""#),
            Some(b"\"exactly8\""),
            Some(b"\"seven-7\""),
            Some(b"\"nine-char\""),
            Some(b"\"a\xc3\""),
            Some(b"\"\xff\""),
            Some(b"\"a\tb\""),
            Some(b"5"),
            None,
        ],
    ),
    (
        "K8sPodName",
        &[
            Some(br#""pod-7""#),
            Some(br#""""#),
            Some(b"null"),
            Some(br#""p\/7""#),
            Some(br#""ai-ingressgateway-6bdbdbf7dc-jz85c""#),
            Some(b"\"pod-15-chars-xx\x7f\""),
            Some(b"\"pod\ttab\""),
            None,
        ],
    ),
    (
        "NamedPorts",
        &[
            Some(b"null"),
            Some(b"[]"),
            Some(br#"[{"Name":"http","Port":80,"Protocol":"TCP"}]"#),
            Some(br#"{}"#),
            None,
        ],
    ),
    ("ip", &[None, Some(br#""10.1.2.4""#)]),
    ("K8sServiceAccount", &[None, Some(br#""sa""#)]),
    ("\u{17f}omething", &[None, Some(b"1")]),
    // Names that start like a field's: only the exact name is that field.
    ("IPv6", &[None, Some(br#""fd00::1""#)]),
    ("Keys", &[None, Some(b"7")]),
    ("Mas", &[None, Some(b"null")]),
    ("hostIP", &[None, Some(br#""10.5.1.9""#)]),
    ("\u{212a}ey", &[None, Some(b"9")]),
];

/// 200,000 corpus values from `seed`, each with one of `keys` in turn.
fn corpus<'k>(mut seed: u64, keys: &'k [&'k str]) -> impl Iterator<Item = (&'k str, Vec<u8>)> {
    keys.iter()
        .cycle()
        .take(200_000)
        .map(move |key| (*key, shortcut_corpus::value(&mut seed, VARIANTS)))
}

#[test]
fn the_plain_form_shortcut_decodes_exactly_like_the_full_reader() {
    let decoder = IpCacheEntryDecoder(IpCacheDecoder::new(Some(1)));
    let keys = [
        "10.1.2.3",
        "10.1.2.3/32",
        "fd00::1",
        "10.1.2.0/24",
        "10.1.2.0/16",
    ];
    let (mut shortcut, mut valid) = (0, 0);
    for (key, value) in corpus(0x9e37_79b9_7f4a_7c15, &keys) {
        let full = decoder.decode_full(key, &value);
        let fast = decoder.decode(key, &value);
        assert_eq!(
            format!("{fast:?}"),
            format!("{full:?}"),
            "{key}: {}",
            String::from_utf8_lossy(&value)
        );
        shortcut += usize::from(ipcache_scan::scan(&value).is_some());
        valid += usize::from(full.is_ok());
    }
    // The corpus exercises both readers and both outcomes.
    assert!(shortcut > 20_000 && shortcut < 180_000, "{shortcut}");
    assert!(valid > 1_000, "{valid}");
}

#[test]
fn the_form_cilium_writes_takes_the_shortcut() {
    let go = br#"{"IP":"10.6.6.43","Mask":null,"HostIP":"10.5.1.132","ID":12928,"Key":0,"Metadata":"cilium-global:default:k8s-node1:432","K8sNamespace":"istio-system","K8sPodName":"ai-ingressgateway-6bdbdbf7dc-jz85c"}"#;
    let prefix = br#"{"IP":"fd00:10::","Mask":"//////////8AAAAAAAAAAA==","HostIP":"","ID":16777217,"Key":3,"Metadata":"","NamedPorts":null}"#;
    for value in [&go[..], &prefix[..]] {
        assert!(ipcache_scan::scan(value).is_some());
    }
}

/// The entry decoder compares the key with the one the entry renders (the store's key), the
/// pair decoder with Go's `PrefixString()`: over the corpus, every value either both accept
/// or both reject for the same reason (values the two JSON readers take differently, and
/// pairs that make no prefix, aside).
#[test]
fn the_entry_and_the_pair_decoder_check_the_key_alike() {
    let pairs = IpCacheDecoder::new(Some(1));
    let entries = IpCacheEntryDecoder(pairs.clone());
    let keys = [
        "10.1.2.3",
        "10.1.2.3/32",
        "10.1.2.3/24",
        "::ffff:10.1.2.3",
        "fd00::1",
        "fd00::1/128",
        "10.1.2.0/24",
        "10.1.2.0/16",
        "10.5.1.1",
    ];
    let (mut compared, mut mismatches) = (0, 0);
    for (key, value) in corpus(0x2545_f491_4f6c_dd1d, &keys) {
        let (Some(pair), Some(entry)) = (
            outcome(pairs.decode(key, &value)),
            outcome(entries.decode(key, &value)),
        ) else {
            continue;
        };
        // A pair without a prefix (an IPv4-mapped address with a 128-bit mask) is no entry.
        if entry.ends_with("no valid prefix") && pair == "accepted" {
            continue;
        }
        assert_eq!(entry, pair, "{key}: {}", String::from_utf8_lossy(&value));
        compared += 1;
        mismatches += usize::from(entry.contains("does not match key"));
    }
    assert!(
        compared > 10_000 && mismatches > 1_000,
        "{compared} {mismatches}"
    );
}

/// "accepted", or an invalid value's message; `None` for JSON the reader refused.
fn outcome<T>(result: Result<T, crate::DecodeError>) -> Option<String> {
    match result {
        Ok(_) => Some("accepted".to_owned()),
        Err(crate::DecodeError::Invalid(message)) => Some(message),
        Err(crate::DecodeError::Malformed(_)) => None,
    }
}
