//! ipcache entries: key `cilium/state/ip/v1/default/<ip>` (host entry, `Mask` null) or
//! `…/<ip>/<len>` (prefix).
//!
//! Go: `IPIdentityPair` in `pkg/identity/identity.go`, with explicit tags: `IP`, `Mask`
//! (`net.IPMask`, base64 or `null`), `HostIP`, `ID`, `Key`, `Metadata` always written;
//! `K8sNamespace`, `K8sPodName`, `K8sServiceAccount`, `NamedPorts` omitted when empty.
//! Cilium's `Unmarshal` rejects an entry whose `PrefixString()` differs from its key, and remote
//! watchers (`WithIdentityValidator`) reject IDs outside the remote cluster's range unless they
//! are reserved (< 256).

use std::fmt;
use std::net::IpAddr;

use crate::{DecodeError, Decoder};

use super::cluster_config::DEFAULT_MAX_CONNECTED_CLUSTERS;
use super::go_json::{GoIp, GoMask, NullIfEmpty, OmitEmpty, Plain, go_struct};
use super::identity::{MINIMAL_NUMERIC_IDENTITY, identity_range};
use super::ipcache_key::PrefixKey;
use super::net::{IpMask, IpPrefix, family_bits};

go_struct! {
    /// A named port of an endpoint.
    pub struct NamedPort {
        /// Port name (`Name`).
        pub name: String => "Name",
        /// Port number (`Port`).
        pub port: u16 => "Port",
        /// Protocol, e.g. `TCP` (`Protocol`).
        pub protocol: String => "Protocol",
    }
}

go_struct! {
    /// An IP or prefix and its security identity.
    pub struct IpIdentityPair {
        /// The IP, or the prefix address (`IP`).
        pub ip: Option<IpAddr> => "IP" as GoIp,
        /// The prefix mask; `None` for a host entry (`Mask`).
        pub mask: Option<IpMask> => "Mask" as GoMask,
        /// The node hosting the IP, the tunnel endpoint (`HostIP`).
        pub host_ip: Option<IpAddr> => "HostIP" as GoIp,
        /// The numeric security identity (`ID`).
        pub id: u32 => "ID",
        /// Encryption key index (`Key`).
        pub key: u8 => "Key",
        /// Owner metadata (`Metadata`).
        pub metadata: String => "Metadata",
        /// Pod namespace (`K8sNamespace`, omitted when empty).
        pub k8s_namespace: String => "K8sNamespace" as OmitEmpty<Plain>,
        /// Pod name (`K8sPodName`, omitted when empty).
        pub k8s_pod_name: String => "K8sPodName" as OmitEmpty<Plain>,
        /// Pod service account (`K8sServiceAccount`, omitted when empty; newer Cilium).
        pub k8s_service_account: String => "K8sServiceAccount" as OmitEmpty<Plain>,
        /// Named ports of the endpoint (`NamedPorts`, omitted when empty).
        pub named_ports: Vec<NamedPort> => "NamedPorts" as OmitEmpty<NullIfEmpty>,
    }
}

impl IpIdentityPair {
    /// A host entry (mask `None`).
    pub fn is_host(&self) -> bool {
        self.mask.is_none()
    }

    /// The network the entry covers: the IP with the mask's length, or /32 (/128) for a host
    /// entry. `None` without IP, or with a mask that is not canonical or not of the IP's family.
    pub fn prefix(&self) -> Option<IpPrefix> {
        let ip = self.ip?;
        match self.mask {
            None => Some(IpPrefix::host(ip)),
            Some(mask) if mask.bits() == family_bits(ip) => {
                IpPrefix::new(ip, mask.prefix_len()?).ok()
            }
            Some(_) => None,
        }
    }

    /// The key relative to [`IPCACHE_DEFAULT_PREFIX`](crate::keys::IPCACHE_DEFAULT_PREFIX), Cilium's `PrefixString()`: `<ip>` for a host
    /// entry, else `<ip>/<ones>`.
    pub fn key_name(&self) -> String {
        PrefixString(self).to_string()
    }
}

/// Cilium's `PrefixString()` without allocating, to compare with the key.
struct PrefixString<'a>(&'a IpIdentityPair);

impl fmt::Display for PrefixString<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.ip {
            Some(ip) => write!(f, "{ip}")?,
            None => f.write_str("<nil>")?,
        }
        if let Some(mask) = self.0.mask {
            write!(f, "/{}", mask.prefix_len().unwrap_or(0))?;
        }
        Ok(())
    }
}

