//! The peer table: which peer each remote node needs, what the device holds, and what to
//! change — a plain state machine (§6 of the behaviour contract), driven by the actor.
//!
//! Restart safety: peers read from the device at start are "restored". An unclaimed restored
//! peer is never touched until [`PeerTable::nodes_synced`]; then [`PeerTable::next_gc`]
//! hands them out one at a time for removal. Allowed IPs of restored peers that a node
//! claims are kept until [`PeerTable::ipcache_synced`].

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use super::LISTEN_PORT;
use super::backend::{DeviceState, DeviceUpdate, PeerUpdate};
use super::key::Key;
use meshwork_types::{AddressType, IpCacheEntry, IpPrefix, Node, SyncKind};

/// A remote node: (cluster, name).
pub type NodeId = (Arc<str>, String);

/// Why a node's peer was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerError {
    /// The node's key is not a WireGuard key.
    #[error("node {node}: malformed WireGuard public key {key:?}")]
    Malformed {
        /// The node (`cluster/name`).
        node: String,
        /// The key as published.
        key: String,
    },
    /// Another node already uses the key.
    #[error("node {node}: detected duplicate public key {key} (already used by {owner})")]
    Duplicate {
        /// The node (`cluster/name`).
        node: String,
        /// The key.
        key: Key,
        /// The node that has it.
        owner: String,
    },
}

/// A peer's configuration as the table wants it on the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerConfig {
    /// Endpoint.
    pub endpoint: Option<SocketAddr>,
    /// Allowed IPs (masked).
    pub allowed_ips: BTreeSet<IpPrefix>,
}

#[derive(Debug, Clone)]
struct NodeEntry {
    key: Key,
    endpoint: Option<SocketAddr>,
    /// Addresses ipcache `HostIP`s are matched against.
    ips: Vec<IpAddr>,
    pod_cidrs: Vec<IpPrefix>,
}

/// Changes for the device, and what the table will believe once they are applied.
#[derive(Debug, Default)]
pub struct Plan {
    /// The request.
    pub update: DeviceUpdate,
    next: Vec<(Key, Option<PeerConfig>)>,
}

/// Counters of rejected nodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rejections {
    /// Keys already used by another node.
    pub duplicate_keys: u64,
    /// Malformed keys.
    pub malformed_keys: u64,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct PeerTable {
    encrypt_node: bool,
    nodes: HashMap<NodeId, NodeEntry>,
    owners: HashMap<Key, NodeId>,
    /// Node address → node, for ipcache `HostIP`s.
    ip_owner: HashMap<IpAddr, NodeId>,
    /// (cluster, prefix) → HostIP.
    ipcache: HashMap<(Arc<str>, IpPrefix), IpAddr>,
    /// HostIP → prefixes it hosts (with a count: two clusters may announce one prefix).
    by_host: HashMap<IpAddr, HashMap<IpPrefix, u32>>,
    /// What the device holds, as far as the table knows.
    applied: HashMap<Key, PeerConfig>,
    /// Restored peers no node has claimed.
    restored_peers: HashMap<Key, PeerConfig>,
    /// Restored allowed IPs of claimed peers, kept until the ipcache wait.
    restored_ips: HashMap<Key, BTreeSet<IpPrefix>>,
    nodes_synced: bool,
    ipcache_synced: bool,
    dirty: HashSet<Key>,
    rejections: Rejections,
}

impl PeerTable {
    /// An empty table; `encrypt_node` adds node IPs to allowed IPs (`--encrypt-node`).
    pub fn new(encrypt_node: bool) -> Self {
        Self {
            encrypt_node,
            ..Self::default()
        }
    }

    /// Takes the device's peers as restored. Call once, before any event.
    pub fn restore(&mut self, device: &DeviceState) {
        for peer in &device.peers {
            let config = PeerConfig {
                endpoint: peer.endpoint,
                allowed_ips: peer.allowed_ips.iter().map(IpPrefix::masked).collect(),
            };
            self.applied.insert(peer.key, config.clone());
            self.restored_peers.insert(peer.key, config);
        }
    }

