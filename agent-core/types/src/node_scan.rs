//! A one-pass reader for nodes in the plain form Cilium's agents write: an object whose keys
//! are spelled exactly like the Go fields, each at most once, whose strings have no escapes,
//! and whose CIDRs are the legacy `{"IP":..,"Mask":..}` objects.
//!
//! It is only a shortcut, like [`super::ipcache_scan`]: whenever a value leaves that form (a
//! key that matches a field only case-insensitively, a repeated field, an escape, a number
//! that is not a plain unsigned integer, a CIDR as text, a `null` inside an array, a value a
//! field's Go type would reject) the scan gives up and [`NodeDecoder`](super::NodeDecoder)
//! reads the value with the full Go-compatible reader, which also words any error. Accepted
//! values decode exactly as the full reader decodes them; `node_shortcut_tests.rs` checks
//! both readers against each other on a generated corpus.
//!
//! Why: through serde a node cost about 14,000 instructions (callgrind of an agent reading
//! 25,000 of them behind kvstoremesh, a fifth of its sync), most of them in reading and
//! matching its 38 strings one call at a time.

use std::collections::BTreeMap;

use super::go_json::fold_eq;
use super::net::IpPrefix;
use super::node::{Address, AddressType, Node};
use super::plain_scan::Scanner;

/// The fields of a node, by their exact Go names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Field {
    Name,
    Cluster,
    IpAddresses,
    Ipv4AllocCidr,
    Ipv4SecondaryAllocCidrs,
    Ipv6AllocCidr,
    Ipv6SecondaryAllocCidrs,
    Ipv4HealthIp,
    Ipv6HealthIp,
    Ipv4IngressIp,
    Ipv6IngressIp,
    ClusterId,
    Source,
    EncryptionKey,
    Labels,
    Annotations,
    NodeIdentity,
    WireguardPubKey,
    BootId,
}

/// The field `name` spells exactly (a test checks these are `Node`'s Go names).
fn field_of(name: &[u8]) -> Option<Field> {
    Some(match name {
        b"Name" => Field::Name,
        b"Cluster" => Field::Cluster,
        b"IPAddresses" => Field::IpAddresses,
        b"IPv4AllocCIDR" => Field::Ipv4AllocCidr,
        b"IPv4SecondaryAllocCIDRs" => Field::Ipv4SecondaryAllocCidrs,
        b"IPv6AllocCIDR" => Field::Ipv6AllocCidr,
        b"IPv6SecondaryAllocCIDRs" => Field::Ipv6SecondaryAllocCidrs,
        b"IPv4HealthIP" => Field::Ipv4HealthIp,
        b"IPv6HealthIP" => Field::Ipv6HealthIp,
        b"IPv4IngressIP" => Field::Ipv4IngressIp,
        b"IPv6IngressIP" => Field::Ipv6IngressIp,
        b"ClusterID" => Field::ClusterId,
        b"Source" => Field::Source,
        b"EncryptionKey" => Field::EncryptionKey,
        b"Labels" => Field::Labels,
        b"Annotations" => Field::Annotations,
        b"NodeIdentity" => Field::NodeIdentity,
        b"WireguardPubKey" => Field::WireguardPubKey,
        b"BootID" => Field::BootId,
        _ => return None,
    })
}

/// Reads `value` if it is in the plain form; `None` means "use the full reader".
pub(super) fn scan(value: &[u8]) -> Option<Node> {
    // One check for the whole value: every string is then cut from text at its quotes.
    let text = std::str::from_utf8(value).ok()?;
    let mut reader = NodeScan {
        scanner: Scanner::new(value),
        text,
    };
    let node = reader.node()?;
    reader.scanner.at_end().then_some(node)
}

struct NodeScan<'a> {
    scanner: Scanner<'a>,
    /// The whole value as text (the scanner's bytes).
    text: &'a str,
}

impl<'a> NodeScan<'a> {
    fn node(&mut self) -> Option<Node> {
        let mut node = Node::default();
        self.scanner.expect(b'{')?;
        if self.scanner.empty(b'}')? {
            return Some(node);
        }
        let mut seen = 0u32;
        loop {
            self.scanner.expect(b'"')?;
            let name = self.scanner.string_body()?;
            self.scanner.expect(b':')?;
            match field_of(name) {
                Some(field) => {
                    // A repeated field is the full reader's: its last value wins there.
                    let bit = 1 << field as u32;
                    if seen & bit != 0 {
                        return None;
                    }
                    seen |= bit;
                    self.field(field, &mut node)?;
                }
                None => self.unknown(name)?,
            }
            if !self.scanner.more(b'}')? {
                return Some(node);
            }
        }
    }

