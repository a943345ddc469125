//! Global services from remote clusters as Cilium's lb4 maps: per frontend (VIP, port,
//! protocol) a master slot counting the backends and one slot per backend, backends by ID.
//! A plain state machine computing the desired content; [`super::pinned_sync`] writes it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use meshwork_types::{ClusterService, L4Type};

/// `struct lb4_key` (12 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Lb4Key {
    /// The VIP, network order.
    pub address: [u8; 4],
    /// The port, network order.
    pub dport: [u8; 2],
    /// 0: the master; 1..=count: a backend.
    pub backend_slot: u16,
    /// IP protocol number.
    pub proto: u8,
    /// 0: external scope.
    pub scope: u8,
    /// Zero.
    pub pad: [u8; 2],
}

/// `struct lb4_service` (12 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lb4Service {
    /// The backend of this slot (0 in the master).
    pub backend_id: u32,
    /// Backends of the frontend (in the master).
    pub count: u16,
    /// The reverse-NAT index of the frontend, network order (as Cilium writes it).
    pub rev_nat_index: u16,
    /// Flags.
    pub flags: u8,
    /// More flags.
    pub flags2: u8,
    /// Zero.
    pub pad: [u8; 2],
}

/// `struct lb4_backend` (12 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Lb4Backend {
    /// The backend IP, network order.
    pub address: [u8; 4],
    /// The backend port, network order.
    pub port: [u8; 2],
    /// IP protocol number.
    pub proto: u8,
    /// Flags.
    pub flags: u8,
    /// The cluster the backend is in.
    pub cluster_id: u16,
    /// Zone.
    pub zone: u8,
    /// Zero.
    pub pad: u8,
}

/// `struct lb4_reverse_nat` (6 bytes, packed in Cilium): the frontend of a rev-NAT index.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lb4ReverseNat {
    /// The VIP, network order.
    pub address: [u8; 4],
    /// The port, network order.
    pub port: [u8; 2],
}

// SAFETY: repr(C), integers and byte arrays only, no implicit padding (asserted below).
#[allow(unsafe_code)]
unsafe impl aya::Pod for Lb4Key {}
#[allow(unsafe_code)]
unsafe impl aya::Pod for Lb4ReverseNat {}
#[allow(unsafe_code)]
unsafe impl aya::Pod for Lb4Service {}
#[allow(unsafe_code)]
unsafe impl aya::Pod for Lb4Backend {}
const _: () = assert!(size_of::<Lb4Key>() == 12);
const _: () = assert!(size_of::<Lb4Service>() == 12);
const _: () = assert!(size_of::<Lb4Backend>() == 12);
const _: () = assert!(size_of::<Lb4ReverseNat>() == 6);

fn proto(l4: &L4Type) -> Option<u8> {
    match l4 {
        L4Type::Tcp => Some(6),
        L4Type::Udp => Some(17),
        L4Type::Sctp => Some(132),
        _ => None,
    }
}

/// The global services of every remote cluster, merged per namespace/name, and the local
/// cluster's services: a shared one merges with the remote announcements of its name (its
/// frontends get their backends and theirs get its), one not shared stands alone (Cilium's
/// `service.cilium.io/global`).
#[derive(Default)]
pub struct ServiceTable {
    services: BTreeMap<(String, Arc<str>), Arc<ClusterService>>,
    ids: HashMap<Lb4Backend, u32>,
    next_id: u32,
    rev_nat: HashMap<([u8; 4], [u8; 2], u8), u16>,
}

/// What the lb4 maps should hold.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DesiredLb {
    /// `cilium_lb4_services_v2`.
    pub services: HashMap<Lb4Key, Lb4Service>,
    /// `cilium_lb4_backends_v3`.
    pub backends: HashMap<u32, Lb4Backend>,
    /// `cilium_lb4_reverse_nat`: each frontend by its rev-NAT index (network order).
    pub rev_nat: HashMap<u16, Lb4ReverseNat>,
}

impl DesiredLb {
    /// The backend slots (1..=count) and the masters (slot 0), apart: slots are written
    /// before the master that counts them (§10), so a socket never picks a missing slot.
    pub fn slots_and_masters(&self) -> [HashMap<Lb4Key, Lb4Service>; 2] {
        let (masters, slots) = self
            .services
            .iter()
            .map(|(k, v)| (*k, *v))
            .partition(|(k, _)| k.backend_slot == 0);
        [slots, masters]
    }
}

