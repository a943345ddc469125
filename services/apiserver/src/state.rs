//! What the cluster exports, as the etcd keys and values that say it (cilium-semantics §1,
//! §8): a plain state machine, driven by the agents' sessions and the service declarations,
//! that keeps the desired value of every key and which keys changed since the writer last
//! took them.

pub use meshwork_kvstore::lease_writer::KeyChange;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use meshwork_types::keys::{
    IDENTITY_ID_PREFIX, IPCACHE_DEFAULT_PREFIX, NODES_PREFIX, SERVICES_PREFIX,
};
use meshwork_types::{
    Address, ClusterService, IpIdentityPair, IpPrefix, L4Addr, L4Type, Label, NamedPort, Node,
};
use tokio::time::Instant;

use crate::identities::{Exhausted, IdentityAllocator};

/// A node as its agent publishes it (validated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// The node's name.
    pub name: String,
    /// Its addresses, typed.
    pub addresses: Vec<Address>,
    /// Its IPv4 pod CIDRs, primary first.
    pub ipv4_cidrs: Vec<IpPrefix>,
    /// Its IPv6 pod CIDRs, primary first.
    pub ipv6_cidrs: Vec<IpPrefix>,
    /// Its health endpoint's IPv4.
    pub ipv4_health_ip: Option<IpAddr>,
    /// Its health endpoint's IPv6.
    pub ipv6_health_ip: Option<IpAddr>,
    /// Its WireGuard public key, base64; empty without WireGuard.
    pub wireguard_public_key: String,
    /// Its IPsec key index.
    pub encryption_key: u8,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its pod IPs come from ENIs, not from its pod CIDRs.
    pub eni_ipam: bool,
}

impl NodeSpec {
    fn pod_cidrs(&self) -> impl Iterator<Item = &IpPrefix> {
        self.ipv4_cidrs.iter().chain(&self.ipv6_cidrs)
    }

    fn owns(&self, ip: IpAddr) -> bool {
        self.eni_ipam || self.pod_cidrs().any(|cidr| cidr.contains(ip))
    }
}

/// An endpoint as its agent publishes it (validated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointSpec {
    /// Its ID on the node.
    pub id: u64,
    /// Its IPs.
    pub ips: Vec<IpAddr>,
    /// Its security labels.
    pub labels: Vec<Label>,
    /// Its named ports.
    pub named_ports: Vec<NamedPort>,
    /// The pod's namespace.
    pub pod_namespace: String,
    /// The pod's name.
    pub pod_name: String,
}

/// A declared global service (validated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSpec {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its frontend IPs.
    pub frontends: Vec<IpAddr>,
    /// Its ports by name.
    pub ports: BTreeMap<String, L4Addr>,
    /// The labels a backend carries, all of them.
    pub selector: Vec<Label>,
    /// Shared with remote clusters.
    pub shared: bool,
}

impl ServiceSpec {
    fn selects(&self, endpoint: &EndpointSpec) -> bool {
        !self.selector.is_empty() && self.selector.iter().all(|l| endpoint.labels.contains(l))
    }
}

/// Why a publish was refused; each is a reason of `refused_requests_total`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The endpoint's IP is not in its node's pod CIDRs.
    #[error("endpoint {id}: {ip} is outside node {node}'s pod CIDRs")]
    OutsidePodCidr {
        /// The node.
        node: String,
        /// The endpoint.
        id: u64,
        /// The IP.
        ip: IpAddr,
    },
    /// The node's pod CIDR overlaps another node's.
    #[error("node {node}'s pod CIDR {cidr} overlaps node {other}'s {other_cidr}")]
    CidrOverlap {
        /// The publishing node.
        node: String,
        /// Its CIDR.
        cidr: IpPrefix,
        /// The node it overlaps.
        other: String,
        /// That node's CIDR.
        other_cidr: IpPrefix,
    },
    /// An endpoint of an unknown node (the session has not published its node).
    #[error("node {0} has not been published")]
    UnknownNode(String),
    /// The identity range is used up.
    #[error(transparent)]
    Exhausted(#[from] Exhausted),
}

impl Refused {
    /// The metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Refused::OutsidePodCidr { .. } => "ip_outside_pod_cidr",
            Refused::CidrOverlap { .. } => "pod_cidr_overlap",
            Refused::UnknownNode(_) => "unknown_node",
            Refused::Exhausted(_) => "identities_exhausted",
        }
    }
}

#[derive(Debug)]
struct NodeEntry {
    spec: NodeSpec,
    endpoints: BTreeMap<u64, (EndpointSpec, u32)>,
    /// When its agent's session closed; `None` while connected.
    gone_since: Option<Instant>,
}