    fn field(&mut self, field: Field, node: &mut Node) -> Option<()> {
        match field {
            Field::Name => self.string_into(&mut node.name)?,
            Field::Cluster => self.string_into(&mut node.cluster)?,
            Field::Source => self.string_into(&mut node.source)?,
            Field::WireguardPubKey => self.string_into(&mut node.wireguard_pub_key)?,
            Field::BootId => self.string_into(&mut node.boot_id)?,
            Field::IpAddresses => node.ip_addresses = self.array(Self::address)?,
            Field::Ipv4AllocCidr => self.cidr_into(&mut node.ipv4_alloc_cidr)?,
            Field::Ipv6AllocCidr => self.cidr_into(&mut node.ipv6_alloc_cidr)?,
            Field::Ipv4SecondaryAllocCidrs => {
                node.ipv4_secondary_alloc_cidrs = self.array(Self::cidr)?;
            }
            Field::Ipv6SecondaryAllocCidrs => {
                node.ipv6_secondary_alloc_cidrs = self.array(Self::cidr)?;
            }
            Field::Ipv4HealthIp => node.ipv4_health_ip = self.scanner.ip()?,
            Field::Ipv6HealthIp => node.ipv6_health_ip = self.scanner.ip()?,
            Field::Ipv4IngressIp => node.ipv4_ingress_ip = self.scanner.ip()?,
            Field::Ipv6IngressIp => node.ipv6_ingress_ip = self.scanner.ip()?,
            Field::ClusterId => self.number_into(&mut node.cluster_id, u32::MAX)?,
            Field::NodeIdentity => self.number_into(&mut node.node_identity, u32::MAX)?,
            Field::EncryptionKey => {
                let mut key = u32::from(node.encryption_key);
                self.number_into(&mut key, u32::from(u8::MAX))?;
                node.encryption_key = u8::try_from(key).ok()?;
            }
            Field::Labels => node.labels = self.string_map()?,
            Field::Annotations => node.annotations = self.string_map()?,
        }
        Some(())
    }

    /// A member the full reader ignores: a scalar under a name that folds onto no field.
    fn unknown(&mut self, name: &[u8]) -> Option<()> {
        let name = std::str::from_utf8(name).ok()?;
        if Node::GO_FIELDS.iter().any(|field| fold_eq(name, field)) {
            return None;
        }
        self.scanner.skip_scalar()
    }

