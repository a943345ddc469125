//! Global services: key `cilium/state/services/v1/<cluster>/<namespace>/<name>`.
//!
//! Go: `ClusterService` in `pkg/clustermesh/store/store.go` (lower-camel JSON tags; `hostnames`
//! and `zones` are `omitempty`). Cilium builds it with `NewClusterService`, which allocates every
//! map, so empty maps are written as `{}`, not `null`. Ports are `loadbalancer.L4Addr`, which
//! has no tags: `{"Protocol":"TCP","Port":80}`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::{DecodeError, Decoder};

use super::cluster_config::DEFAULT_MAX_CONNECTED_CLUSTERS;
use super::go_json::{NullIfEmpty, OmitEmpty, Plain, go_string_enum, go_struct};

go_string_enum! {
    /// An L4 protocol (Go's `loadbalancer.L4Type`).
    pub enum L4Type {
        /// `TCP`.
        Tcp = "TCP",
        /// `UDP`.
        Udp = "UDP",
        /// `SCTP`.
        Sctp = "SCTP",
        /// `ANY`.
        Any = "ANY",
        /// `NONE` (older Cilium versions).
        NoProtocol = "NONE",
    }
}

go_struct! {
    /// A port and its protocol.
    pub struct L4Addr {
        /// The protocol (`Protocol`).
        pub protocol: L4Type => "Protocol",
        /// The port (`Port`).
        pub port: u16 => "Port",
    }
}

/// Ports of a frontend or backend by port name.
pub type PortConfiguration = BTreeMap<String, L4Addr>;

go_struct! {
    /// A zone that should consume a backend.
    pub struct ForZone {
        /// Zone name (`name`).
        pub name: String => "name",
    }
}

go_struct! {
    /// Where a backend is and which zones should use it (topology-aware routing).
    pub struct BackendZone {
        /// The backend's zone (`zone`).
        pub zone: String => "zone",
        /// Zones that should use the backend (`forZones`).
        pub for_zones: Vec<ForZone> => "forZones" as NullIfEmpty,
    }
}

go_struct! {
    /// A service of a cluster, as shared with the mesh.
    pub struct ClusterService {
        /// Cluster name (`cluster`).
        pub cluster: String => "cluster",
        /// Namespace (`namespace`).
        pub namespace: String => "namespace",
        /// Service name (`name`).
        pub name: String => "name",
        /// Ports by frontend IP (`frontends`).
        pub frontends: BTreeMap<String, PortConfiguration> => "frontends",
        /// Ports by backend IP (`backends`).
        pub backends: BTreeMap<String, PortConfiguration> => "backends",
        /// Hostnames by backend IP (`hostnames`, omitted when empty).
        pub hostnames: BTreeMap<String, String> => "hostnames" as OmitEmpty<Plain>,
        /// Zones by backend IP (`zones`, omitted when empty).
        pub zones: BTreeMap<String, BackendZone> => "zones" as OmitEmpty<Plain>,
        /// Service labels (`labels`).
        pub labels: BTreeMap<String, String> => "labels",
        /// Backend selector (`selector`).
        pub selector: BTreeMap<String, String> => "selector",
        /// Include backends of other clusters (`includeExternal`).
        pub include_external: bool => "includeExternal",
        /// Shared with other clusters (`shared`); only shared services are merged.
        pub shared: bool => "shared",
        /// Cluster ID (`clusterID`).
        pub cluster_id: u32 => "clusterID",
    }
}

impl ClusterService {
    /// The key relative to [`SERVICES_PREFIX`](crate::keys::SERVICES_PREFIX): `<cluster>/<namespace>/<name>`.
    pub fn key_name(&self) -> String {
        format!("{}/{}/{}", self.cluster, self.namespace, self.name)
    }

    /// `<namespace>/<name>`, the key relative to the cluster's prefix.
    pub fn namespaced_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Reads the services of one remote cluster (keys relative to
/// `cilium/state/services/v1/<cluster>/`, i.e. `<namespace>/<name>`), validated like Cilium's
/// `ClusterService.validate`, `ClusterNameValidator`, `NamespacedNameValidator` and
/// `ClusterIDValidator`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceDecoder {
    /// The remote cluster's name; services must carry it.
    pub cluster_name: String,
    /// The remote cluster's ID once its config is known; services must carry it.
    pub cluster_id: Option<u32>,
    /// Our `--max-connected-clusters`, bounding `clusterID` while the remote ID is unknown.
    pub max_connected_clusters: u32,
}

impl ServiceDecoder {
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

