//! The local cluster's services, from the apiserver's publishing session to the map writer:
//! each set the apiserver sends (its declared services with their backends, shared or not)
//! becomes the cluster's `ClusterService`s, as remote clusters read the shared ones from etcd,
//! and replaces the writer's local services. The first set is the local state the first
//! prune pass waits for (§10).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use actix::Addr;
use meshwork_proto::apiserver::v1 as pb;
use meshwork_types::{ClusterService, L4Addr, L4Type, PortConfiguration};

use super::writer_actor::{DatapathWriter, LocalServices};
use crate::publisher::Publisher;

/// Forwards every set of local services `publisher` receives to `writer`, as the services of
/// cluster `cluster` (ID `cluster_id`), until the writer stops.
pub fn follow(publisher: &Publisher, writer: Addr<DatapathWriter>, cluster: &str, cluster_id: u32) {
    let mut sets = publisher.local_services();
    let cluster: Arc<str> = Arc::from(cluster);
    tokio::spawn(async move {
        loop {
            let set = sets.borrow_and_update().clone();
            if let Some(set) = set {
                let services = convert(&cluster, cluster_id, &set);
                let message = LocalServices {
                    cluster: cluster.clone(),
                    cluster_id,
                    services,
                };
                if writer.send(message).await.is_err() {
                    return;
                }
            }
            if sets.changed().await.is_err() {
                return;
            }
        }
    });
}

/// The services of `set` as cluster `cluster`'s `ClusterService`s. A port or address the
/// apiserver should not have accepted is left out with a warning (it validated them).
pub fn convert(
    cluster: &str,
    cluster_id: u32,
    set: &[pb::ServiceStatus],
) -> Vec<Arc<ClusterService>> {
    set.iter()
        .filter_map(|status| {
            let spec = status.service.as_ref()?;
            let ports: PortConfiguration = spec
                .ports
                .iter()
                .filter_map(|p| Some((p.name.clone(), l4(spec, p)?)))
                .collect();
            let by_ip = |ips: &[String]| -> BTreeMap<String, PortConfiguration> {
                ips.iter()
                    .filter(|ip| ip.parse::<IpAddr>().is_ok())
                    .map(|ip| (ip.clone(), ports.clone()))
                    .collect()
            };
            Some(Arc::new(ClusterService {
                cluster: cluster.to_owned(),
                namespace: spec.namespace.clone(),
                name: spec.name.clone(),
                frontends: by_ip(&spec.frontends),
                backends: by_ip(&status.backends),
                shared: spec.shared,
                cluster_id,
                ..ClusterService::default()
            }))
        })
        .collect()
}

fn l4(spec: &pb::Service, port: &pb::NamedPort) -> Option<L4Addr> {
    let protocol = match port.protocol.as_str() {
        "TCP" => L4Type::Tcp,
        "UDP" => L4Type::Udp,
        "SCTP" => L4Type::Sctp,
        other => {
            tracing::warn!(service = %spec.name, protocol = other, "local service port with an unknown protocol left out");
            return None;
        }
    };
    let Ok(number) = u16::try_from(port.port) else {
        tracing::warn!(service = %spec.name, port = port.port, "local service port out of range left out");
        return None;
    };
    Some(L4Addr {
        protocol,
        port: number,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(name: &str, shared: bool, backends: &[&str]) -> pb::ServiceStatus {
        pb::ServiceStatus {
            service: Some(pb::Service {
                namespace: "default".into(),
                name: name.into(),
                frontends: vec!["10.214.240.1".into(), "not an ip".into()],
                ports: vec![
                    pb::NamedPort {
                        name: "http".into(),
                        port: 80,
                        protocol: "TCP".into(),
                    },
                    pb::NamedPort {
                        name: "odd".into(),
                        port: 70_000,
                        protocol: "TCP".into(),
                    },
                ],
                selector: vec!["k8s:app=web".into()],
                shared,
            }),
            backends: backends.iter().map(|b| (*b).to_owned()).collect(),
        }
    }

    #[test]
    fn a_set_becomes_the_clusters_services_with_their_ports_on_every_address() {
        let services = convert(
            "c1",
            1,
            &[
                status("web", false, &["10.214.1.10", "10.214.2.10"]),
                status("api", true, &[]),
            ],
        );
        assert_eq!(services.len(), 2);
        let web = &services[0];
        assert_eq!((web.cluster.as_str(), web.cluster_id), ("c1", 1));
        assert_eq!(web.namespaced_name(), "default/web");
        assert!(!web.shared);
        assert!(services[1].shared);
        let http = L4Addr {
            protocol: L4Type::Tcp,
            port: 80,
        };
        let ports: PortConfiguration = [("http".to_owned(), http)].into();
        // The unparsable frontend and the out-of-range port are left out.
        assert_eq!(
            web.frontends,
            [("10.214.240.1".to_owned(), ports.clone())].into()
        );
        assert_eq!(
            web.backends.keys().collect::<Vec<_>>(),
            ["10.214.1.10", "10.214.2.10"]
        );
        assert!(web.backends.values().all(|p| *p == ports));
    }
}