impl ServiceTable {
    /// Keeps the IDs of backends the previous agent wrote, so restored slots stay valid.
    pub fn seed_ids<'a>(&mut self, restored: impl Iterator<Item = (&'a u32, &'a Lb4Backend)>) {
        for (id, backend) in restored {
            self.ids.insert(*backend, *id);
            self.next_id = self.next_id.max(*id);
        }
    }

    /// Keeps the rev-NAT index of every frontend the previous agent wrote (its masters), so a
    /// socket connected before the restart still reads its VIP back.
    pub fn seed_rev_nat<'a>(
        &mut self,
        restored: impl Iterator<Item = (&'a Lb4Key, &'a Lb4Service)>,
    ) {
        for (key, service) in restored {
            if key.backend_slot == 0 && service.rev_nat_index != 0 {
                self.rev_nat.insert(
                    (key.address, key.dport, key.proto),
                    u16::from_be(service.rev_nat_index),
                );
            }
        }
    }

    /// Upserts `cluster`'s announcement of a service.
    pub fn upsert(&mut self, cluster: &Arc<str>, service: Arc<ClusterService>) {
        self.services
            .insert((service.namespaced_name(), cluster.clone()), service);
    }

    /// Deletes `cluster`'s announcement of a service.
    pub fn delete(&mut self, cluster: &Arc<str>, service: &ClusterService) {
        self.services
            .remove(&(service.namespaced_name(), cluster.clone()));
    }

    /// Replaces every service of the local cluster (`cluster`) with `services`.
    pub fn replace_local(&mut self, cluster: &Arc<str>, services: Vec<Arc<ClusterService>>) {
        self.services.retain(|(_, c), _| c != cluster);
        for service in services {
            self.upsert(cluster, service);
        }
    }

    /// The frontends (address, port, protocol) of the services that stand alone: not shared,
    /// so no remote cluster adds to them and their state is known once the local state is.
    pub fn standalone_frontends(&self) -> HashSet<([u8; 4], [u8; 2], u8)> {
        self.services
            .values()
            .filter(|service| !service.shared)
            .flat_map(|service| frontends(service))
            .collect()
    }

    /// The desired map content. IPv4 frontends and backends only (the maps are lb4).
    pub fn desired(&mut self) -> DesiredLb {
        let mut out = DesiredLb::default();
        // Frontend → backends, merged over clusters; BTreeMaps keep the slot order stable.
        let mut frontends: BTreeMap<([u8; 4], [u8; 2], u8), Vec<Lb4Backend>> = BTreeMap::new();
        // Shared announcements of one name merge; one not shared is a group of its own.
        let mut by_name: BTreeMap<(&str, Option<&str>), Vec<&ClusterService>> = BTreeMap::new();
        for ((name, cluster), service) in &self.services {
            let alone = (!service.shared).then_some(&**cluster);
            by_name
                .entry((name.as_str(), alone))
                .or_default()
                .push(service);
        }
        for announcements in by_name.values() {
            for service in announcements {
                for (vip, ports) in &service.frontends {
                    let Ok(IpAddr::V4(vip)) = vip.parse::<IpAddr>() else {
                        continue;
                    };
                    for (port_name, l4) in ports {
                        let Some(proto) = proto(&l4.protocol) else {
                            continue;
                        };
                        let backends = frontends
                            .entry((vip.octets(), l4.port.to_be_bytes(), proto))
                            .or_default();
                        for peer in announcements {
                            backends.extend(lb4_backends(peer, port_name, proto));
                        }
                    }
                }
            }
        }
        for ((address, dport, proto), mut backends) in frontends {
            backends.sort_by_key(|b| (b.cluster_id, b.address, b.port));
            backends.dedup();
            // Network order in the maps, as Cilium's writer converts it.
            let rev_nat_index = self.rev_nat_index((address, dport, proto)).to_be();
            out.rev_nat.insert(
                rev_nat_index,
                Lb4ReverseNat {
                    address,
                    port: dport,
                },
            );
            let key = |slot: u16| Lb4Key {
                address,
                dport,
                backend_slot: slot,
                proto,
                scope: 0,
                pad: [0; 2],
            };
            let count = u16::try_from(backends.len()).unwrap_or(u16::MAX);
            out.services.insert(
                key(0),
                Lb4Service {
                    count,
                    rev_nat_index,
                    ..Lb4Service::default()
                },
            );
            for (slot, backend) in (1..=count).zip(backends) {
                let id = self.id(backend);
                out.backends.insert(id, backend);
                out.services.insert(
                    key(slot),
                    Lb4Service {
                        backend_id: id,
                        rev_nat_index,
                        ..Lb4Service::default()
                    },
                );
            }
        }
        // IDs of backends no longer used are not reused: a restored slot may still name one.
        out
    }

    /// The frontend's index: kept once given (restored ones included), else the lowest free.
    fn rev_nat_index(&mut self, frontend: ([u8; 4], [u8; 2], u8)) -> u16 {
        if let Some(index) = self.rev_nat.get(&frontend) {
            return *index;
        }
        let taken: HashSet<u16> = self.rev_nat.values().copied().collect();
        let index = (1..=u16::MAX)
            .find(|i| !taken.contains(i))
            .unwrap_or(u16::MAX);
        self.rev_nat.insert(frontend, index);
        index
    }

    fn id(&mut self, backend: Lb4Backend) -> u32 {
        if let Some(id) = self.ids.get(&backend) {
            return *id;
        }
        self.next_id += 1;
        self.ids.insert(backend, self.next_id);
        self.next_id
    }
}