    /// A remote node appeared or changed.
    pub fn upsert_node(&mut self, cluster: &Arc<str>, node: &Node) -> Result<(), PeerError> {
        let id: NodeId = (Arc::clone(cluster), node.name.clone());
        if node.wireguard_pub_key.is_empty() {
            self.delete_node(&id);
            return Ok(());
        }
        let Ok(key) = Key::from_base64(&node.wireguard_pub_key) else {
            self.rejections.malformed_keys += 1;
            return Err(PeerError::Malformed {
                node: format!("{cluster}/{}", node.name),
                key: node.wireguard_pub_key.clone(),
            });
        };
        if let Some(owner) = self.owners.get(&key).filter(|owner| **owner != id) {
            self.rejections.duplicate_keys += 1;
            return Err(PeerError::Duplicate {
                node: format!("{cluster}/{}", node.name),
                key,
                owner: format!("{}/{}", owner.0, owner.1),
            });
        }
        let entry = node_entry(node, key);
        let old = self.nodes.insert(id.clone(), entry.clone());
        if let Some(old) = &old {
            if old.key != key {
                // Key change: the old peer goes, the new one is built from scratch.
                self.owners.remove(&old.key);
                self.restored_ips.remove(&old.key);
                self.dirty.insert(old.key);
            } else if old.ips != entry.ips {
                // IP change: allowed IPs are rebuilt from the new IPs only.
                self.restored_ips.remove(&key);
            }
            for ip in &old.ips {
                if self.ip_owner.get(ip) == Some(&id) {
                    self.ip_owner.remove(ip);
                }
            }
        }
        for ip in &entry.ips {
            self.ip_owner.insert(*ip, id.clone());
        }
        if let Some(restored) = self.restored_peers.remove(&key)
            && !self.ipcache_synced
        {
            self.restored_ips.insert(key, restored.allowed_ips);
        }
        self.owners.insert(key, id);
        self.dirty.insert(key);
        Ok(())
    }

    /// A remote node went away.
    pub fn delete_node(&mut self, id: &NodeId) {
        let Some(old) = self.nodes.remove(id) else {
            return;
        };
        self.owners.remove(&old.key);
        self.restored_ips.remove(&old.key);
        for ip in &old.ips {
            if self.ip_owner.get(ip) == Some(id) {
                self.ip_owner.remove(ip);
            }
        }
        self.dirty.insert(old.key);
    }

    /// An ipcache entry appeared, changed or went away (`deleted`).
    pub fn ipcache(&mut self, cluster: &Arc<str>, entry: &IpCacheEntry, deleted: bool) {
        let slot = (Arc::clone(cluster), entry.prefix.masked());
        let new = if deleted { None } else { entry.host_ip };
        let old = match new {
            Some(host) => self.ipcache.insert(slot.clone(), host),
            None => self.ipcache.remove(&slot),
        };
        if old == new {
            return;
        }
        if let Some(old) = old {
            if let Some(prefixes) = self.by_host.get_mut(&old) {
                if let Some(count) = prefixes.get_mut(&slot.1) {
                    *count -= 1;
                    if *count == 0 {
                        prefixes.remove(&slot.1);
                    }
                }
                if prefixes.is_empty() {
                    self.by_host.remove(&old);
                }
            }
            self.touch_host(old);
        }
        if let Some(new) = new {
            *self
                .by_host
                .entry(new)
                .or_default()
                .entry(slot.1)
                .or_default() += 1;
            self.touch_host(new);
        }
    }

    fn touch_host(&mut self, host: IpAddr) {
        if let Some(key) = self
            .ip_owner
            .get(&host)
            .and_then(|id| self.nodes.get(id))
            .map(|n| n.key)
        {
            self.dirty.insert(key);
        }
    }

    /// Remote nodes have synced (or the circuit breaker fired): restored peers no node
    /// claims may now be removed ([`Self::next_gc`]).
    pub fn nodes_synced(&mut self) {
        self.nodes_synced = true;
    }

    /// Remote ipcache entries and identities have synced: restored allowed IPs no entry
    /// claims are dropped with the next plan.
    pub fn ipcache_synced(&mut self) {
        self.ipcache_synced = true;
        let keys: Vec<Key> = self.restored_ips.drain().map(|(key, _)| key).collect();
        self.dirty.extend(keys);
    }

    /// The device was recreated empty: everything is configured again.
    pub fn device_reset(&mut self) {
        self.applied.clear();
        self.dirty.extend(self.owners.keys().copied());
        self.dirty.extend(self.restored_peers.keys().copied());
    }