/// Whether the pair's `PrefixString()` is exactly `key`, rendered without allocating.
fn key_matches(pair: &IpIdentityPair, key: &str) -> bool {
    let Some(ip) = pair.ip else {
        return renders_as(&PrefixString(pair), key);
    };
    // Masks that are not canonical are rejected before this.
    let mask_len = pair.mask.map(|mask| mask.prefix_len().unwrap_or(0));
    PrefixKey::new(ip, mask_len).as_bytes() == key.as_bytes()
}

/// Whether `display` renders exactly as `expected`, without building a string.
fn renders_as(display: &impl fmt::Display, expected: &str) -> bool {
    struct Compare<'a> {
        rest: &'a str,
        equal: bool,
    }
    impl fmt::Write for Compare<'_> {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            match self.rest.strip_prefix(s) {
                Some(rest) if self.equal => self.rest = rest,
                _ => self.equal = false,
            }
            Ok(())
        }
    }
    let mut compare = Compare {
        rest: expected,
        equal: true,
    };
    fmt::write(&mut compare, format_args!("{display}")).is_ok()
        && compare.equal
        && compare.rest.is_empty()
}

/// Reads ipcache entries of one remote cluster (keys relative to
/// `cilium/state/ip/v1/default/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpCacheDecoder {
    /// The remote cluster's ID once its config is known; identities must then be in its range
    /// (or reserved).
    pub cluster_id: Option<u32>,
    /// Our `--max-connected-clusters` (255 or 511), which sets the range width.
    pub max_connected_clusters: u32,
}

impl IpCacheDecoder {
    /// A decoder for a cluster with ID `cluster_id` if known, with 255 connected clusters.
    pub fn new(cluster_id: Option<u32>) -> Self {
        Self {
            cluster_id,
            max_connected_clusters: DEFAULT_MAX_CONNECTED_CLUSTERS,
        }
    }

    /// Sets `--max-connected-clusters`.
    pub fn with_max_connected_clusters(mut self, max_connected_clusters: u32) -> Self {
        self.max_connected_clusters = max_connected_clusters;
        self
    }

    /// Validates a decoded `pair` found under `key` as a remote entry (see the type docs).
    pub fn validate(&self, key: &str, pair: &IpIdentityPair) -> Result<(), DecodeError> {
        self.validate_fields(key, pair)?;
        if !key_matches(pair, key) {
            return Err(Self::key_mismatch(key, pair));
        }
        Ok(())
    }

    /// Validates everything [`Self::validate`] does but the key, which the caller then
    /// compares itself, with [`Self::key_mismatch`] as its error.
    pub(crate) fn validate_fields(
        &self,
        key: &str,
        pair: &IpIdentityPair,
    ) -> Result<(), DecodeError> {
        self.check_fields(pair)
            .map_err(|message| DecodeError::Invalid(format!("ipcache entry {key}: {message}")))
    }

    /// The error of a `pair` whose `PrefixString()` is not `key`.
    pub(crate) fn key_mismatch(key: &str, pair: &IpIdentityPair) -> DecodeError {
        DecodeError::Invalid(format!(
            "ipcache entry {key}: IP address does not match key: expected {key}, got {}",
            PrefixString(pair)
        ))
    }

    fn check_fields(&self, pair: &IpIdentityPair) -> Result<(), String> {
        let Some(ip) = pair.ip else {
            return Err("IP is missing".into());
        };
        if let Some(mask) = pair.mask {
            if mask.bits() != family_bits(ip) {
                return Err(format!(
                    "mask of {} bits does not fit {ip} ({} bits)",
                    mask.bits(),
                    family_bits(ip)
                ));
            }
            if mask.prefix_len().is_none() {
                return Err(format!("mask {:02x?} is not canonical", mask.as_bytes()));
            }
        }
        if pair.id == 0 {
            return Err("identity 0 is not a valid identity".into());
        }
        if let Some(cluster_id) = self.cluster_id {
            let reserved = pair.id < MINIMAL_NUMERIC_IDENTITY;
            if !reserved
                && !identity_range(cluster_id, self.max_connected_clusters).contains(&pair.id)
            {
                return Err(format!(
                    "ID {} does not belong to the allocation range of cluster ID {cluster_id}",
                    pair.id
                ));
            }
        }
        Ok(())
    }
}

impl Decoder for IpCacheDecoder {
    type Value = IpIdentityPair;