/// The cluster's exported state.
#[derive(Debug)]
pub struct ClusterState {
    cluster: String,
    cluster_id: u32,
    identities: IdentityAllocator,
    nodes: BTreeMap<String, NodeEntry>,
    services: BTreeMap<(String, String), ServiceSpec>,
    desired: BTreeMap<String, Vec<u8>>,
    dirty: BTreeSet<String>,
    /// What a previous apiserver wrote, not yet claimed ([`adopted`]).
    adopted: adopted::AdoptedGroups,
}

impl ClusterState {
    /// The state of cluster `cluster` (ID `cluster_id`), exporting nothing yet.
    pub fn new(cluster: &str, cluster_id: u32, max_connected_clusters: u32) -> Self {
        Self {
            cluster: cluster.to_owned(),
            cluster_id,
            identities: IdentityAllocator::new(cluster, cluster_id, max_connected_clusters),
            nodes: BTreeMap::new(),
            services: BTreeMap::new(),
            desired: BTreeMap::new(),
            dirty: BTreeSet::new(),
            adopted: adopted::AdoptedGroups::new(),
        }
    }

    /// Keeps an identity found in etcd, so the same labels keep their ID.
    pub fn restore_identity(&mut self, id: u32, labels: &str, now: Instant) -> bool {
        let kept = self.identities.restore(id, labels, now);
        if kept {
            self.set(identity_key(id), Some(labels.as_bytes().to_vec()));
        }
        kept
    }

    /// The node `spec.name` published by its (re)connected agent.
    pub fn publish_node(&mut self, spec: NodeSpec) -> Result<(), Refused> {
        for cidr in spec.pod_cidrs() {
            for (other, entry) in self.nodes.iter().filter(|(name, _)| **name != spec.name) {
                if let Some(other_cidr) = entry
                    .spec
                    .pod_cidrs()
                    .find(|o| o.contains(cidr.addr()) || cidr.contains(o.addr()))
                {
                    return Err(Refused::CidrOverlap {
                        node: spec.name.clone(),
                        cidr: *cidr,
                        other: other.clone(),
                        other_cidr: *other_cidr,
                    });
                }
            }
        }
        let name = spec.name.clone();
        let entry = self.nodes.entry(name.clone()).or_insert_with(|| NodeEntry {
            spec: spec.clone(),
            endpoints: BTreeMap::new(),
            gone_since: None,
        });
        entry.spec = spec;
        entry.gone_since = None;
        let value = self.node_value(&name);
        self.set(node_key(&self.cluster, &name), Some(value));
        // The node's IP and key are in every ipcache entry of its endpoints.
        let ids: Vec<u64> = self.nodes[&name].endpoints.keys().copied().collect();
        for id in ids {
            self.write_endpoint(&name, id);
        }
        Ok(())
    }

    /// An endpoint of `node`, created or changed; returns its identity.
    pub fn put_endpoint(
        &mut self,
        node: &str,
        endpoint: EndpointSpec,
        now: Instant,
    ) -> Result<u32, Refused> {
        let entry = self
            .nodes
            .get(node)
            .ok_or_else(|| Refused::UnknownNode(node.to_owned()))?;
        if let Some(ip) = endpoint.ips.iter().find(|ip| !entry.spec.owns(**ip)) {
            return Err(Refused::OutsidePodCidr {
                node: node.to_owned(),
                id: endpoint.id,
                ip: *ip,
            });
        }
        let labels = self.identities.identity_labels(&endpoint.labels);
        let user = (node.to_owned(), endpoint.id);
        let (identity, new) = self.identities.acquire(&labels, user.clone())?;
        if new {
            self.set(identity_key(identity), Some(labels.into_bytes()));
        }
        let entry = self.nodes.get_mut(node).expect("checked above");
        let old = entry.endpoints.insert(endpoint.id, (endpoint, identity));
        if let Some((old, old_identity)) = old {
            if old_identity != identity {
                self.identities.release(old_identity, &user, now);
            }
            let kept: BTreeSet<IpAddr> = self.nodes[node].endpoints[&user.1]
                .0
                .ips
                .iter()
                .copied()
                .collect();
            for ip in old.ips.iter().filter(|ip| !kept.contains(ip)) {
                self.set(ipcache_key(*ip), None);
            }
        }
        self.write_endpoint(node, user.1);
        self.write_services();
        Ok(identity)
    }

