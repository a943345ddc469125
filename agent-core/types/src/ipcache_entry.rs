//! The ipcache entry as the agent keeps it: compact, because an agent holds every remote
//! cluster's ipcache (a million entries is a realistic mesh).
//!
//! Kept: the prefix, the tunnel endpoint (`HostIP`), the identity, the encryption key and
//! named ports. Read and checked as Go would, but not kept: Cilium's owner `Metadata` string,
//! which only the writer uses, and the pod's `K8sNamespace` and `K8sPodName`, which nothing
//! in the agent reads (Cilium keeps them for Hubble's flow records, which Meshwork does not
//! have). The pod's name was the one allocation of an entry besides the entry itself.

use std::net::IpAddr;

use super::go_json::{GoIp, GoMask, NullIfEmpty, OmitEmpty, Plain, go_struct};
use super::ipcache::{IpCacheDecoder, IpIdentityPair, NamedPort};
use super::ipcache_key::PrefixKey;
use super::ipcache_scan::{self, ScannedPair};
use super::net::{IpMask, IpPrefix};
use crate::{DecodeError, Decoder, KeyedValue};

/// A validated ipcache entry.
///
/// 56 bytes: with the `Arc` header it fits the allocator's 80-byte class, and a million of
/// them are most of what a large mesh costs (`the_entry_is_small` holds it there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpCacheEntry {
    /// The network the entry covers (a host entry is /32 or /128).
    pub prefix: IpPrefix,
    /// The node hosting the prefix: the tunnel endpoint.
    pub host_ip: Option<IpAddr>,
    /// The security identity.
    pub identity: u32,
    /// The encryption key index.
    pub encrypt_key: u8,
    /// Keyed as a host entry (`<ip>`, no mask) rather than `<ip>/<len>`: `10.0.0.1` and
    /// `10.0.0.1/32` are two keys with the same prefix.
    host_key: bool,
    // Behind one thin pointer: named ports are rare, and a slice pointer would cost every
    // entry 8 more bytes and a larger allocation.
    named_ports: Option<Box<NamedPorts>>,
}

/// The named ports of an entry that has some.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NamedPorts(Box<[NamedPort]>);

impl IpCacheEntry {
    /// The pod's named ports.
    pub fn named_ports(&self) -> &[NamedPort] {
        self.named_ports.as_deref().map_or(&[], |ports| &ports.0)
    }

    /// The entry's key below the ipcache prefix, Cilium's `PrefixString()`: `<ip>` for a host
    /// entry (no mask), else `<ip>/<len>`.
    pub fn key_name(&self) -> String {
        self.key().as_str().to_owned()
    }

    fn key(&self) -> PrefixKey {
        let mask_len = (!self.host_key).then(|| self.prefix.prefix_len());
        PrefixKey::new(self.prefix.addr(), mask_len)
    }

    /// The compact form of a validated pair (`None` when it has no valid prefix).
    pub fn from_pair(pair: IpIdentityPair) -> Option<Self> {
        Some(Self {
            prefix: pair.prefix()?,
            host_ip: pair.host_ip,
            identity: pair.id,
            encrypt_key: pair.key,
            host_key: pair.is_host(),
            named_ports: named_ports(pair.named_ports),
        })
    }
}

impl KeyedValue for IpCacheEntry {
    fn with_key<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        f(self.key().as_bytes())
    }

    // `IpCacheEntryDecoder` is its only decoder.
    const KEY_CHECKED_BY_DECODER: bool = true;
}

fn named_ports(ports: Vec<NamedPort>) -> Option<Box<NamedPorts>> {
    (!ports.is_empty()).then(|| Box::new(NamedPorts(ports.into_boxed_slice())))
}

go_struct! {
    /// The ipcache JSON as the agent reads it: the owner `Metadata` is skipped, not copied.
    pub(super) struct IpCacheWire {
        ip: Option<IpAddr> => "IP" as GoIp,
        mask: Option<IpMask> => "Mask" as GoMask,
        host_ip: Option<IpAddr> => "HostIP" as GoIp,
        id: u32 => "ID",
        key: u8 => "Key",
        k8s_namespace: String => "K8sNamespace" as OmitEmpty<Plain>,
        k8s_pod_name: String => "K8sPodName" as OmitEmpty<Plain>,
        named_ports: Vec<NamedPort> => "NamedPorts" as OmitEmpty<NullIfEmpty>,
    }
}

/// Decodes and validates like [`IpCacheDecoder`], keeping the compact [`IpCacheEntry`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpCacheEntryDecoder(pub IpCacheDecoder);