    fn check(&self, key: &str, svc: &ClusterService) -> Result<(), String> {
        if svc.cluster.is_empty() {
            return Err("cluster is unset".into());
        }
        if svc.namespace.is_empty() {
            return Err("namespace is unset".into());
        }
        if svc.name.is_empty() {
            return Err("name is unset".into());
        }
        match self.cluster_id {
            Some(expected) if svc.cluster_id != expected => {
                return Err(format!(
                    "unexpected cluster ID: got {}, expected {expected}",
                    svc.cluster_id
                ));
            }
            None if svc.cluster_id > self.max_connected_clusters => {
                return Err(format!(
                    "ClusterID > {} is not supported",
                    self.max_connected_clusters
                ));
            }
            _ => {}
        }
        // Go's netip.ParseAddr, which (like Rust) rejects zones.
        for (kind, map) in [("frontend", &svc.frontends), ("backend", &svc.backends)] {
            if let Some(bad) = map
                .keys()
                .find(|address| address.parse::<IpAddr>().is_err())
            {
                return Err(format!("invalid {kind} IP address {bad:?}"));
            }
        }
        if svc.cluster != self.cluster_name {
            return Err(format!(
                "unexpected cluster name: got {}, expected {}",
                svc.cluster, self.cluster_name
            ));
        }
        let namespaced = svc.namespaced_name();
        if namespaced != key {
            return Err(format!(
                "namespaced name does not match key: got {namespaced}, expected {key}"
            ));
        }
        Ok(())
    }
}

impl Decoder for ServiceDecoder {
    type Value = ClusterService;