    fn decode(&self, key: &str, value: &[u8]) -> Result<IpIdentityPair, DecodeError> {
        let pair = IpIdentityPair::from_json(value)?;
        self.validate(key, &pair)?;
        Ok(pair)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// From Cilium's docs (`etcdctl get cilium/state/ip/v1/default/10.6.6.43`), compacted: the
    /// exact bytes an agent writes.
    const GO_HOST_ENTRY: &str = r#"{"IP":"10.6.6.43","Mask":null,"HostIP":"10.5.1.132","ID":12928,"Key":0,"Metadata":"cilium-global:default:k8s-node1:432","K8sNamespace":"istio-system","K8sPodName":"ai-ingressgateway-6bdbdbf7dc-jz85c"}"#;

    fn invalid(result: Result<IpIdentityPair, DecodeError>) -> String {
        match result {
            Err(DecodeError::Invalid(message)) => message,
            other => panic!("expected an invalid entry, got {other:?}"),
        }
    }

    fn pair(ip: &str, mask: Option<&[u8]>, id: u32) -> IpIdentityPair {
        IpIdentityPair {
            ip: Some(ip.parse().unwrap()),
            mask: mask.map(|m| IpMask::from_bytes(m).unwrap()),
            id,
            ..Default::default()
        }
    }

    #[test]
    fn host_entry_byte_exact() {
        let entry = IpCacheDecoder::new(None)
            .decode("10.6.6.43", GO_HOST_ENTRY.as_bytes())
            .unwrap();
        assert!(entry.is_host());
        assert_eq!(entry.prefix().unwrap().to_string(), "10.6.6.43/32");
        assert_eq!(entry.host_ip, Some("10.5.1.132".parse().unwrap()));
        assert_eq!(entry.key_name(), "10.6.6.43");
        assert_eq!(String::from_utf8(entry.to_json()).unwrap(), GO_HOST_ENTRY);
    }

    #[test]
    fn prefix_entry_byte_exact() {
        let json = r#"{"IP":"fd00:10::","Mask":"//////////8AAAAAAAAAAA==","HostIP":"","ID":16777217,"Key":3,"Metadata":"","NamedPorts":[{"Name":"http","Port":80,"Protocol":"TCP"}]}"#;
        let entry = IpIdentityPair::from_json(json.as_bytes()).unwrap();
        assert_eq!(entry.prefix().unwrap().to_string(), "fd00:10::/64");
        assert_eq!(entry.key_name(), "fd00:10::/64");
        assert_eq!(entry.key, 3);
        assert_eq!(
            entry.named_ports[0],
            NamedPort {
                name: "http".into(),
                port: 80,
                protocol: "TCP".into()
            }
        );
        assert_eq!(String::from_utf8(entry.to_json()).unwrap(), json);
        assert!(
            IpCacheDecoder::new(None)
                .decode("fd00:10::/64", json.as_bytes())
                .is_ok()
        );
    }

    #[test]
    fn lower_and_mixed_case_names() {
        let entry = IpIdentityPair::from_json(
            br#"{"ip":"10.0.0.0","MASK":"/wAAAA==","hostip":"192.168.1.1","id":70000,"key":1,"metadata":"m","k8snamespace":"ns","namedports":[{"name":"dns","port":53,"protocol":"UDP"}],"unknown":true}"#,
        )
        .unwrap();
        assert_eq!(entry.prefix().unwrap().to_string(), "10.0.0.0/8");
        assert_eq!(entry.id, 70000);
        assert_eq!(entry.k8s_namespace, "ns");
        assert_eq!(entry.named_ports[0].port, 53);
        // A round trip writes Go's names again.
        assert!(String::from_utf8(entry.to_json()).unwrap().starts_with(
            r#"{"IP":"10.0.0.0","Mask":"/wAAAA==","HostIP":"192.168.1.1","ID":70000"#
        ));
        assert_eq!(IpIdentityPair::from_json(&entry.to_json()).unwrap(), entry);
    }

    #[test]
    fn duplicates_and_nulls() {
        let entry = IpIdentityPair::from_json(br#"{"IP":"10.0.0.1","ID":5,"ID":70000,"Mask":"/////w==","Mask":null,"HostIP":null,"NamedPorts":null}"#).unwrap();
        assert_eq!(entry.id, 70000);
        assert!(entry.is_host());
        assert_eq!(entry.host_ip, None);
    }

    #[test]
    fn decoder_validation() {
        let decoder = IpCacheDecoder::new(Some(1));
        let decode = |key: &str, p: &IpIdentityPair| decoder.decode(key, &p.to_json());

        assert!(decode("10.1.2.3", &pair("10.1.2.3", None, 65536)).is_ok());
        assert!(
            decode(
                "10.1.0.0/16",
                &pair("10.1.0.0", Some(&[255, 255, 0, 0]), 131071)
            )
            .is_ok()
        );
        assert!(
            decode("10.1.2.3", &pair("10.1.2.3", None, 6)).is_ok(),
            "reserved identities are not cluster-scoped"
        );
        assert!(decode("fd00::1", &pair("fd00::1", None, 70000)).is_ok());

        assert!(invalid(decode("10.1.2.3", &pair("10.1.2.3", None, 0))).contains("identity 0"));
        assert!(
            invalid(decode("10.1.2.3", &pair("10.1.2.3", None, 131072)))
                .contains("allocation range of cluster ID 1")
        );
        assert!(
            invalid(decode("10.1.2.3", &pair("10.1.2.3", None, 300))).contains("allocation range")
        );
        assert!(
            invalid(decode("10.1.2.4", &pair("10.1.2.3", None, 65536)))
                .contains("does not match key: expected 10.1.2.4, got 10.1.2.3")
        );
        assert!(
            invalid(decode("10.1.2.3/32", &pair("10.1.2.3", None, 65536)))
                .contains("does not match key")
        );
        assert!(
            invalid(decode(
                "10.1.0.0",
                &pair("10.1.0.0", Some(&[255, 255, 0, 0]), 65536)
            ))
            .contains("does not match key")
        );
        assert!(
            invalid(decode(
                "10.1.0.0/16",
                &pair("10.1.0.0", Some(&[255, 0, 255, 0]), 65536)
            ))
            .contains("not canonical")
        );
        assert!(
            invalid(decode(
                "10.1.0.0/16",
                &pair("10.1.0.0", Some(&[255; 16]), 65536)
            ))
            .contains("does not fit")
        );
        assert!(
            invalid(decode(
                "fd00::/16",
                &pair("fd00::", Some(&[255, 255, 0, 0]), 65536)
            ))
            .contains("does not fit")
        );
        assert!(
            invalid(decode("10.1.0.0/0", &pair("10.1.0.0", Some(&[]), 65536)))
                .contains("does not fit")
        );
        assert!(invalid(decoder.decode("", br#"{"ID":65536}"#)).contains("IP is missing"));
        assert!(invalid(decoder.decode("", br#"{"IP":"","ID":65536}"#)).contains("IP is missing"));

        for (ip, mask, key) in [
            ("0.0.0.0", Some(0u8), "0.0.0.0/0"),
            ("255.255.255.255", None, "255.255.255.255"),
            ("1.20.100.9", Some(32), "1.20.100.9/32"),
        ] {
            let p = IpIdentityPair {
                ip: Some(ip.parse().unwrap()),
                mask: mask.map(|m| IpMask::cidr(m, 32).unwrap()),
                ..Default::default()
            };
            assert!(key_matches(&p, key), "{key}");
            assert_eq!(p.key_name(), key);
            assert!(
                !key_matches(&p, &format!("{key} ")) && !key_matches(&p, &key[..key.len() - 1])
            );
        }
        // Non-canonical IPv6 text in the key never matches Go's PrefixString.
        assert!(
            invalid(decode("FD00::1", &pair("fd00::1", None, 65536)))
                .contains("does not match key")
        );
        // Any cluster's identities pass while the remote ID is unknown.
        assert!(
            IpCacheDecoder::new(None)
                .decode("10.1.2.3", &pair("10.1.2.3", None, 5 << 16).to_json())
                .is_ok()
        );
        let wide = IpCacheDecoder::new(Some(3)).with_max_connected_clusters(511);
        assert!(
            wide.decode("10.1.2.3", &pair("10.1.2.3", None, 3 << 15).to_json())
                .is_ok()
        );

        for bad in [
            r#"{"IP":"10.1.2.300","ID":65536}"#,
            r#"{"IP":"10.1.2.3","Mask":"***","ID":65536}"#,
            r#"{"IP":"10.1.2.3","Key":256}"#,
        ] {
            assert!(
                matches!(
                    decoder.decode("10.1.2.3", bad.as_bytes()),
                    Err(DecodeError::Malformed(_))
                ),
                "{bad}"
            );
        }
    }
}