impl IpCacheEntryDecoder {
    /// Validates the fields of a value found under `key` and builds the entry.
    fn entry(
        &self,
        key: &str,
        fields: ScannedPair,
        ports: Vec<NamedPort>,
    ) -> Result<IpCacheEntry, DecodeError> {
        // Only the IP, the mask and the ID are validated: no strings are copied for it.
        let pair = IpIdentityPair {
            ip: fields.ip,
            mask: fields.mask,
            id: fields.id,
            ..IpIdentityPair::default()
        };
        self.0.validate_fields(key, &pair)?;
        let Some(prefix) = pair.prefix() else {
            // A key that does not match says so first, as the pair decoder would.
            self.0.validate(key, &pair)?;
            return Err(DecodeError::Invalid(format!(
                "ipcache entry {key}: no valid prefix"
            )));
        };
        let entry = IpCacheEntry {
            prefix,
            host_ip: fields.host_ip,
            identity: fields.id,
            encrypt_key: fields.key,
            host_key: fields.mask.is_none(),
            named_ports: named_ports(ports),
        };
        // The key Go compares (the pair's `PrefixString()`) checked on the key the entry
        // renders, the one a store finds it by: rendered once, and the store need not check
        // again (`KEY_CHECKED_BY_DECODER`). A test shows both decoders agree.
        if !entry.with_key(|own| own == key.as_bytes()) {
            return Err(IpCacheDecoder::key_mismatch(key, &pair));
        }
        Ok(entry)
    }

    /// Decodes with the full Go-compatible reader only.
    fn decode_full(&self, key: &str, value: &[u8]) -> Result<IpCacheEntry, DecodeError> {
        let wire = IpCacheWire::from_json(value)?;
        let fields = ScannedPair {
            ip: wire.ip,
            mask: wire.mask,
            host_ip: wire.host_ip,
            id: wire.id,
            key: wire.key,
        };
        self.entry(key, fields, wire.named_ports)
    }
}

impl Decoder for IpCacheEntryDecoder {
    type Value = IpCacheEntry;

    fn decode(&self, key: &str, value: &[u8]) -> Result<IpCacheEntry, DecodeError> {
        // Most values are in the plain form Cilium writes; the rest take the full reader.
        if let Some(fields) = ipcache_scan::scan(value) {
            return self.entry(key, fields, Vec::new());
        }
        self.decode_full(key, value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_what_the_agent_uses() {
        let json = br#"{"IP":"10.6.6.43","Mask":null,"HostIP":"10.5.1.132","ID":12928,"Key":3,"Metadata":"m","K8sNamespace":"istio-system","K8sPodName":"gw-1","NamedPorts":[{"Name":"http","Port":80,"Protocol":"TCP"}]}"#;
        let entry = IpCacheEntryDecoder(IpCacheDecoder::new(None))
            .decode("10.6.6.43", json)
            .unwrap();
        assert_eq!(entry.prefix.to_string(), "10.6.6.43/32");
        assert_eq!(entry.key_name(), "10.6.6.43");
        assert_eq!(entry.host_ip, Some("10.5.1.132".parse().unwrap()));
        assert_eq!((entry.identity, entry.encrypt_key), (12928, 3));
        assert_eq!(entry.named_ports()[0].port, 80);
        let bare = br#"{"IP":"10.0.0.0","Mask":"////AA==","HostIP":"10.5.1.1","ID":300}"#;
        let entry = IpCacheEntryDecoder(IpCacheDecoder::new(None))
            .decode("10.0.0.0/24", bare)
            .unwrap();
        assert_eq!(entry.named_ports().len(), 0);
        assert_eq!(entry.key_name(), "10.0.0.0/24");
    }

    #[test]
    fn the_entry_is_small() {
        // What a million of them cost: 56 bytes and the Arc's 16 make an 80-byte size class
        // (mimalloc's and glibc's); one byte more and every entry takes the 96-byte one.
        assert!(
            size_of::<IpCacheEntry>() <= 56,
            "{}",
            size_of::<IpCacheEntry>()
        );
    }

    #[test]
    fn the_key_keeps_the_form_it_came_in() {
        let decoder = IpCacheEntryDecoder(IpCacheDecoder::new(None));
        let host = br#"{"IP":"10.0.0.1","Mask":null,"ID":300}"#;
        let slash32 = br#"{"IP":"10.0.0.1","Mask":"/////w==","ID":300}"#;
        let host = decoder.decode("10.0.0.1", host).unwrap();
        let slash32 = decoder.decode("10.0.0.1/32", slash32).unwrap();
        assert_eq!(host.prefix, slash32.prefix);
        assert_eq!(host.key_name(), "10.0.0.1");
        assert_eq!(slash32.key_name(), "10.0.0.1/32");
        assert!(host.with_key(|key| key == b"10.0.0.1"));
        assert!(slash32.with_key(|key| key == b"10.0.0.1/32"));
        assert_ne!(host, slash32, "two keys, two entries");
        let v6 = br#"{"IP":"fd00:10::","Mask":"//////////8AAAAAAAAAAA==","ID":300}"#;
        let v6 = decoder.decode("fd00:10::/64", v6).unwrap();
        assert!(v6.with_key(|key| key == b"fd00:10::/64"));
    }
}

/// The plain-form shortcut checked against the full reader.
#[cfg(test)]
#[path = "ipcache_shortcut_tests.rs"]
mod shortcut_tests;