    fn decode(&self, key: &str, value: &[u8]) -> Result<ClusterService, DecodeError> {
        let svc = ClusterService::from_json(value)?;
        self.check(key, &svc)
            .map_err(|message| DecodeError::Invalid(format!("service {key}: {message}")))?;
        Ok(svc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shared service as Go's `json.Marshal` writes it (maps sorted, `hostnames` present,
    /// `zones` omitted).
    const GO_SERVICE: &str = concat!(
        r#"{"cluster":"c1","namespace":"default","name":"foo","#,
        r#""frontends":{"10.96.0.10":{"http":{"Protocol":"TCP","Port":80}},"fd00::a":{"http":{"Protocol":"TCP","Port":80}}},"#,
        r#""backends":{"10.0.1.5":{"http":{"Protocol":"TCP","Port":8080}}},"hostnames":{"10.0.1.5":"pod-0"},"#,
        r#""labels":{},"selector":{"app":"foo"},"includeExternal":true,"shared":true,"clusterID":1}"#
    );

    fn invalid(result: Result<ClusterService, DecodeError>) -> String {
        match result {
            Err(DecodeError::Invalid(message)) => message,
            other => panic!("expected an invalid entry, got {other:?}"),
        }
    }

    #[test]
    fn decodes_go_json_and_reencodes_byte_exact() {
        let svc = ClusterService::from_json(GO_SERVICE.as_bytes()).unwrap();
        assert_eq!(svc.key_name(), "c1/default/foo");
        assert_eq!(
            svc.frontends["10.96.0.10"]["http"],
            L4Addr {
                protocol: L4Type::Tcp,
                port: 80
            }
        );
        assert_eq!(svc.backends["10.0.1.5"]["http"].port, 8080);
        assert!(svc.shared && svc.include_external);
        assert_eq!(String::from_utf8(svc.to_json()).unwrap(), GO_SERVICE);
        assert_eq!(ClusterService::from_json(&svc.to_json()).unwrap(), svc);
    }

    #[test]
    fn encodes_empty_service_like_new_cluster_service() {
        let svc = ClusterService {
            cluster: "c".into(),
            namespace: "ns".into(),
            name: "n".into(),
            ..Default::default()
        };
        assert_eq!(
            svc.to_json(),
            br#"{"cluster":"c","namespace":"ns","name":"n","frontends":{},"backends":{},"labels":{},"selector":{},"includeExternal":false,"shared":false,"clusterID":0}"#
        );
        let zoned = ClusterService {
            zones: [(
                "10.0.0.1".to_owned(),
                BackendZone {
                    zone: "a".into(),
                    for_zones: vec![ForZone { name: "a".into() }],
                },
            )]
            .into(),
            ..svc
        };
        let json = String::from_utf8(zoned.to_json()).unwrap();
        assert!(
            json.contains(r#""zones":{"10.0.0.1":{"zone":"a","forZones":[{"name":"a"}]}}"#),
            "{json}"
        );
    }

    #[test]
    fn decodes_cilium_test_json_with_lowercase_ports() {
        // From Cilium's clustermesh service tests: lower-case `protocol`/`port`, no clusterID.
        let json = r#"{"cluster":"c1","namespace":"default","name":"foo","frontends":{"172.20.0.177":{"port":{"protocol":"TCP","port":80}}},"backends":{"20.0.0.2":{"port":{"protocol":"TCP","port":8080}}},"labels":{},"selector":{"name":"foo"},"shared":true,"includeExternal":true}"#;
        let svc = ServiceDecoder::new("c1", None)
            .decode("default/foo", json.as_bytes())
            .unwrap();
        assert_eq!(
            svc.frontends["172.20.0.177"]["port"],
            L4Addr {
                protocol: L4Type::Tcp,
                port: 80
            }
        );
        assert_eq!(svc.cluster_id, 0);
        // Mixed-case top-level names, unknown fields, nulls.
        let svc = ClusterService::from_json(
            br#"{"Cluster":"c1","NAMESPACE":"ns","Name":"n","Frontends":null,"Shared":true,"ClusterId":3,"newField":[1]}"#,
        )
        .unwrap();
        assert_eq!(
            (
                svc.cluster.as_str(),
                svc.namespace.as_str(),
                svc.shared,
                svc.cluster_id
            ),
            ("c1", "ns", true, 3)
        );
        assert!(svc.frontends.is_empty());
    }

    #[test]
    fn decoder_validation() {
        let decoder = ServiceDecoder::new("c1", Some(1));
        assert!(decoder.decode("default/foo", GO_SERVICE.as_bytes()).is_ok());
        assert!(
            invalid(decoder.decode("default/bar", GO_SERVICE.as_bytes())).contains(
                "namespaced name does not match key: got default/foo, expected default/bar"
            )
        );
        assert!(
            invalid(decoder.decode("foo", GO_SERVICE.as_bytes())).contains("does not match key")
        );
        assert!(
            invalid(
                ServiceDecoder::new("c2", Some(1)).decode("default/foo", GO_SERVICE.as_bytes())
            )
            .contains("unexpected cluster name: got c1, expected c2")
        );
        assert!(
            invalid(
                ServiceDecoder::new("c1", Some(2)).decode("default/foo", GO_SERVICE.as_bytes())
            )
            .contains("unexpected cluster ID: got 1, expected 2")
        );

        let with = |patch: &str| {
            GO_SERVICE.replacen(
                r#""cluster":"c1","namespace":"default","name":"foo","#,
                patch,
                1,
            )
        };
        let message = invalid(decoder.decode(
            "default/foo",
            with(r#""cluster":"","namespace":"default","name":"foo","#).as_bytes(),
        ));
        assert!(message.contains("cluster is unset"), "{message}");
        let message = invalid(decoder.decode(
            "/foo",
            with(r#""cluster":"c1","namespace":"","name":"foo","#).as_bytes(),
        ));
        assert!(message.contains("namespace is unset"), "{message}");
        let message = invalid(decoder.decode(
            "default/",
            with(r#""cluster":"c1","namespace":"default","name":"","#).as_bytes(),
        ));
        assert!(message.contains("name is unset"), "{message}");

        for bad in ["invalid", "10.0.0.256", "fe80::1%eth0", "", "10.96.0.0/16"] {
            let json = GO_SERVICE.replace("10.96.0.10", bad);
            assert!(
                invalid(decoder.decode("default/foo", json.as_bytes()))
                    .contains("invalid frontend IP"),
                "{bad}"
            );
        }
        let json = GO_SERVICE.replace("10.0.1.5\":{", "nope\":{");
        assert!(
            invalid(decoder.decode("default/foo", json.as_bytes())).contains("invalid backend IP")
        );
        let json = GO_SERVICE.replace(r#""clusterID":1"#, r#""clusterID":260"#);
        assert!(
            invalid(ServiceDecoder::new("c1", None).decode("default/foo", json.as_bytes()))
                .contains("ClusterID > 255")
        );
        assert!(
            ServiceDecoder::new("c1", None)
                .with_max_connected_clusters(511)
                .decode("default/foo", json.as_bytes())
                .is_ok()
        );
        assert!(matches!(
            decoder.decode("default/foo", br#"{"frontends":[]}"#),
            Err(DecodeError::Malformed(_))
        ));
    }
}