/// The IPv4 frontends of `service`, as the maps key them.
fn frontends(service: &ClusterService) -> impl Iterator<Item = ([u8; 4], [u8; 2], u8)> + '_ {
    service.frontends.iter().flat_map(|(vip, ports)| {
        let vip = match vip.parse::<IpAddr>() {
            Ok(IpAddr::V4(vip)) => Some(vip.octets()),
            _ => None,
        };
        ports
            .values()
            .filter_map(move |l4| Some((vip?, l4.port.to_be_bytes(), proto(&l4.protocol)?)))
    })
}

fn lb4_backends<'a>(
    service: &'a ClusterService,
    port_name: &'a str,
    proto: u8,
) -> impl Iterator<Item = Lb4Backend> + 'a {
    service.backends.iter().filter_map(move |(ip, ports)| {
        let ip: Ipv4Addr = ip.parse().ok()?;
        let l4 = ports.get(port_name)?;
        (self::proto(&l4.protocol)? == proto).then(|| Lb4Backend {
            address: ip.octets(),
            port: l4.port.to_be_bytes(),
            proto,
            cluster_id: u16::try_from(service.cluster_id).unwrap_or(u16::MAX),
            ..Lb4Backend::default()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshwork_types::L4Addr;

    fn svc(cluster: &str, id: u32, backends: &[&str]) -> Arc<ClusterService> {
        let port = |p| {
            BTreeMap::from([(
                "http".to_owned(),
                L4Addr {
                    protocol: L4Type::Tcp,
                    port: p,
                },
            )])
        };
        Arc::new(ClusterService {
            cluster: cluster.to_owned(),
            namespace: "default".to_owned(),
            name: "web".to_owned(),
            frontends: BTreeMap::from([("172.20.0.1".to_owned(), port(80))]),
            backends: backends
                .iter()
                .map(|b| ((*b).to_owned(), port(8080)))
                .collect(),
            shared: true,
            cluster_id: id,
            ..ClusterService::default()
        })
    }

    #[test]
    fn backends_of_every_cluster_fill_the_slots_of_one_frontend() {
        let mut table = ServiceTable::default();
        let (b, c): (Arc<str>, Arc<str>) = (Arc::from("b"), Arc::from("c"));
        table.upsert(&b, svc("b", 2, &["10.214.2.10", "10.214.2.11"]));
        table.upsert(&c, svc("c", 3, &["10.214.3.10"]));
        let desired = table.desired();
        assert_eq!(desired.backends.len(), 3);
        assert_eq!(desired.services.len(), 4, "master + 3 slots");
        let master = desired
            .services
            .iter()
            .find(|(k, _)| k.backend_slot == 0)
            .unwrap();
        assert_eq!(master.0.address, [172, 20, 0, 1]);
        assert_eq!(master.0.dport, 80u16.to_be_bytes());
        assert_eq!(master.1.count, 3);
        let ids_before: Vec<u32> = desired.backends.keys().copied().collect();

        // One rev-NAT entry, naming the frontend, under the master's index (network order).
        assert_eq!(
            desired.rev_nat.get(&master.1.rev_nat_index),
            Some(&Lb4ReverseNat {
                address: [172, 20, 0, 1],
                port: 80u16.to_be_bytes(),
            })
        );
        assert_eq!(u16::from_be(master.1.rev_nat_index), 1);
        assert_eq!(desired.rev_nat.len(), 1);

        // Cluster c withdraws: its slot goes, the others keep their backend IDs.
        table.delete(&c, &svc("c", 3, &[]));
        let desired = table.desired();
        assert_eq!(desired.services.len(), 3);
        assert!(desired.backends.keys().all(|id| ids_before.contains(id)));
        assert!(desired.backends.values().all(|b| b.cluster_id == 2));
    }

    #[test]
    fn a_local_service_that_is_not_shared_stands_alone() {
        let mut table = ServiceTable::default();
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        table.upsert(&b, svc("b", 2, &["10.214.2.10"]));
        let mut local = (*svc("a", 1, &["10.214.1.10"])).clone();
        local.frontends = BTreeMap::from([(
            "172.20.0.2".to_owned(),
            local.frontends["172.20.0.1"].clone(),
        )]);
        local.shared = false;
        table.replace_local(&a, vec![Arc::new(local.clone())]);
        let slots = |table: &mut ServiceTable, vip: [u8; 4]| {
            let desired = table.desired();
            let mut clusters: Vec<u16> = desired
                .services
                .iter()
                .filter(|(k, _)| k.address == vip && k.backend_slot != 0)
                .map(|(_, v)| desired.backends[&v.backend_id].cluster_id)
                .collect();
            clusters.sort_unstable();
            clusters
        };
        // Same name, but a's is not shared: neither frontend takes the other's backends.
        assert_eq!(slots(&mut table, [172, 20, 0, 2]), [1]);
        assert_eq!(slots(&mut table, [172, 20, 0, 1]), [2]);
        assert_eq!(
            table.standalone_frontends(),
            HashSet::from([([172, 20, 0, 2], 80u16.to_be_bytes(), 6)])
        );
        // Shared, it merges both ways (a global service).
        local.shared = true;
        table.replace_local(&a, vec![Arc::new(local)]);
        assert_eq!(slots(&mut table, [172, 20, 0, 2]), [1, 2]);
        assert_eq!(slots(&mut table, [172, 20, 0, 1]), [1, 2]);
        assert!(table.standalone_frontends().is_empty());
        // The next local set replaces the whole of a's.
        table.replace_local(&a, Vec::new());
        assert_eq!(slots(&mut table, [172, 20, 0, 1]), [2]);
        assert_eq!(slots(&mut table, [172, 20, 0, 2]), Vec::<u16>::new());
    }

    #[test]
    fn a_restarted_agent_keeps_each_frontends_rev_nat_index() {
        let b: Arc<str> = Arc::from("b");
        let mut before = ServiceTable::default();
        let mut other = (*svc("b", 2, &["10.214.2.10"])).clone();
        other.name = "api".to_owned();
        other.frontends = BTreeMap::from([(
            "172.20.0.9".to_owned(),
            svc("b", 2, &[]).frontends["172.20.0.1"].clone(),
        )]);
        before.upsert(&b, Arc::new(other.clone()));
        before.upsert(&b, svc("b", 2, &["10.214.2.10"]));
        let restored = before.desired();

        // The new agent sees only web at first: it must not take api's index for it.
        let mut after = ServiceTable::default();
        after.seed_rev_nat(restored.services.iter());
        after.upsert(&b, svc("b", 2, &["10.214.2.10"]));
        let desired = after.desired();
        let index_of = |lb: &DesiredLb, vip: [u8; 4]| {
            lb.services
                .iter()
                .find(|(k, _)| k.backend_slot == 0 && k.address == vip)
                .map(|(_, v)| v.rev_nat_index)
        };
        assert_eq!(
            index_of(&desired, [172, 20, 0, 1]),
            index_of(&restored, [172, 20, 0, 1])
        );
        after.upsert(&b, Arc::new(other));
        let desired = after.desired();
        assert_eq!(
            index_of(&desired, [172, 20, 0, 9]),
            index_of(&restored, [172, 20, 0, 9])
        );
        assert_ne!(
            index_of(&desired, [172, 20, 0, 9]),
            index_of(&desired, [172, 20, 0, 1])
        );
    }
}