    /// An endpoint of `node` deleted; `false` when it did not exist.
    pub fn delete_endpoint(&mut self, node: &str, id: u64, now: Instant) -> bool {
        let Some((endpoint, identity)) = self
            .nodes
            .get_mut(node)
            .and_then(|n| n.endpoints.remove(&id))
        else {
            return false;
        };
        self.identities
            .release(identity, &(node.to_owned(), id), now);
        for ip in endpoint.ips {
            self.set(ipcache_key(ip), None);
        }
        self.write_services();
        true
    }

    /// `node`'s agent disconnected: its entries stay until [`Self::collect_garbage`].
    pub fn disconnect(&mut self, node: &str, now: Instant) {
        if let Some(entry) = self.nodes.get_mut(node) {
            entry.gone_since.get_or_insert(now);
        }
    }

    /// Whether `node`'s agent is connected.
    pub fn connected(&self, node: &str) -> bool {
        self.nodes.get(node).is_some_and(|n| n.gone_since.is_none())
    }

    /// Deletes `node` and everything it published; `false` when unknown.
    pub fn delete_node(&mut self, node: &str, now: Instant) -> bool {
        let adopted = self.delete_adopted(node);
        let Some(entry) = self.nodes.remove(node) else {
            return adopted;
        };
        for (id, (endpoint, identity)) in entry.endpoints {
            self.identities
                .release(identity, &(node.to_owned(), id), now);
            for ip in endpoint.ips {
                self.set(ipcache_key(ip), None);
            }
        }
        self.set(node_key(&self.cluster, node), None);
        self.write_services();
        true
    }