    /// Whether a plan would change something.
    pub fn has_changes(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// The configuration the table wants for `key`.
    pub fn desired(&self, key: &Key) -> Option<PeerConfig> {
        if let Some(entry) = self.owners.get(key).and_then(|id| self.nodes.get(id)) {
            let mut allowed: BTreeSet<IpPrefix> =
                entry.pod_cidrs.iter().map(IpPrefix::masked).collect();
            for ip in &entry.ips {
                if let Some(prefixes) = self.by_host.get(ip) {
                    allowed.extend(prefixes.keys().copied());
                }
            }
            if self.encrypt_node {
                allowed.extend(entry.ips.iter().map(|ip| IpPrefix::host(*ip)));
            }
            if let Some(kept) = self.restored_ips.get(key) {
                allowed.extend(kept.iter().copied());
            }
            return Some(PeerConfig {
                endpoint: entry.endpoint,
                allowed_ips: allowed,
            });
        }
        self.restored_peers.get(key).cloned()
    }

    /// The changes for every peer touched since the last plan. Apply `plan.update`, then
    /// call [`Self::commit`] (or [`Self::fail`] to retry them with the next plan).
    pub fn plan(&mut self) -> Plan {
        let mut dirty: Vec<Key> = self.dirty.drain().collect();
        dirty.sort_unstable();
        let mut plan = Plan::default();
        for key in dirty {
            let desired = self.desired(&key);
            let peer = match (&desired, self.applied.get(&key)) {
                (Some(want), Some(have)) if want == have => continue,
                (Some(want), Some(have)) if have.allowed_ips.is_subset(&want.allowed_ips) => {
                    PeerUpdate {
                        key,
                        remove: false,
                        endpoint: want.endpoint.filter(|e| Some(*e) != have.endpoint),
                        replace_allowed_ips: false,
                        allowed_ips: want
                            .allowed_ips
                            .difference(&have.allowed_ips)
                            .copied()
                            .collect(),
                    }
                }
                (Some(want), _) => PeerUpdate {
                    key,
                    remove: false,
                    endpoint: want.endpoint,
                    replace_allowed_ips: true,
                    allowed_ips: want.allowed_ips.iter().copied().collect(),
                },
                (None, Some(_)) => PeerUpdate::remove(key),
                (None, None) => continue,
            };
            plan.update.peers.push(peer);
            plan.next.push((key, desired));
        }
        plan
    }

    /// The plan was applied.
    pub fn commit(&mut self, plan: Plan) {
        for (key, config) in plan.next {
            match config {
                Some(config) => self.applied.insert(key, config),
                None => self.applied.remove(&key),
            };
        }
    }

    /// The plan failed: its peers are planned again next time.
    pub fn fail(&mut self, plan: Plan) {
        self.dirty.extend(plan.next.into_iter().map(|(key, _)| key));
    }

    /// The next restored peer to remove, once nodes have synced; never one a node uses.
    pub fn next_gc(&self) -> Option<Key> {
        if !self.nodes_synced {
            return None;
        }
        self.restored_peers
            .keys()
            .filter(|key| !self.owners.contains_key(key))
            .min()
            .copied()
    }

    /// `key` (from [`Self::next_gc`]) was removed from the device.
    pub fn gc_done(&mut self, key: &Key) {
        self.restored_peers.remove(key);
        self.applied.remove(key);
    }

    /// Restored state still waiting for garbage collection, and the wait blocking it.
    pub fn pending_gc(&self) -> Vec<(Key, SyncKind)> {
        let mut pending: Vec<(Key, SyncKind)> = self
            .restored_peers
            .keys()
            .map(|key| (*key, SyncKind::Nodes))
            .chain(
                self.restored_ips
                    .keys()
                    .map(|key| (*key, SyncKind::IpIdentities)),
            )
            .collect();
        pending.sort_unstable();
        pending
    }

    /// The node using `key`, as `cluster/name`.
    pub fn owner(&self, key: &Key) -> Option<String> {
        self.owners.get(key).map(|(c, n)| format!("{c}/{n}"))
    }

    /// Rejected nodes so far.
    pub fn rejections(&self) -> Rejections {
        self.rejections
    }

    /// How many restored peers no node has claimed yet (removed once nodes have synced).
    pub fn pending_peers(&self) -> usize {
        self.restored_peers.len()
    }

    /// How many peers the device holds, as far as the table knows.
    pub fn applied_len(&self) -> usize {
        self.applied.len()
    }
}

fn node_entry(node: &Node, key: Key) -> NodeEntry {
    let endpoint = node
        .node_ip(false)
        .or_else(|| node.node_ip(true))
        .map(|ip| SocketAddr::new(ip, LISTEN_PORT));
    let mut ips: Vec<IpAddr> = node
        .ip_addresses
        .iter()
        .filter(|a| a.address_type != AddressType::CiliumInternalIp)
        .filter_map(|a| a.ip)
        .collect();
    ips.sort_unstable();
    ips.dedup();
    let pod_cidrs = node
        .ipv4_alloc_cidr
        .iter()
        .chain(&node.ipv4_secondary_alloc_cidrs)
        .chain(node.ipv6_alloc_cidr.iter())
        .chain(&node.ipv6_secondary_alloc_cidrs)
        .copied()
        .collect();
    NodeEntry {
        key,
        endpoint,
        ips,
        pod_cidrs,
    }
}

#[cfg(test)]
#[path = "peers_tests.rs"]
mod tests;
