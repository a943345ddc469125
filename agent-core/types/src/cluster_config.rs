//! The cluster config (`cilium/cluster-config/<cluster>`) and the cluster name / ID rules.
//!
//! Go: `CiliumClusterConfig` in `pkg/clustermesh/types/types.go`. Every field is
//! `omitempty`, but Go ignores `omitempty` on struct fields, so `capabilities` is always
//! written: a config with only an ID is `{"id":1,"capabilities":{}}`.

use crate::{DecodeError, Decoder, keys};

use super::go_json::{OmitEmpty, Plain, go_struct};

/// The default `--max-connected-clusters`.
pub const DEFAULT_MAX_CONNECTED_CLUSTERS: u32 = 255;
/// The only other supported `--max-connected-clusters`.
pub const EXTENDED_MAX_CONNECTED_CLUSTERS: u32 = 511;
/// Longest valid cluster name.
pub const CLUSTER_NAME_MAX_LEN: usize = 32;

go_struct! {
    /// A cluster's config as published in the kvstore.
    pub struct ClusterConfig {
        /// The cluster ID (`id`, omitted when 0).
        pub id: u32 => "id" as OmitEmpty<Plain>,
        /// What the cluster's kvstore supports (`capabilities`, always written).
        pub capabilities: ClusterConfigCapabilities => "capabilities",
    }
}

go_struct! {
    /// The capabilities of a cluster config; every field is omitted when zero.
    pub struct ClusterConfigCapabilities {
        /// Per-prefix "synced" canaries are written (`syncedCanaries`).
        pub synced_canaries: bool => "syncedCanaries" as OmitEmpty<Plain>,
        /// Data is cached by kvstoremesh under `cilium/cache/…` (`cached`).
        pub cached: bool => "cached" as OmitEmpty<Plain>,
        /// The cluster's `--max-connected-clusters` (`maxConnectedClusters`, 0 = unset).
        pub max_connected_clusters: u32 => "maxConnectedClusters" as OmitEmpty<Plain>,
        /// MCS-API ServiceExports enabled (`serviceExportsEnabled`); `None` = not supported.
        pub service_exports_enabled: Option<bool> => "serviceExportsEnabled" as OmitEmpty<Plain>,
    }
}

/// A cluster name, ID or config that breaks Cilium's rules (messages follow Cilium's).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterConfigError {
    /// Empty cluster name.
    #[error("invalid cluster name: must not be empty")]
    EmptyName,
    /// Cluster name longer than [`CLUSTER_NAME_MAX_LEN`].
    #[error("invalid cluster name {0:?}: must not be more than {CLUSTER_NAME_MAX_LEN} characters")]
    NameTooLong(String),
    /// Cluster name with characters outside `^([a-z0-9][-a-z0-9]*)?[a-z0-9]$`.
    #[error(
        "invalid cluster name {0:?}: must consist of lower case alphanumeric characters and '-', \
         and must start and end with an alphanumeric character"
    )]
    NameSyntax(String),
    /// `--max-connected-clusters` other than 255 or 511.
    #[error("max-connected-clusters={0} is invalid; supported values are [255, 511]")]
    InvalidMaxConnectedClusters(u32),
    /// Cluster ID 0.
    #[error("ClusterID 0 is reserved")]
    ReservedClusterId,
    /// Cluster ID above the maximum.
    #[error("ClusterID {id} is not supported: ClusterID > {max} is not supported")]
    ClusterIdTooLarge {
        /// The rejected ID.
        id: u32,
        /// The configured maximum.
        max: u32,
    },
    /// In 511 mode both sides must run with the same maximum.
    #[error("mismatched MaxConnectedClusters; local={local}, remote={remote}")]
    MismatchedMaxConnectedClusters {
        /// Our `--max-connected-clusters`.
        local: u32,
        /// The remote config's `maxConnectedClusters`.
        remote: u32,
    },
}

