//! What the gRPC requests carry, checked and turned into the state's specs. A refusal names
//! the field and the value, and has a reason for `refused_requests_total`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use meshwork_proto::apiserver::v1 as pb;
use meshwork_types::validate_node_name;
use meshwork_types::{Address, AddressType, IpPrefix, L4Addr, L4Type, Label, NamedPort};

use crate::state::{EndpointSpec, NodeSpec, ServiceSpec};

/// A request that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Invalid {
    /// The metric label (`invalid_node_name`, `unparsable_ip`, …).
    pub reason: &'static str,
    /// What is wrong, naming the field and the value.
    pub message: String,
}

fn invalid(reason: &'static str, message: String) -> Invalid {
    Invalid { reason, message }
}

/// Checks a node name (a DNS-1123 subdomain).
pub fn node_name(name: &str) -> Result<(), Invalid> {
    validate_node_name(name)
        .map_err(|why| invalid("invalid_node_name", format!("node name {name:?}: {why}")))
}

fn ip(field: &str, text: &str) -> Result<IpAddr, Invalid> {
    text.parse().map_err(|_| {
        invalid(
            "unparsable_ip",
            format!("{field} {text:?} is not an IP address"),
        )
    })
}

fn optional_ip(field: &str, text: &str) -> Result<Option<IpAddr>, Invalid> {
    (!text.is_empty()).then(|| ip(field, text)).transpose()
}

fn cidr(field: &str, text: &str, ipv6: bool) -> Result<IpPrefix, Invalid> {
    let prefix: IpPrefix = text
        .parse()
        .map_err(|_| invalid("unparsable_cidr", format!("{field} {text:?} is not a CIDR")))?;
    if prefix.addr().is_ipv6() != ipv6 {
        let family = if ipv6 { "IPv6" } else { "IPv4" };
        return Err(invalid(
            "unparsable_cidr",
            format!("{field} {text:?} is not {family}"),
        ));
    }
    Ok(prefix)
}

/// A label `source:key=value`, with a source and a key.
pub fn label(field: &str, text: &str) -> Result<Label, Invalid> {
    Label::parse_strict(text).map_err(|_| {
        invalid(
            "invalid_label",
            format!("{field} {text:?} is not of the form source:key=value"),
        )
    })
}

fn protocol(field: &str, text: &str) -> Result<L4Type, Invalid> {
    match text {
        "TCP" => Ok(L4Type::Tcp),
        "UDP" => Ok(L4Type::Udp),
        "SCTP" => Ok(L4Type::Sctp),
        _ => Err(invalid(
            "invalid_port",
            format!("{field} protocol {text:?} is not TCP, UDP or SCTP"),
        )),
    }
}

fn port(field: &str, p: &pb::NamedPort) -> Result<(String, L4Addr), Invalid> {
    let number = u16::try_from(p.port)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| {
            invalid(
                "invalid_port",
                format!("{field} {:?}: port {} is not in 1..=65535", p.name, p.port),
            )
        })?;
    let protocol = protocol(field, &p.protocol)?;
    Ok((
        p.name.clone(),
        L4Addr {
            protocol,
            port: number,
        },
    ))
}

/// A node as an agent publishes it.
pub fn node(node: &pb::Node) -> Result<NodeSpec, Invalid> {
    node_name(&node.name)?;
    let addresses = node
        .addresses
        .iter()
        .map(|a| {
            let address_type = match a.r#type.as_str() {
                "InternalIP" => AddressType::InternalIp,
                "ExternalIP" => AddressType::ExternalIp,
                "Hostname" => AddressType::Hostname,
                "InternalDNS" => AddressType::InternalDns,
                "ExternalDNS" => AddressType::ExternalDns,
                "CiliumInternalIP" => AddressType::CiliumInternalIp,
                other => {
                    return Err(invalid(
                        "invalid_address_type",
                        format!("node address type {other:?} is not one of Cilium's"),
                    ));
                }
            };
            Ok(Address {
                address_type,
                ip: Some(ip("node address", &a.ip)?),
            })
        })
        .collect::<Result<_, _>>()?;
    let cidrs = |texts: &[String], ipv6| {
        texts
            .iter()
            .map(|t| cidr("pod CIDR", t, ipv6))
            .collect::<Result<Vec<_>, _>>()
    };
    Ok(NodeSpec {
        name: node.name.clone(),
        addresses,
        ipv4_cidrs: cidrs(&node.ipv4_alloc_cidrs, false)?,
        ipv6_cidrs: cidrs(&node.ipv6_alloc_cidrs, true)?,
        ipv4_health_ip: optional_ip("ipv4_health_ip", &node.ipv4_health_ip)?,
        ipv6_health_ip: optional_ip("ipv6_health_ip", &node.ipv6_health_ip)?,
        wireguard_public_key: node.wireguard_public_key.clone(),
        encryption_key: u8::try_from(node.encryption_key).map_err(|_| {
            invalid(
                "invalid_encryption_key",
                format!("encryption_key {} is not in 0..=255", node.encryption_key),
            )
        })?,
        labels: node.labels.clone().into_iter().collect::<BTreeMap<_, _>>(),
        eni_ipam: node.eni_ipam,
    })
}