    /// A string, cut from the text (its quotes are ASCII, so it ends on character bounds).
    fn string(&mut self) -> Option<&'a str> {
        self.scanner.expect(b'"')?;
        let start = self.scanner.pos;
        let body = self.scanner.string_body()?;
        self.text.get(start..start + body.len())
    }

    /// A Go string field: `null` leaves it as it is.
    fn string_into(&mut self, field: &mut String) -> Option<()> {
        if !self.scanner.null()? {
            *field = self.string()?.to_owned();
        }
        Some(())
    }

    /// A Go unsigned integer field up to `max`: `null` leaves it as it is.
    fn number_into(&mut self, field: &mut u32, max: u32) -> Option<()> {
        if !self.scanner.null()? {
            *field = self.scanner.unsigned(max)?;
        }
        Some(())
    }

    /// `null` (no element) or an array whose elements `element` reads.
    fn array<T>(&mut self, element: impl Fn(&mut Self) -> Option<T>) -> Option<Vec<T>> {
        let mut elements = Vec::new();
        if self.scanner.null()? {
            return Some(elements);
        }
        self.scanner.expect(b'[')?;
        if self.scanner.empty(b']')? {
            return Some(elements);
        }
        loop {
            elements.push(element(self)?);
            if !self.scanner.more(b']')? {
                return Some(elements);
            }
        }
    }

    /// One of `IPAddresses`: `{"Type":..,"IP":..}`.
    fn address(&mut self) -> Option<Address> {
        let mut address = Address::default();
        self.scanner.expect(b'{')?;
        if self.scanner.empty(b'}')? {
            return Some(address);
        }
        let (mut typed, mut addressed) = (false, false);
        loop {
            self.scanner.expect(b'"')?;
            let name = self.scanner.string_body()?;
            self.scanner.expect(b':')?;
            match name {
                b"Type" if !std::mem::replace(&mut typed, true) => {
                    if !self.scanner.null()? {
                        address.address_type = AddressType::from(self.string()?);
                    }
                }
                b"IP" if !std::mem::replace(&mut addressed, true) => {
                    address.ip = self.scanner.ip()?;
                }
                // Other names, and repeats, are the full reader's.
                _ => return None,
            }
            if !self.scanner.more(b'}')? {
                return Some(address);
            }
        }
    }

    /// A pod CIDR field: `null` leaves it as it is.
    fn cidr_into(&mut self, field: &mut Option<IpPrefix>) -> Option<()> {
        if !self.scanner.null()? {
            *field = Some(self.cidr()?);
        }
        Some(())
    }

    /// `{"IP":..,"Mask":..}` with an address and a canonical mask that fits it, masked.
    fn cidr(&mut self) -> Option<IpPrefix> {
        let (mut ip, mut mask) = (None, None);
        self.scanner.expect(b'{')?;
        if !self.scanner.empty(b'}')? {
            loop {
                self.scanner.expect(b'"')?;
                let name = self.scanner.string_body()?;
                self.scanner.expect(b':')?;
                match name {
                    b"IP" if ip.is_none() => ip = Some(self.scanner.ip()?),
                    b"Mask" if mask.is_none() => mask = Some(self.scanner.mask()?),
                    _ => return None,
                }
                if !self.scanner.more(b'}')? {
                    break;
                }
            }
        }
        let ones = mask.flatten()?.prefix_len()?;
        Some(IpPrefix::new(ip.flatten()?, ones).ok()?.masked())
    }

    /// `Labels` or `Annotations`: `null` or an object of strings (a repeated key's last
    /// value wins, as in Go's maps and the full reader's).
    fn string_map(&mut self) -> Option<BTreeMap<String, String>> {
        let mut map = BTreeMap::new();
        if self.scanner.null()? {
            return Some(map);
        }
        self.scanner.expect(b'{')?;
        if self.scanner.empty(b'}')? {
            return Some(map);
        }
        loop {
            let key = self.string()?;
            self.scanner.expect(b':')?;
            let value = self.string()?;
            map.insert(key.to_owned(), value.to_owned());
            if !self.scanner.more(b'}')? {
                return Some(map);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_go_name_is_a_field_and_only_those() {
        for name in Node::GO_FIELDS {
            assert!(field_of(name.as_bytes()).is_some(), "{name}");
            assert_eq!(field_of(name.to_ascii_lowercase().as_bytes()), None);
            assert_eq!(field_of(format!("{name}x").as_bytes()), None);
        }
        let fields: std::collections::HashSet<_> = Node::GO_FIELDS
            .iter()
            .filter_map(|name| field_of(name.as_bytes()))
            .collect();
        assert_eq!(fields.len(), Node::GO_FIELDS.len(), "one field per name");
    }

    #[test]
    fn reads_what_go_writes() {
        let node = Node {
            name: "node-1".into(),
            cluster: "c1".into(),
            ip_addresses: vec![
                Address {
                    address_type: AddressType::InternalIp,
                    ip: Some("172.16.0.1".parse().unwrap()),
                },
                Address {
                    address_type: AddressType::CiliumInternalIp,
                    ip: Some("fd00::1".parse().unwrap()),
                },
            ],
            ipv4_alloc_cidr: Some("10.1.0.0/24".parse().unwrap()),
            ipv6_alloc_cidr: Some("fd00:10::/64".parse().unwrap()),
            ipv4_secondary_alloc_cidrs: vec!["10.2.0.0/16".parse().unwrap()],
            ipv4_health_ip: Some("10.1.0.7".parse().unwrap()),
            cluster_id: 7,
            source: "local".into(),
            encryption_key: 3,
            labels: [("kubernetes.io/hostname".into(), "node-1".into())].into(),
            annotations: [("a".into(), "b".into()), ("c".into(), "".into())].into(),
            node_identity: 6,
            wireguard_pub_key: "x3B5YFcK9YvC4TZwn2qWqzYu4Sz9T0aE/n0pLMlKgQ8=".into(),
            boot_id: "4d0b0f36".into(),
            ..Node::default()
        };
        assert_eq!(scan(&node.to_json()), Some(node));
        assert_eq!(scan(&Node::default().to_json()), Some(Node::default()));
        assert_eq!(scan(b" {} "), Some(Node::default()));
    }

    #[test]
    fn leaves_everything_else_to_the_full_reader() {
        for value in [
            r#"{"name":"n1"}"#,
            r#"{"Name":"n1","Name":"n2"}"#,
            r#"{"Name":"n\u0031"}"#,
            r#"{"Name":"n1","ClusterID":1.0}"#,
            r#"{"Name":"n1","ClusterID":-1}"#,
            r#"{"EncryptionKey":256}"#,
            r#"{"IPv4AllocCIDR":"10.0.0.0/24"}"#,
            r#"{"IPv4AllocCIDR":{"IP":"10.0.0.0","Mask":"/wD/AA=="}}"#,
            r#"{"IPv4AllocCIDR":{"ip":"10.0.0.0","Mask":"////AA=="}}"#,
            r#"{"IPv4AllocCIDR":{}}"#,
            r#"{"IPAddresses":[null]}"#,
            r#"{"IPAddresses":[{"AddressType":"InternalIP"}]}"#,
            r#"{"IPAddresses":[{"IP":"10.0.0.1","IP":"10.0.0.2"}]}"#,
            r#"{"Labels":{"a":null}}"#,
            r#"{"Extra":{"a":1}}"#,
            r#"{"Name":"n1"} x"#,
            r#"{"Name":"n1",}"#,
            "null",
        ] {
            assert_eq!(scan(value.as_bytes()), None, "{value}");
        }
        assert_eq!(scan(b"{\"Name\":\"\xff\"}"), None, "not UTF-8");
    }
}