/// Checks a cluster name: 1 to 32 characters matching `^([a-z0-9][-a-z0-9]*)?[a-z0-9]$`.
pub fn validate_cluster_name(name: &str) -> Result<(), ClusterConfigError> {
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = name.as_bytes();
    let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
        return Err(ClusterConfigError::EmptyName);
    };
    if bytes.len() > CLUSTER_NAME_MAX_LEN {
        return Err(ClusterConfigError::NameTooLong(name.to_owned()));
    }
    if !alnum(first) || !alnum(last) || !bytes.iter().all(|b| alnum(b) || *b == b'-') {
        return Err(ClusterConfigError::NameSyntax(name.to_owned()));
    }
    Ok(())
}

/// Checks a `--max-connected-clusters` value: 255 or 511.
pub fn validate_max_connected_clusters(
    max_connected_clusters: u32,
) -> Result<(), ClusterConfigError> {
    match max_connected_clusters {
        DEFAULT_MAX_CONNECTED_CLUSTERS | EXTENDED_MAX_CONNECTED_CLUSTERS => Ok(()),
        other => Err(ClusterConfigError::InvalidMaxConnectedClusters(other)),
    }
}

/// Checks a cluster ID: `max_connected_clusters` must be 255 or 511 and the ID in
/// `1..=max_connected_clusters`.
pub fn validate_cluster_id(id: u32, max_connected_clusters: u32) -> Result<(), ClusterConfigError> {
    validate_max_connected_clusters(max_connected_clusters)?;
    match id {
        0 => Err(ClusterConfigError::ReservedClusterId),
        id if id > max_connected_clusters => Err(ClusterConfigError::ClusterIdTooLarge {
            id,
            max: max_connected_clusters,
        }),
        _ => Ok(()),
    }
}

impl ClusterConfig {
    /// The kvstore key of cluster `cluster_name`'s config.
    pub fn key(cluster_name: &str) -> String {
        format!("{}/{cluster_name}", keys::CLUSTER_CONFIG_PREFIX)
    }

    /// Validates a remote cluster's config against ours, as Cilium's `ValidateRemoteConfig`:
    /// the ID is valid for our maximum, and in 511 mode the remote runs with the same maximum.
    pub fn validate_remote(
        &self,
        local_max_connected_clusters: u32,
    ) -> Result<(), ClusterConfigError> {
        validate_cluster_id(self.id, local_max_connected_clusters)?;
        let remote = self.capabilities.max_connected_clusters;
        if local_max_connected_clusters != DEFAULT_MAX_CONNECTED_CLUSTERS
            && remote != local_max_connected_clusters
        {
            return Err(ClusterConfigError::MismatchedMaxConnectedClusters {
                local: local_max_connected_clusters,
                remote,
            });
        }
        Ok(())
    }
}

/// Decodes and validates (with [`ClusterConfig::validate_remote`]) a remote cluster's config;
/// the key is the cluster name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterConfigDecoder {
    /// Our `--max-connected-clusters`.
    pub max_connected_clusters: u32,
}

impl Default for ClusterConfigDecoder {
    fn default() -> Self {
        Self {
            max_connected_clusters: DEFAULT_MAX_CONNECTED_CLUSTERS,
        }
    }
}

impl Decoder for ClusterConfigDecoder {
    type Value = ClusterConfig;