/// An endpoint as an agent publishes it.
pub fn endpoint(endpoint: &pb::Endpoint) -> Result<EndpointSpec, Invalid> {
    if endpoint.id == 0 {
        return Err(invalid(
            "invalid_endpoint",
            "endpoint ID 0 is not valid".to_owned(),
        ));
    }
    if endpoint.ips.is_empty() {
        return Err(invalid(
            "invalid_endpoint",
            format!("endpoint {} has no IP", endpoint.id),
        ));
    }
    let field = format!("endpoint {}", endpoint.id);
    Ok(EndpointSpec {
        id: endpoint.id,
        ips: endpoint
            .ips
            .iter()
            .map(|t| ip(&format!("{field} IP"), t))
            .collect::<Result<_, _>>()?,
        labels: endpoint
            .labels
            .iter()
            .map(|t| label(&format!("{field} label"), t))
            .collect::<Result<_, _>>()?,
        named_ports: endpoint
            .named_ports
            .iter()
            .map(|p| {
                let (name, l4) = port(&format!("{field} named port"), p)?;
                Ok(NamedPort {
                    name,
                    port: l4.port,
                    protocol: p.protocol.clone(),
                })
            })
            .collect::<Result<_, Invalid>>()?,
        pod_namespace: endpoint.pod_namespace.clone(),
        pod_name: endpoint.pod_name.clone(),
    })
}

/// A service as an operator declares it.
pub fn service(service: &pb::Service) -> Result<ServiceSpec, Invalid> {
    namespaced_name(&service.namespace, &service.name)?;
    Ok(ServiceSpec {
        namespace: service.namespace.clone(),
        name: service.name.clone(),
        frontends: service
            .frontends
            .iter()
            .map(|t| ip("frontend", t))
            .collect::<Result<_, _>>()?,
        ports: service
            .ports
            .iter()
            .map(|p| port("service port", p))
            .collect::<Result<_, _>>()?,
        selector: service
            .selector
            .iter()
            .map(|t| label("selector label", t))
            .collect::<Result<_, _>>()?,
        shared: service.shared,
    })
}

/// Checks a service's namespace and name (DNS-1123 labels, as Kubernetes' are).
pub fn namespaced_name(namespace: &str, name: &str) -> Result<(), Invalid> {
    for (what, text) in [("namespace", namespace), ("service name", name)] {
        if text.contains('.') || validate_node_name(text).is_err() || text.len() > 63 {
            return Err(invalid(
                "invalid_service_name",
                format!("{what} {text:?} is not a DNS-1123 label"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pb_node() -> pb::Node {
        pb::Node {
            name: "n1".to_owned(),
            addresses: vec![pb::NodeAddress {
                r#type: "InternalIP".to_owned(),
                ip: "192.0.2.1".to_owned(),
            }],
            ipv4_alloc_cidrs: vec!["10.1.1.0/24".to_owned()],
            ..pb::Node::default()
        }
    }

    #[test]
    fn a_good_node_and_endpoint_become_specs() {
        let spec = node(&pb_node()).unwrap();
        assert_eq!(spec.ipv4_cidrs[0].to_string(), "10.1.1.0/24");
        let ep = endpoint(&pb::Endpoint {
            id: 3,
            ips: vec!["10.1.1.3".to_owned()],
            labels: vec!["k8s:app=web".to_owned()],
            named_ports: vec![pb::NamedPort {
                name: "http".to_owned(),
                port: 80,
                protocol: "TCP".to_owned(),
            }],
            ..pb::Endpoint::default()
        })
        .unwrap();
        assert_eq!(ep.labels[0].key(), "app");
        assert_eq!(ep.named_ports[0].port, 80);
    }

    #[test]
    fn each_bad_field_is_refused_with_its_reason_and_value() {
        let cases: Vec<(pb::Node, &str, &str)> = vec![
            (
                pb::Node {
                    name: "N_1".to_owned(),
                    ..pb_node()
                },
                "invalid_node_name",
                "\"N_1\"",
            ),
            (
                pb::Node {
                    ipv4_alloc_cidrs: vec!["10.1.1.0/33".to_owned()],
                    ..pb_node()
                },
                "unparsable_cidr",
                "10.1.1.0/33",
            ),
            (
                pb::Node {
                    ipv4_alloc_cidrs: vec!["fd00::/64".to_owned()],
                    ..pb_node()
                },
                "unparsable_cidr",
                "is not IPv4",
            ),
            (
                pb::Node {
                    addresses: vec![pb::NodeAddress {
                        r#type: "InternalIP".to_owned(),
                        ip: "x".to_owned(),
                    }],
                    ..pb_node()
                },
                "unparsable_ip",
                "\"x\"",
            ),
        ];
        for (bad, reason, needle) in cases {
            let err = node(&bad).unwrap_err();
            assert_eq!(err.reason, reason, "{err}");
            assert!(err.message.contains(needle), "{err}");
        }
        let err = endpoint(&pb::Endpoint {
            id: 1,
            ips: vec!["10.1.1.1".to_owned()],
            labels: vec!["app=web".to_owned()],
            ..pb::Endpoint::default()
        })
        .unwrap_err();
        assert_eq!(err.reason, "invalid_label");
        assert_eq!(
            err.message,
            "endpoint 1 label \"app=web\" is not of the form source:key=value"
        );
        assert_eq!(
            endpoint(&pb::Endpoint::default()).unwrap_err().reason,
            "invalid_endpoint"
        );
        let err = service(&pb::Service {
            namespace: "default".to_owned(),
            name: "web".to_owned(),
            ports: vec![pb::NamedPort {
                name: "http".to_owned(),
                port: 70000,
                protocol: "TCP".to_owned(),
            }],
            ..pb::Service::default()
        })
        .unwrap_err();
        assert_eq!(err.reason, "invalid_port");
        assert!(namespaced_name("kube.system", "web").is_err());
    }
}
