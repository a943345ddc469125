//! What a previous apiserver wrote and no agent has claimed yet (its node keys and ipcache
//! entries, grouped by the node they belong to). A node whose agent republishes and completes
//! its initial state claims its group: the keys it no longer has are deleted. A node that
//! never comes back is deleted with its group after `--node-gc-grace`, as a node whose
//! session closed would be; so is the group of entries whose `HostIP` matches no node.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::time::Duration;

use meshwork_types::keys::{IPCACHE_DEFAULT_PREFIX, NODES_PREFIX};
use meshwork_types::{IpIdentityPair, Node};
use tokio::time::Instant;

use super::ClusterState;

/// The group of keys no node claims.
const NO_NODE: &str = "";

/// One adopted group.
#[derive(Debug, Clone)]
pub(super) struct Adopted {
    keys: BTreeSet<String>,
    since: Instant,
}

impl ClusterState {
    /// Takes over what a previous apiserver wrote (`found`: key → value); returns the names
    /// of the nodes found, whose agents are expected back.
    pub fn adopt<'a>(
        &mut self,
        found: impl IntoIterator<Item = (&'a String, &'a Vec<u8>)> + Clone,
        now: Instant,
    ) -> Vec<String> {
        let node_prefix = format!("{NODES_PREFIX}/{}/", self.cluster);
        let ipcache_prefix = format!("{IPCACHE_DEFAULT_PREFIX}/");
        let mut hosts: HashMap<IpAddr, String> = HashMap::new();
        let mut nodes = Vec::new();
        for (key, value) in found.clone() {
            let Some(name) = key.strip_prefix(&node_prefix) else {
                continue;
            };
            if let Ok(node) = Node::from_json(value) {
                hosts.extend(
                    node.ip_addresses
                        .iter()
                        .filter_map(|a| a.ip)
                        .map(|ip| (ip, name.to_owned())),
                );
            }
            self.adopted_group(name, now).keys.insert(key.clone());
            nodes.push(name.to_owned());
        }
        for (key, value) in found {
            if !key.starts_with(&ipcache_prefix) {
                continue;
            }
            let owner = IpIdentityPair::from_json(value)
                .ok()
                .and_then(|pair| pair.host_ip)
                .and_then(|host| hosts.get(&host).cloned())
                .unwrap_or_default();
            self.adopted_group(&owner, now).keys.insert(key.clone());
        }
        nodes
    }

    /// `node`'s agent has republished its initial state: what it had before and no longer
    /// has is deleted.
    pub fn claim_adopted(&mut self, node: &str) {
        if let Some(group) = self.adopted.remove(node) {
            self.drop_unwanted(group.keys);
        }
    }

    /// Nodes known only from what was adopted.
    pub fn adopted_nodes(&self) -> impl Iterator<Item = &str> {
        self.adopted
            .keys()
            .map(String::as_str)
            .filter(|n| *n != NO_NODE)
    }

    /// Deletes the adopted group of `node`; whether there was one.
    pub(super) fn delete_adopted(&mut self, node: &str) -> bool {
        match self.adopted.remove(node) {
            Some(group) => {
                self.drop_unwanted(group.keys);
                true
            }
            None => false,
        }
    }

    /// Deletes the groups adopted at least `grace` ago whose node has not come back (and the
    /// group of no node); returns the nodes deleted.
    pub(super) fn collect_adopted(&mut self, now: Instant, grace: Duration) -> Vec<String> {
        let expired: Vec<String> = self
            .adopted
            .iter()
            .filter(|(node, group)| {
                now - group.since >= grace && !self.nodes.contains_key(node.as_str())
            })
            .map(|(node, _)| node.clone())
            .collect();
        for node in &expired {
            self.delete_adopted(node);
        }
        expired.into_iter().filter(|n| n != NO_NODE).collect()
    }

    fn adopted_group(&mut self, node: &str, now: Instant) -> &mut Adopted {
        self.adopted.entry(node.to_owned()).or_insert(Adopted {
            keys: BTreeSet::new(),
            since: now,
        })
    }

    /// Queues a delete for each of `keys` the state does not want (the writer holds them).
    fn drop_unwanted(&mut self, keys: BTreeSet<String>) {
        for key in keys {
            if !self.desired.contains_key(&key) {
                self.dirty.insert(key);
            }
        }
    }
}

/// The adopted groups, by node ([`NO_NODE`] for entries of no known node).
pub(super) type AdoptedGroups = BTreeMap<String, Adopted>;
