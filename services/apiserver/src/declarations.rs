//! The services declared to the apiserver, kept in its etcd so that a restart keeps them:
//! `meshwork/apiserver/v1/<cluster>/services/<namespace>/<name>` holds the declaration as the
//! operator sent it (a protobuf `meshwork.apiserver.v1.Service`), without a lease — it is
//! configuration, not published state, and no remote cluster reads it (it is outside
//! `cilium/`). The shared-service keys remote clusters read are derived from these.

use meshwork_kvstore::{EtcdBackend, KvstoreError};
use meshwork_proto::apiserver::v1 as pb;
use prost::Message as _;

use crate::state::ServiceSpec;
use crate::validate;

/// Where `cluster`'s declarations live (ends in `/`).
pub fn prefix(cluster: &str) -> String {
    format!("meshwork/apiserver/v1/{cluster}/services/")
}

/// The key of one declaration.
pub fn key(cluster: &str, namespace: &str, name: &str) -> String {
    format!("{}{namespace}/{name}", prefix(cluster))
}

/// The declaration as the API carries it.
pub fn to_proto(spec: &ServiceSpec) -> pb::Service {
    pb::Service {
        namespace: spec.namespace.clone(),
        name: spec.name.clone(),
        frontends: spec.frontends.iter().map(ToString::to_string).collect(),
        ports: spec
            .ports
            .iter()
            .map(|(name, l4)| pb::NamedPort {
                name: name.clone(),
                port: u32::from(l4.port),
                protocol: l4.protocol.as_str().to_owned(),
            })
            .collect(),
        selector: spec.selector.iter().map(ToString::to_string).collect(),
        shared: spec.shared,
    }
}

/// The stored value of `spec`.
pub fn encode(spec: &ServiceSpec) -> Vec<u8> {
    to_proto(spec).encode_to_vec()
}

/// The declarations stored for `cluster`, each checked as a `PutService` is. One that does
/// not decode or validate is named in the log and left where it is (nothing is deleted).
pub async fn load(backend: &EtcdBackend, cluster: &str) -> Result<Vec<ServiceSpec>, KvstoreError> {
    let mut specs = Vec::new();
    let mut pages = backend.list(&prefix(cluster), 1000);
    while let Some(page) = pages.recv().await {
        for kv in page?.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            match decode(kv.value()) {
                Ok(spec) => specs.push(spec),
                Err(err) => {
                    tracing::warn!(%key, %err, "a stored service declaration is unusable; left as it is");
                }
            }
        }
    }
    Ok(specs)
}

fn decode(value: &[u8]) -> Result<ServiceSpec, String> {
    let service = pb::Service::decode(value).map_err(|e| format!("not a protobuf Service: {e}"))?;
    validate::service(&service).map_err(|e| e.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_declaration_round_trips_and_a_bad_one_is_named() {
        let service = pb::Service {
            namespace: "default".to_owned(),
            name: "web".to_owned(),
            frontends: vec!["10.96.0.10".to_owned()],
            ports: vec![pb::NamedPort {
                name: "http".to_owned(),
                port: 80,
                protocol: "TCP".to_owned(),
            }],
            selector: vec!["k8s:app=web".to_owned()],
            shared: true,
        };
        let spec = validate::service(&service).unwrap();
        assert_eq!(decode(&encode(&spec)).unwrap(), spec);
        assert_eq!(to_proto(&spec), service);
        let bad = pb::Service {
            frontends: vec!["nope".to_owned()],
            ..service
        };
        let err = decode(&bad.encode_to_vec()).unwrap_err();
        assert!(err.contains("\"nope\""), "{err}");
        assert!(
            decode(b"\xff\xff")
                .unwrap_err()
                .starts_with("not a protobuf Service")
        );
        assert_eq!(
            key("c1", "default", "web"),
            "meshwork/apiserver/v1/c1/services/default/web"
        );
    }
}
