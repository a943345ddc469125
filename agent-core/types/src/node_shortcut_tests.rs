//! The node fast path ([`super::node_scan`]) must decode every value exactly as the full
//! Go-compatible reader does: a generated corpus of right and wrong nodes goes through both.

use super::super::node_scan;
use super::{Node, NodeDecoder};
use crate::shortcut_corpus::{self, Variants};
use crate::{DecodeError, Decoder};

const VARIANTS: &Variants = &[
    (
        "Name",
        &[
            Some(br#""node-1""#),
            Some(br#""node-2""#),
            Some(br#""""#),
            Some(b"null"),
            Some(br#""node\u002d1""#),
            Some("\"n\u{f6}de-1\"".as_bytes()),
            Some(b"\"node-\xff\""),
            Some(b"\"node\t1\""),
            Some(b"5"),
            None,
        ],
    ),
    (
        "Cluster",
        &[
            Some(br#""c1""#),
            Some(br#""c2""#),
            Some(br#""""#),
            Some(b"null"),
            Some(br#""c\"1""#),
            None,
        ],
    ),
    (
        "IPAddresses",
        &[
            Some(
                br#"[{"Type":"InternalIP","IP":"172.16.0.1"},{"Type":"CiliumInternalIP","IP":"10.1.0.1"}]"#,
            ),
            Some(b"null"),
            Some(b"[]"),
            Some(br#"[{"IP":"fd00::1","Type":"InternalIP"}]"#),
            Some(br#"[{"Type":"ExternalIP","IP":""},{"Type":"Custom","IP":"10.0.0.1"}]"#),
            Some(br#"[{"Type":"InternalIP","IP":"::ffff:10.0.0.1"}]"#),
            Some(br#"[ { "Type" : "InternalIP" , "IP" : "10.0.0.1" } ]"#),
            Some(br#"[{}]"#),
            Some(br#"[{"Type":null,"IP":null}]"#),
            Some(br#"[null]"#),
            Some(br#"[{"type":"InternalIP","IP":"10.0.0.1"}]"#),
            Some(br#"[{"Type":"InternalIP","IP":"10.0.0.300"}]"#),
            Some(br#"[{"Type":"InternalIP","IP":"10.0.0.1","IP":"10.0.0.2"}]"#),
            Some(br#"[{"Type":"Internal\u0049P","IP":"10.0.0.1"}]"#),
            Some(br#"[{"Type":5,"IP":"10.0.0.1"}]"#),
            Some(br#"[{"Type":"InternalIP","IP":"10.0.0.1"},]"#),
            Some(br#"[1]"#),
            Some(br#"{}"#),
            None,
        ],
    ),
    (
        "IPv4AllocCIDR",
        &[
            Some(br#"{"IP":"10.1.0.0","Mask":"////AA=="}"#),
            Some(b"null"),
            Some(br#"{"IP":"10.1.0.7","Mask":"////AA=="}"#),
            Some(br#"{"Mask":"//8AAA==","IP":"10.1.0.0"}"#),
            Some(br#"{"IP":"10.1.0.0","Mask":"/////w=="}"#),
            Some(br#"{"IP":"fd00::","Mask":"////AA=="}"#),
            Some(br#"{"IP":"10.1.0.0","Mask":"/wD/AA=="}"#),
            Some(br#"{"IP":"10.1.0.0","Mask":"//////////8AAAAAAAAAAA=="}"#),
            Some(br#"{"IP":"","Mask":"////AA=="}"#),
            Some(br#"{"IP":"10.1.0.0","Mask":null}"#),
            Some(br#"{"IP":"10.1.0.0","Mask":"***"}"#),
            Some(br#"{"IP":"10.1.0.0","Mask":"////AA==","Extra":1}"#),
            Some(br#"{"ip":"10.1.0.0","Mask":"////AA=="}"#),
            Some(br#"{}"#),
            Some(br#""10.1.0.0/24""#),
            None,
        ],
    ),
    (
        "IPv4SecondaryAllocCIDRs",
        &[
            Some(b"null"),
            Some(b"[]"),
            Some(br#"[{"IP":"10.2.0.0","Mask":"//8AAA=="}]"#),
            Some(br#"[{"IP":"10.2.0.0","Mask":"//8AAA=="},{"IP":"10.3.0.0","Mask":"//8AAA=="}]"#),
            Some(br#"[null]"#),
            Some(br#"["10.2.0.0/16"]"#),
            None,
        ],
    ),
    (
        "IPv6AllocCIDR",
        &[
            Some(br#"{"IP":"fd00:10:244:1::","Mask":"//////////8AAAAAAAAAAA=="}"#),
            Some(b"null"),
            Some(br#"{"IP":"fd00:10:244:1::5","Mask":"//////////8AAAAAAAAAAA=="}"#),
            None,
        ],
    ),
    (
        "IPv6SecondaryAllocCIDRs",
        &[Some(b"null"), Some(b"[]"), None],
    ),
    (
        "IPv4HealthIP",
        &[
            Some(br#""10.1.0.7""#),
            Some(br#""""#),
            Some(b"null"),
            Some(br#""bad""#),
            Some(br#""10.1.0.07""#),
            Some(b"5"),
            None,
        ],
    ),
    (
        "IPv6HealthIP",
        &[Some(br#""""#), Some(br#""fd00::7""#), Some(b"null"), None],
    ),
    ("IPv4IngressIP", &[Some(br#""""#), Some(br#""10.1.0.9""#), None]),
    ("IPv6IngressIP", &[Some(br#""""#), Some(b"null"), None]),
    (
        "ClusterID",
        &[
            Some(b"1"),
            Some(b"0"),
            Some(b"255"),
            Some(b"4294967295"),
            Some(b"4294967296"),
            Some(b"-1"),
            Some(b"1.0"),
            Some(b"1e2"),
            Some(b"01"),
            Some(b"null"),
            Some(br#""1""#),
            None,
        ],
    ),
    (
        "Source",
        &[
            Some(br#""custom-resource""#),
            Some(br#""local""#),
            Some(br#""""#),
            Some(b"null"),
            None,
        ],
    ),
    (
        "EncryptionKey",
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
        "Labels",
        &[
            Some(br#"{"kubernetes.io/hostname":"node-1"}"#),
            Some(b"null"),
            Some(b"{}"),
            Some(br#"{"a":"b","c":"d"}"#),
            Some(br#"{"z":"1","a":"2"}"#),
            Some(br#"{"a":"b","a":"c"}"#),
            Some("{\"\u{e9}\":\"\u{fc}\"}".as_bytes()),
            Some(br#"{"a\u0026b":"c"}"#),
            Some(br#"{"a":null}"#),
            Some(br#"{"a":1}"#),
            Some(br#"[]"#),
            None,
        ],
    ),
    (
        "Annotations",
        &[Some(b"null"), Some(b"{}"), Some(br#"{"x":"y"}"#), None],
    ),
    (
        "NodeIdentity",
        &[Some(b"0"), Some(b"12345"), Some(b"null"), Some(b"-3"), None],
    ),
    (
        "WireguardPubKey",
        &[
            Some(br#""""#),
            Some(br#""x3B5YFcK9YvC4TZwn2qWqzYu4Sz9T0aE/n0pLMlKgQ8=""#),
            Some(br#""a\/b""#),
            None,
        ],
    ),
    (
        "BootID",
        &[
            Some(br#""4d0b0f36-2a8b-4a77-a0d3-1bd3e0b1b3c2""#),
            Some(br#""""#),
            None,
        ],
    ),
    // Names that are no field, or only one case-insensitively (Go's folding, `ſ` ~ `S`).
    ("Extra", &[None, Some(b"1"), Some(br#""x""#), Some(b"{}")]),
    ("name", &[None, Some(br#""node-2""#)]),
    ("\u{17f}ource", &[None, Some(br#""s""#)]),
    ("IPv4AllocCIDRs", &[None, Some(b"null")]),
];

/// The full reader alone, then the same validation.
fn decode_full(decoder: &NodeDecoder, key: &str, value: &[u8]) -> Result<Node, DecodeError> {
    decoder.validate(key, Node::from_json(value)?)
}

#[test]
fn the_plain_form_shortcut_decodes_exactly_like_the_full_reader() {
    let decoder = NodeDecoder::new("c1", Some(1));
    let keys = ["node-1", "node-2"];
    let mut seed = 0x853c_49e6_748f_ea9b_u64;
    let (mut shortcut, mut valid) = (0, 0);
    for key in keys.iter().cycle().take(200_000) {
        let value = shortcut_corpus::value(&mut seed, VARIANTS);
        let full = decode_full(&decoder, key, &value);
        let fast = decoder.decode(key, &value);
        assert_eq!(
            format!("{fast:?}"),
            format!("{full:?}"),
            "{key}: {}",
            String::from_utf8_lossy(&value)
        );
        if let Some(node) = node_scan::scan(&value) {
            // Whatever the shortcut reads, the full reader reads alike, valid or not.
            assert_eq!(Node::from_json(&value).ok(), Some(node));
            shortcut += 1;
        }
        valid += usize::from(full.is_ok());
    }
    // The corpus exercises both readers and both outcomes.
    assert!(shortcut > 10_000 && shortcut < 180_000, "{shortcut}");
    assert!(valid > 1_000, "{valid}");
}

#[test]
fn the_form_cilium_writes_takes_the_shortcut() {
    // Go's `json.Marshal` of a node (field order, `null`s, `""` IPs, legacy CIDRs), and the
    // lab's fixtures (keys sorted).
    let go = br#"{"Name":"k8s-node1","Cluster":"default","IPAddresses":[{"Type":"InternalIP","IP":"10.5.1.132"},{"Type":"CiliumInternalIP","IP":"10.6.6.71"}],"IPv4AllocCIDR":{"IP":"10.6.6.0","Mask":"////AA=="},"IPv4SecondaryAllocCIDRs":null,"IPv6AllocCIDR":null,"IPv6SecondaryAllocCIDRs":null,"IPv4HealthIP":"10.6.6.79","IPv6HealthIP":"","IPv4IngressIP":"","IPv6IngressIP":"","ClusterID":0,"Source":"local","EncryptionKey":0,"Labels":{"kubernetes.io/hostname":"k8s-node1"},"Annotations":null,"NodeIdentity":0,"WireguardPubKey":"","BootID":"4d0b0f36-2a8b-4a77-a0d3-1bd3e0b1b3c2"}"#;
    let lab = br#"{"Annotations":null,"Cluster":"cluster-7","ClusterID":7,"EncryptionKey":0,"IPAddresses":[{"IP":"172.16.112.0","Type":"InternalIP"},{"IP":"10.7.0.1","Type":"CiliumInternalIP"}],"IPv4AllocCIDR":{"IP":"10.7.0.0","Mask":"////AA=="},"IPv4HealthIP":"","IPv4IngressIP":"","IPv6AllocCIDR":null,"IPv6HealthIP":"","IPv6IngressIP":"","Labels":{"kubernetes.io/hostname":"cluster-7-node-0"},"Name":"cluster-7-node-0","NodeIdentity":0,"Source":"custom-resource","WireguardPubKey":""}"#;
    for value in [&go[..], &lab[..]] {
        let node = node_scan::scan(value).expect("the plain form");
        assert_eq!(Node::from_json(value).unwrap(), node);
    }
}