    /// Deletes the nodes gone for at least `node_grace`, and the identities unused for at
    /// least `identity_interval`; returns the nodes deleted.
    pub fn collect_garbage(
        &mut self,
        now: Instant,
        node_grace: Duration,
        identity_interval: Duration,
    ) -> Vec<String> {
        let gone: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.gone_since.is_some_and(|since| now - since >= node_grace))
            .map(|(name, _)| name.clone())
            .collect();
        for node in &gone {
            self.delete_node(node, now);
        }
        let mut gone = gone;
        gone.extend(self.collect_adopted(now, node_grace));
        for id in self.identities.collect_garbage(now, identity_interval) {
            self.set(identity_key(id), None);
        }
        gone
    }

    /// Declares (creates or replaces) a service; returns its backends now.
    pub fn put_service(&mut self, service: ServiceSpec) -> usize {
        let key = (service.namespace.clone(), service.name.clone());
        let was_shared = self.services.get(&key).is_some_and(|s| s.shared);
        self.services.insert(key.clone(), service);
        if was_shared && !self.services[&key].shared {
            self.set(service_key(&self.cluster, &key.0, &key.1), None);
        }
        self.write_services();
        self.backends(&self.services[&key]).len()
    }

    /// Deletes a service; `false` when it was not declared.
    pub fn delete_service(&mut self, namespace: &str, name: &str) -> bool {
        let removed = self
            .services
            .remove(&(namespace.to_owned(), name.to_owned()));
        if removed.is_some() {
            self.set(service_key(&self.cluster, namespace, name), None);
        }
        removed.is_some()
    }

    /// Every declared service and its backend IPs, sorted.
    pub fn services(&self) -> Vec<(ServiceSpec, Vec<IpAddr>)> {
        self.services
            .values()
            .map(|s| (s.clone(), self.backends(s).into_iter().collect()))
            .collect()
    }

    /// The keys that changed since the last call, with their desired values.
    pub fn take_changes(&mut self) -> Vec<KeyChange> {
        std::mem::take(&mut self.dirty)
            .into_iter()
            .map(|key| {
                let value = self.desired.get(&key).cloned();
                (key, value)
            })
            .collect()
    }

    /// Every key the state wants, with its value.
    pub fn desired(&self) -> &BTreeMap<String, Vec<u8>> {
        &self.desired
    }

    /// Nodes known, connected or not.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Endpoints known.
    pub fn endpoint_count(&self) -> usize {
        self.nodes.values().map(|n| n.endpoints.len()).sum()
    }

    /// Services declared.
    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    /// Identities allocated.
    pub fn identity_count(&self) -> usize {
        self.identities.len()
    }

    fn set(&mut self, key: String, value: Option<Vec<u8>>) {
        let changed = match &value {
            Some(value) => self.desired.get(&key) != Some(value),
            None => self.desired.contains_key(&key),
        };
        if !changed {
            return;
        }
        match value {
            Some(value) => self.desired.insert(key.clone(), value),
            None => self.desired.remove(&key),
        };
        self.dirty.insert(key);
    }

    fn node_value(&self, name: &str) -> Vec<u8> {
        let spec = &self.nodes[name].spec;
        let mut ipv4 = spec.ipv4_cidrs.iter().copied();
        let mut ipv6 = spec.ipv6_cidrs.iter().copied();
        Node {
            name: spec.name.clone(),
            cluster: self.cluster.clone(),
            ip_addresses: spec.addresses.clone(),
            ipv4_alloc_cidr: ipv4.next(),
            ipv4_secondary_alloc_cidrs: ipv4.collect(),
            ipv6_alloc_cidr: ipv6.next(),
            ipv6_secondary_alloc_cidrs: ipv6.collect(),
            ipv4_health_ip: spec.ipv4_health_ip,
            ipv6_health_ip: spec.ipv6_health_ip,
            cluster_id: self.cluster_id,
            source: "custom-resource".to_owned(),
            encryption_key: spec.encryption_key,
            labels: spec.labels.clone(),
            wireguard_pub_key: spec.wireguard_public_key.clone(),
            ..Node::default()
        }
        .to_json()
    }

    fn write_endpoint(&mut self, node: &str, id: u64) {
        let entry = &self.nodes[node];
        let (endpoint, identity) = &entry.endpoints[&id];
        let host = |ipv6| {
            let probe = Node {
                ip_addresses: entry.spec.addresses.clone(),
                ..Node::default()
            };
            probe.node_ip(ipv6)
        };
        let values: Vec<(String, Vec<u8>)> = endpoint
            .ips
            .iter()
            .map(|ip| {
                let pair = IpIdentityPair {
                    ip: Some(*ip),
                    host_ip: host(ip.is_ipv6()),
                    id: *identity,
                    key: entry.spec.encryption_key,
                    k8s_namespace: endpoint.pod_namespace.clone(),
                    k8s_pod_name: endpoint.pod_name.clone(),
                    named_ports: endpoint.named_ports.clone(),
                    ..IpIdentityPair::default()
                };
                (ipcache_key(*ip), pair.to_json())
            })
            .collect();
        for (key, value) in values {
            self.set(key, Some(value));
        }
    }

    fn backends(&self, service: &ServiceSpec) -> BTreeSet<IpAddr> {
        self.nodes
            .values()
            .flat_map(|n| n.endpoints.values())
            .filter(|(endpoint, _)| service.selects(endpoint))
            .flat_map(|(endpoint, _)| endpoint.ips.iter().copied())
            .collect()
    }

    fn write_services(&mut self) {
        let values: Vec<(String, Vec<u8>)> = self
            .services
            .values()
            .filter(|s| s.shared)
            .map(|s| {
                let frontends = s
                    .frontends
                    .iter()
                    .map(|ip| (ip.to_string(), s.ports.clone()))
                    .collect();
                let backends = self
                    .backends(s)
                    .into_iter()
                    .map(|ip| (ip.to_string(), s.ports.clone()))
                    .collect();
                let service = ClusterService {
                    cluster: self.cluster.clone(),
                    namespace: s.namespace.clone(),
                    name: s.name.clone(),
                    frontends,
                    backends,
                    selector: s
                        .selector
                        .iter()
                        .map(|l| (l.key().to_owned(), l.value().to_owned()))
                        .collect(),
                    shared: true,
                    cluster_id: self.cluster_id,
                    ..ClusterService::default()
                };
                (
                    service_key(&self.cluster, &s.namespace, &s.name),
                    service.to_json(),
                )
            })
            .collect();
        for (key, value) in values {
            self.set(key, Some(value));
        }
    }
}

/// A port of a service, as Cilium's `L4Addr`.
pub fn l4(protocol: L4Type, port: u16) -> L4Addr {
    L4Addr { protocol, port }
}

/// `cilium/state/nodes/v1/<cluster>/<node>`.
pub fn node_key(cluster: &str, node: &str) -> String {
    format!("{NODES_PREFIX}/{cluster}/{node}")
}

/// `cilium/state/ip/v1/default/<ip>`.
pub fn ipcache_key(ip: IpAddr) -> String {
    format!("{IPCACHE_DEFAULT_PREFIX}/{ip}")
}

/// `cilium/state/identities/v1/id/<id>`.
pub fn identity_key(id: u32) -> String {
    format!("{IDENTITY_ID_PREFIX}/{id}")
}

/// `cilium/state/services/v1/<cluster>/<namespace>/<name>`.
pub fn service_key(cluster: &str, namespace: &str, name: &str) -> String {
    format!("{SERVICES_PREFIX}/{cluster}/{namespace}/{name}")
}

mod adopted;
#[cfg(test)]
mod tests;