    fn decode(&self, key: &str, value: &[u8]) -> Result<ClusterConfig, DecodeError> {
        let config = ClusterConfig::from_json(value)?;
        config
            .validate_remote(self.max_connected_clusters)
            .map_err(|err| DecodeError::Invalid(format!("cluster config of {key}: {err}")))?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(max: u32) -> ClusterConfigCapabilities {
        ClusterConfigCapabilities {
            max_connected_clusters: max,
            ..Default::default()
        }
    }

    #[test]
    fn encodes_like_go() {
        let config = ClusterConfig {
            id: 3,
            capabilities: ClusterConfigCapabilities {
                synced_canaries: true,
                cached: false,
                max_connected_clusters: 255,
                service_exports_enabled: None,
            },
        };
        assert_eq!(
            config.to_json(),
            br#"{"id":3,"capabilities":{"syncedCanaries":true,"maxConnectedClusters":255}}"#
        );
        assert_eq!(
            ClusterConfig::default().to_json(),
            br#"{"capabilities":{}}"#
        );
        let exports = ClusterConfig {
            id: 1,
            capabilities: ClusterConfigCapabilities {
                service_exports_enabled: Some(false),
                ..caps(0)
            },
        };
        assert_eq!(
            exports.to_json(),
            br#"{"id":1,"capabilities":{"serviceExportsEnabled":false}}"#
        );
        assert_eq!(
            ClusterConfig::from_json(&exports.to_json()).unwrap(),
            exports
        );
    }

    #[test]
    fn decodes_any_case_and_ignores_unknown() {
        let config = ClusterConfig::from_json(
            br#"{"ID":7,"Capabilities":{"SyncedCanaries":true,"CACHED":true,"maxconnectedclusters":511,"future":1},"extra":[]}"#,
        )
        .unwrap();
        assert_eq!(config.id, 7);
        assert!(config.capabilities.synced_canaries && config.capabilities.cached);
        assert_eq!(config.capabilities.max_connected_clusters, 511);
        assert_eq!(
            ClusterConfig::from_json(br#"{"id":1,"capabilities":null}"#)
                .unwrap()
                .capabilities,
            caps(0)
        );
    }

    #[test]
    fn cluster_names() {
        for ok in [
            "a",
            "0",
            "cluster1",
            "c-1",
            "a-b-c",
            "a--b",
            &"x".repeat(32),
        ] {
            assert_eq!(validate_cluster_name(ok), Ok(()), "{ok}");
        }
        assert_eq!(
            validate_cluster_name(""),
            Err(ClusterConfigError::EmptyName)
        );
        assert!(matches!(
            validate_cluster_name(&"x".repeat(33)),
            Err(ClusterConfigError::NameTooLong(_))
        ));
        for bad in [
            "-a",
            "a-",
            "-",
            "A",
            "cluster_1",
            "c.1",
            "c 1",
            "é",
            "a\n",
            "default/x",
        ] {
            assert!(
                matches!(
                    validate_cluster_name(bad),
                    Err(ClusterConfigError::NameSyntax(_))
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn cluster_ids() {
        let table: &[(u32, u32, Result<(), ClusterConfigError>)] = &[
            (1, 255, Ok(())),
            (255, 255, Ok(())),
            (256, 511, Ok(())),
            (511, 511, Ok(())),
            (0, 255, Err(ClusterConfigError::ReservedClusterId)),
            (0, 511, Err(ClusterConfigError::ReservedClusterId)),
            (
                256,
                255,
                Err(ClusterConfigError::ClusterIdTooLarge { id: 256, max: 255 }),
            ),
            (
                512,
                511,
                Err(ClusterConfigError::ClusterIdTooLarge { id: 512, max: 511 }),
            ),
            (
                1,
                0,
                Err(ClusterConfigError::InvalidMaxConnectedClusters(0)),
            ),
            (
                1,
                127,
                Err(ClusterConfigError::InvalidMaxConnectedClusters(127)),
            ),
            (
                1,
                1023,
                Err(ClusterConfigError::InvalidMaxConnectedClusters(1023)),
            ),
        ];
        for (id, max, expected) in table {
            assert_eq!(
                &validate_cluster_id(*id, *max),
                expected,
                "id {id} max {max}"
            );
        }
    }

    #[test]
    fn remote_config_validation() {
        let remote = |id, max| ClusterConfig {
            id,
            capabilities: caps(max),
        };
        assert_eq!(remote(5, 0).validate_remote(255), Ok(()));
        assert_eq!(
            remote(5, 511).validate_remote(255),
            Ok(()),
            "only checked in 511 mode"
        );
        assert_eq!(remote(300, 511).validate_remote(511), Ok(()));
        assert_eq!(
            remote(5, 255).validate_remote(511),
            Err(ClusterConfigError::MismatchedMaxConnectedClusters {
                local: 511,
                remote: 255
            })
        );
        assert_eq!(
            remote(0, 255).validate_remote(255),
            Err(ClusterConfigError::ReservedClusterId)
        );

        let decoder = ClusterConfigDecoder::default();
        assert!(decoder.decode("c1", br#"{"id":4}"#).is_ok());
        assert!(matches!(
            decoder.decode("c1", br#"{"id":256}"#),
            Err(DecodeError::Invalid(_))
        ));
        assert!(matches!(
            decoder.decode("c1", br#"{"id":"x"}"#),
            Err(DecodeError::Malformed(_))
        ));
    }
}
