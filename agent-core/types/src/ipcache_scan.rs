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
//!
//! Its steps are [`super::plain_scan`]'s. The pod's namespace and name are only checked
//! (ASCII, or else UTF-8), as the agent does not keep them.

use std::net::IpAddr;

use super::go_json::fold_eq;
use super::ipcache_entry::IpCacheWire;
use super::net::IpMask;
use super::plain_scan::Scanner;

/// The fields of an ipcache value that the agent keeps.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct ScannedPair {
    pub ip: Option<IpAddr>,
    pub mask: Option<IpMask>,
    pub host_ip: Option<IpAddr>,
    pub id: u32,
    pub key: u8,
}

/// Reads `value` if it is in the plain form; `None` means "use the full reader".
pub(super) fn scan(value: &[u8]) -> Option<ScannedPair> {
    let mut scanner = Scanner::new(value);
    let mut pair = ScannedPair::default();
    scanner.expect(b'{')?;
    if !scanner.empty(b'}')? {
        loop {
            scanner.expect(b'"')?;
            let name = match scanner.field_name(&NAMES)? {
                Ok(name) => name,
                Err(other) => Field::Other(other),
            };
            scanner.expect(b':')?;
            field(&mut scanner, name, &mut pair)?;
            if !scanner.more(b'}')? {
                break;
            }
        }
    }
    scanner.at_end().then_some(pair)
}

/// The fields the scan reads, by their exact Go names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field<'a> {
    Ip,
    HostIp,
    Mask,
    Id,
    Key,
    Namespace,
    PodName,
    NamedPorts,
    Metadata,
    /// Any other name, as written.
    Other(&'a [u8]),
}

/// The exact names, each with its closing quote (a test checks they are `IpCacheWire`'s).
const NAMES: [(&[u8], Field<'static>); 9] = [
    (b"IP\"", Field::Ip),
    (b"ID\"", Field::Id),
    (b"HostIP\"", Field::HostIp),
    (b"Key\"", Field::Key),
    (b"K8sNamespace\"", Field::Namespace),
    (b"K8sPodName\"", Field::PodName),
    (b"Mask\"", Field::Mask),
    (b"Metadata\"", Field::Metadata),
    (b"NamedPorts\"", Field::NamedPorts),
];

/// Reads the value of `field` into `pair`.
fn field(scanner: &mut Scanner<'_>, field: Field<'_>, pair: &mut ScannedPair) -> Option<()> {
    match field {
        Field::Ip => pair.ip = scanner.ip()?,
        Field::HostIp => pair.host_ip = scanner.ip()?,
        Field::Mask => pair.mask = scanner.mask()?,
        Field::Id => {
            if !scanner.null()? {
                pair.id = scanner.unsigned(u32::MAX)?;
            }
        }
        Field::Key => {
            if !scanner.null()? {
                pair.key = u8::try_from(scanner.unsigned(u32::from(u8::MAX))?).ok()?;
            }
        }
        Field::Namespace | Field::PodName => scanner.text()?,
        // Named ports are rare and nested: anything but `null` goes to the full reader.
        Field::NamedPorts => return scanner.null()?.then_some(()),
        // Written by every Cilium agent and not kept; no field folds onto it.
        Field::Metadata => scanner.skip_scalar()?,
        Field::Other(name) => {
            let name = std::str::from_utf8(name).ok()?;
            // A key the full reader would fold onto one of its fields is its to read.
            if IpCacheWire::GO_FIELDS
                .iter()
                .any(|field| fold_eq(name, field))
            {
                return None;
            }
            scanner.skip_scalar()?;
        }
    }
    Some(())
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

        let spaced = b" {\n  \"IP\" : \"fd00::1\",\t\"Mask\": \"/////w==\" , \"ID\": 0 }\n";
        let pair = scan(spaced).expect("whitespace between tokens");
        assert_eq!(pair.ip, Some("fd00::1".parse().unwrap()));
        assert_eq!(pair.mask.and_then(|m| m.prefix_len()), Some(32));
        assert_eq!(scan(b"{}"), Some(ScannedPair::default()));
    }

    #[test]
    fn every_exact_name_is_recognised_and_only_those() {
        // The wire struct skips `Metadata` rather than copy it; the scan knows it by name.
        let mut wire: Vec<&str> = IpCacheWire::GO_FIELDS.to_vec();
        wire.push("Metadata");
        let mut names: Vec<&str> = NAMES
            .iter()
            .map(|(name, _)| std::str::from_utf8(&name[..name.len() - 1]).unwrap())
            .collect();
        wire.sort_unstable();
        names.sort_unstable();
        assert_eq!(
            names, wire,
            "NAMES is every field of IpCacheWire and Metadata"
        );
        for (name, field) in NAMES {
            let mut scanner = Scanner::new(name);
            assert_eq!(scanner.field_name(&NAMES), Some(Ok(field)));
            assert_eq!(scanner.pos, name.len(), "{name:?} with its closing quote");
            // Only the exact spelling: the same name in another case, or longer, is another.
            let mut other = name.to_vec();
            other.insert(name.len() - 1, b'x');
            assert_eq!(
                Scanner::new(&other).field_name(&NAMES),
                Some(Err(&other[..other.len() - 1]))
            );
            let lower = name.to_ascii_lowercase();
            assert_eq!(
                Scanner::new(&lower).field_name(&NAMES),
                Some(Err(&lower[..lower.len() - 1]))
            );
        }
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
