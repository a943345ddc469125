//! Security identities: key `cilium/state/identities/v1/id/<numeric id>`, value the labels in
//! kvstore form (see [`Labels`]).
//!
//! Remote validation follows Cilium's remote identity cache (`clusterIDValidator`,
//! `clusterNameValidator`): the ID lies in the remote cluster's allocation range and the labels
//! carry `k8s:io.cilium.k8s.policy.cluster=<remote name>`.

use std::ops::RangeInclusive;

use crate::{DecodeError, Decoder};

use super::cluster_config::DEFAULT_MAX_CONNECTED_CLUSTERS;
use super::labels::{LABEL_SOURCE_K8S, Labels, POLICY_LABEL_CLUSTER};

/// Identities below this are reserved / well-known and not scoped by cluster ID.
pub const MINIMAL_NUMERIC_IDENTITY: u32 = 256;
/// Bits of a numeric identity shared between cluster ID and cluster-local identity.
const NUMERIC_IDENTITY_BITS: u32 = 24;

/// Bits a cluster ID is shifted by inside a numeric identity: 16 with 255 connected clusters,
/// 15 with 511 (`24 - log2(max + 1)`).
pub fn cluster_id_shift(max_connected_clusters: u32) -> u32 {
    let cluster_bits = (u64::from(max_connected_clusters) + 1).ilog2();
    NUMERIC_IDENTITY_BITS.saturating_sub(cluster_bits)
}

/// The numeric identities cluster `cluster_id` allocates from: `[id << shift, ((id + 1) << shift)
/// - 1]`, i.e. `[id<<16, (id<<16)+65535]` by default; cluster 0 starts at
/// [`MINIMAL_NUMERIC_IDENTITY`].
pub fn identity_range(cluster_id: u32, max_connected_clusters: u32) -> RangeInclusive<u32> {
    let shift = cluster_id_shift(max_connected_clusters);
    let start = if cluster_id == 0 {
        MINIMAL_NUMERIC_IDENTITY
    } else {
        cluster_id << shift
    };
    let end = ((u64::from(cluster_id) + 1) << shift) - 1;
    start..=u32::try_from(end).unwrap_or(u32::MAX)
}

/// A security identity: its numeric ID and labels.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Identity {
    /// The numeric identity (the key).
    pub id: u32,
    /// The labels (the value).
    pub labels: Labels,
}

impl Identity {
    /// The key relative to [`IDENTITY_ID_PREFIX`](crate::keys::IDENTITY_ID_PREFIX).
    pub fn key_name(&self) -> String {
        self.id.to_string()
    }

    /// The value as written to the kvstore.
    pub fn value(&self) -> Vec<u8> {
        self.labels.to_kvstore_string().into_bytes()
    }
}

/// Reads identities of one remote cluster; key = numeric ID, value = labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityDecoder {
    /// The remote cluster's name, required in the cluster label.
    pub cluster_name: String,
    /// The remote cluster's ID once its config is known; enables the range check.
    pub cluster_id: Option<u32>,
    /// Our `--max-connected-clusters` (255 or 511), which sets the range width.
    pub max_connected_clusters: u32,
}

impl IdentityDecoder {
    /// A decoder for cluster `cluster_name` (ID if known), with 255 connected clusters.
    pub fn new(cluster_name: impl Into<String>, cluster_id: Option<u32>) -> Self {
        Self {
            cluster_name: cluster_name.into(),
            cluster_id,
            max_connected_clusters: DEFAULT_MAX_CONNECTED_CLUSTERS,
        }
    }

    /// Sets `--max-connected-clusters`.
    pub fn with_max_connected_clusters(mut self, max_connected_clusters: u32) -> Self {
        self.max_connected_clusters = max_connected_clusters;
        self
    }
}

/// Parses a numeric identity key: decimal digits only (Go's `strconv.ParseUint`, base 10).
fn parse_numeric_id(key: &str) -> Option<u32> {
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    key.parse().ok()
}

impl Decoder for IdentityDecoder {
    type Value = Identity;

