//! The ipcache entry as the agent keeps it: compact, because an agent holds every remote
//! cluster's ipcache (a million entries is a realistic mesh).
//!
//! Kept: the prefix, the tunnel endpoint (`HostIP`), the identity, the encryption key, the
//! pod (`K8sNamespace/K8sPodName`, packed in one allocation) and named ports. Dropped: Cilium's
//! owner `Metadata` string, which only the writer uses.

use std::net::IpAddr;

use super::go_json::{GoIp, GoMask, NullIfEmpty, OmitEmpty, Plain, go_struct};
use super::ipcache::{IpCacheDecoder, IpIdentityPair, NamedPort};
use super::ipcache_scan::{self, ScannedPair};
use super::net::{IpMask, IpPrefix};
use crate::{DecodeError, Decoder};

/// A validated ipcache entry.
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
    pod: Option<Box<str>>,
    named_ports: Option<Box<[NamedPort]>>,
}

impl IpCacheEntry {
    /// The pod's namespace and name, when the entry is a pod's.
    pub fn pod(&self) -> Option<(&str, &str)> {
        self.pod.as_deref().and_then(|p| p.split_once('/'))
    }

    /// The pod's named ports.
    pub fn named_ports(&self) -> &[NamedPort] {
        self.named_ports.as_deref().unwrap_or_default()
    }

    /// The entry's key below the ipcache prefix, Cilium's `PrefixString()`: `<ip>` for a host
    /// entry, else `<ip>/<len>`.
    pub fn key_name(&self) -> String {
        if self.prefix.is_host() {
            self.prefix.addr().to_string()
        } else {
            self.prefix.to_string()
        }
    }

    /// The compact form of a validated pair (`None` when it has no valid prefix).
    pub fn from_pair(pair: IpIdentityPair) -> Option<Self> {
        Some(Self {
            prefix: pair.prefix()?,
            host_ip: pair.host_ip,
            identity: pair.id,
            encrypt_key: pair.key,
            pod: pod_name(&pair.k8s_namespace, &pair.k8s_pod_name),
            named_ports: (!pair.named_ports.is_empty())
                .then(|| pair.named_ports.into_boxed_slice()),
        })
    }
}

/// `namespace/name` in one exact-size allocation; `None` when both are empty.
fn pod_name(namespace: &str, name: &str) -> Option<Box<str>> {
    if namespace.is_empty() && name.is_empty() {
        return None;
    }
    let mut pod = String::with_capacity(namespace.len() + 1 + name.len());
    pod.push_str(namespace);
    pod.push('/');
    pod.push_str(name);
    Some(pod.into_boxed_str())
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
        fields: ScannedPair<'_>,
        named_ports: Vec<NamedPort>,
    ) -> Result<IpCacheEntry, DecodeError> {
        // Only the IP, the mask and the ID are validated: no strings are copied for it.
        let pair = IpIdentityPair {
            ip: fields.ip,
            mask: fields.mask,
            id: fields.id,
            ..IpIdentityPair::default()
        };
        self.0.validate(key, &pair)?;
        let prefix = pair
            .prefix()
            .ok_or_else(|| DecodeError::Invalid(format!("ipcache entry {key}: no valid prefix")))?;
        Ok(IpCacheEntry {
            prefix,
            host_ip: fields.host_ip,
            identity: fields.id,
            encrypt_key: fields.key,
            pod: pod_name(fields.namespace, fields.pod_name),
            named_ports: (!named_ports.is_empty()).then(|| named_ports.into_boxed_slice()),
        })
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
            namespace: &wire.k8s_namespace,
            pod_name: &wire.k8s_pod_name,
        };
        self.entry(key, fields, wire.named_ports)
    }
}

impl Decoder for IpCacheEntryDecoder {
    type Value = IpCacheEntry;

    fn decode(&self, key: &str, value: &[u8]) -> Result<IpCacheEntry, DecodeError> {
        // Most values are in the plain form Cilium writes; the rest take the full reader.
        match ipcache_scan::scan(value) {
            Some(fields) => self.entry(key, fields, Vec::new()),
            None => self.decode_full(key, value),
        }
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
        assert_eq!(entry.pod(), Some(("istio-system", "gw-1")));
        assert_eq!(entry.named_ports()[0].port, 80);
        let bare = br#"{"IP":"10.0.0.0","Mask":"////AA==","HostIP":"10.5.1.1","ID":300}"#;
        let entry = IpCacheEntryDecoder(IpCacheDecoder::new(None))
            .decode("10.0.0.0/24", bare)
            .unwrap();
        assert_eq!((entry.pod(), entry.named_ports().len()), (None, 0));
        assert_eq!(entry.key_name(), "10.0.0.0/24");
    }

    #[test]
    fn the_entry_is_small() {
        // What a million of them cost, before the key and the map.
        assert!(
            size_of::<IpCacheEntry>() <= 80,
            "{}",
            size_of::<IpCacheEntry>()
        );
    }
}

/// The plain-form shortcut checked against the full reader.
#[cfg(test)]
#[path = "ipcache_shortcut_tests.rs"]
mod shortcut_tests;