    fn decode(&self, key: &str, value: &[u8]) -> Result<Identity, DecodeError> {
        let id = parse_numeric_id(key).ok_or_else(|| {
            DecodeError::Invalid(format!("identity key {key:?} is not a numeric identity"))
        })?;
        if let Some(cluster_id) = self.cluster_id
            && !identity_range(cluster_id, self.max_connected_clusters).contains(&id)
        {
            return Err(DecodeError::Invalid(format!(
                "ID {id} does not belong to the allocation range of cluster ID {cluster_id}"
            )));
        }
        let text = std::str::from_utf8(value).map_err(|err| {
            DecodeError::Malformed(format!("identity {id}: labels are not UTF-8: {err}"))
        })?;
        let labels = Labels::parse_kvstore(text);
        match labels.get(POLICY_LABEL_CLUSTER) {
            None => {
                return Err(DecodeError::Invalid(format!(
                    "identity {id}: could not find expected label {POLICY_LABEL_CLUSTER}"
                )));
            }
            Some(label) if label.source() != LABEL_SOURCE_K8S => {
                return Err(DecodeError::Invalid(format!(
                    "identity {id}: unexpected source for cluster label: got {}, expected {LABEL_SOURCE_K8S}",
                    label.source()
                )));
            }
            Some(label) if label.value() != self.cluster_name => {
                return Err(DecodeError::Invalid(format!(
                    "identity {id}: unexpected cluster name: got {}, expected {}",
                    label.value(),
                    self.cluster_name
                )));
            }
            Some(_) => {}
        }
        Ok(Identity { id, labels })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALUE: &[u8] =
        b"k8s:app=foo;k8s:io.cilium.k8s.policy.cluster=c1;k8s:io.kubernetes.pod.namespace=default;";

    fn invalid(result: Result<Identity, DecodeError>) -> String {
        match result {
            Err(DecodeError::Invalid(message)) => message,
            other => panic!("expected an invalid entry, got {other:?}"),
        }
    }

    #[test]
    fn ranges() {
        assert_eq!(cluster_id_shift(255), 16);
        assert_eq!(cluster_id_shift(511), 15);
        assert_eq!(identity_range(1, 255), 65536..=131071);
        assert_eq!(identity_range(255, 255), 255 << 16..=(255 << 16) + 65535);
        assert_eq!(identity_range(1, 511), 32768..=65535);
        assert_eq!(identity_range(511, 511), 511 << 15..=(512 << 15) - 1);
        assert_eq!(identity_range(0, 255), 256..=65535);
    }

    #[test]
    fn decodes_and_reencodes() {
        let decoder = IdentityDecoder::new("c1", Some(1));
        let identity = decoder.decode("65536", VALUE).unwrap();
        assert_eq!(identity.id, 65536);
        assert_eq!(identity.labels.get("app").unwrap().value(), "foo");
        assert_eq!(identity.value(), VALUE);
        assert_eq!(identity.key_name(), "65536");
        // Without a known cluster ID only the labels are checked.
        assert!(IdentityDecoder::new("c1", None).decode("7", VALUE).is_ok());
    }

    #[test]
    fn range_check() {
        let decoder = IdentityDecoder::new("c1", Some(1));
        assert!(decoder.decode("131071", VALUE).is_ok());
        assert!(
            invalid(decoder.decode("65535", VALUE)).contains("allocation range of cluster ID 1")
        );
        assert!(invalid(decoder.decode("131072", VALUE)).contains("allocation range"));
        assert!(invalid(decoder.decode("5", VALUE)).contains("allocation range"));
        let wide = IdentityDecoder::new("c1", Some(3)).with_max_connected_clusters(511);
        assert!(wide.decode(&(3 << 15).to_string(), VALUE).is_ok());
        assert!(wide.decode(&(3 << 16).to_string(), VALUE).is_err());
    }

    #[test]
    fn cluster_label_check() {
        let decoder = IdentityDecoder::new("c1", Some(1));
        let message = invalid(decoder.decode("65536", b"k8s:app=foo;"));
        assert!(
            message.contains("could not find expected label io.cilium.k8s.policy.cluster"),
            "{message}"
        );
        let message = invalid(decoder.decode("65536", b"k8s:io.cilium.k8s.policy.cluster=c2;"));
        assert!(
            message.contains("unexpected cluster name: got c2, expected c1"),
            "{message}"
        );
        let message = invalid(decoder.decode("65536", b"unspec:io.cilium.k8s.policy.cluster=c1;"));
        assert!(message.contains("unexpected source"), "{message}");
        invalid(decoder.decode("65536", b""));
    }

    #[test]
    fn key_check() {
        let decoder = IdentityDecoder::new("c1", None);
        for bad in ["", "abc", "+65536", "-1", "65536/x", "4294967296", " 1"] {
            assert!(
                invalid(decoder.decode(bad, VALUE)).contains("not a numeric identity"),
                "{bad:?}"
            );
        }
        assert!(matches!(
            decoder.decode("1", b"\xff"),
            Err(DecodeError::Malformed(_))
        ));
    }
}
