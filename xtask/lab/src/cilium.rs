//! Cilium-format state for lab clusters: keys in Cilium's kvstore layout and values with
//! Go's field names exactly, as a Cilium cluster (or Meshwork's apiserver) writes them. Pure
//! data: callers write it with their own etcd client.

use serde_json::json;

const NODES: &str = "cilium/state/nodes/v1";
const SERVICES: &str = "cilium/state/services/v1";
const IDENTITIES: &str = "cilium/state/identities/v1";
const IPCACHE: &str = "cilium/state/ip/v1";

/// How much state a fixture cluster holds.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// Nodes.
    pub nodes: u32,
    /// Global services.
    pub services: u32,
    /// Security identities.
    pub identities: u32,
    /// ipcache entries.
    pub ipcache: u32,
}

/// One cluster's name, ID and sizes.
///
/// Addresses (data in etcd; no test routes them): pods in `10.<id>.0.0/16` (entries past the
/// 65,536th in `100.64.0.0/10`, shared by every cluster), node `n`'s pod CIDR
/// `10.<id>.<n>.0/24` with its router IP `.1`, nodes in `172.16.0.0/12` ([`Self::host_ip`]).
/// Every ID of 1..=255 gives valid, distinct addresses: an earlier `10.<200 + id>` scheme
/// was not an address past ID 55, and kvstoremesh rightly refused those entries.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// Cluster name.
    pub name: String,
    /// Cluster ID (1..=255).
    pub id: u32,
    /// How much state.
    pub sizes: Sizes,
}

impl Cluster {
    /// One entry of the fixture (see the type docs).
    pub fn identity(&self, i: u32) -> u32 {
        (self.id << 16) + 256 + i
    }

    /// One entry of the fixture (see the type docs).
    pub fn node_name(&self, i: u32) -> String {
        format!("{}-node-{i}", self.name)
    }

    /// Every key/value of the cluster's state, in Cilium's layout.
    pub fn state(&self) -> Vec<(String, Vec<u8>)> {
        let s = self.sizes;
        let mut pairs = Vec::new();
        pairs.extend((0..s.nodes).map(|i| self.node(i)));
        pairs.extend((0..s.services).map(|i| self.service(i)));
        pairs.extend((0..s.identities).map(|i| self.identity_pair(i)));
        pairs.extend((0..s.ipcache).map(|i| self.ipcache(i)));
        pairs
    }

    /// The cluster config (`cilium/cluster-config/<name>`) announcing sync canaries.
    pub fn config(&self) -> (String, Vec<u8>) {
        let value = json!({"id": self.id, "capabilities": {"syncedCanaries": true, "maxConnectedClusters": 255}});
        (
            format!("cilium/cluster-config/{}", self.name),
            value.to_string().into_bytes(),
        )
    }

    /// The four sync canaries, written once the state is complete.
    pub fn canaries(&self) -> Vec<(String, Vec<u8>)> {
        [NODES, SERVICES, IDENTITIES, IPCACHE]
            .iter()
            .map(|prefix| self.canary(prefix))
            .collect()
    }

    /// The sync canary of one prefix (e.g. `cilium/state/nodes/v1`).
    pub fn canary(&self, prefix: &str) -> (String, Vec<u8>) {
        (
            format!("cilium/synced/{}/{prefix}", self.name),
            b"2026-11-29T00:00:00Z".to_vec(),
        )
    }

    /// Node `i`'s address: `172.16.0.0/12`, 4,096 nodes per cluster.
    pub fn host_ip(&self, i: u32) -> String {
        let (id, i) = (self.id & 0xff, i & 0xfff);
        format!(
            "172.{}.{}.{}",
            16 + (id >> 4),
            ((id & 15) << 4) | (i >> 8),
            i & 0xff
        )
    }

    /// One entry of the fixture (see the type docs).
    pub fn node(&self, i: u32) -> (String, Vec<u8>) {
        let name = self.node_name(i);
        let value = json!({
            "Name": name, "Cluster": self.name,
            "IPAddresses": [
                {"Type": "InternalIP", "IP": self.host_ip(i)},
                {"Type": "CiliumInternalIP", "IP": format!("10.{}.{}.1", self.id, i & 0xff)},
            ],
            "IPv4AllocCIDR": {"IP": format!("10.{}.{}.0", self.id, i & 0xff), "Mask": "////AA=="},
            "IPv6AllocCIDR": null, "IPv4HealthIP": "", "IPv6HealthIP": "",
            "IPv4IngressIP": "", "IPv6IngressIP": "",
            "ClusterID": self.id, "Source": "custom-resource", "EncryptionKey": 0,
            "Labels": {"kubernetes.io/hostname": name}, "Annotations": null,
            "NodeIdentity": 0, "WireguardPubKey": "",
        });
        (
            format!("{NODES}/{}/{name}", self.name),
            value.to_string().into_bytes(),
        )
    }

    /// One entry of the fixture (see the type docs).
    pub fn service(&self, i: u32) -> (String, Vec<u8>) {
        let name = format!("svc-{i}");
        let port = json!({"http": {"Protocol": "TCP", "Port": 8080}});
        let value = json!({
            "cluster": self.name, "namespace": "default", "name": name,
            "frontends": {format!("172.20.{}.{}", i >> 8, i & 0xff): {"http": {"Protocol": "TCP", "Port": 80}}},
            "backends": {format!("10.{}.{}.{}", self.id, i & 0xff, 10): port},
            "labels": {}, "selector": {"app": name}, "includeExternal": true, "shared": true,
            "clusterID": self.id,
        });
        (
            format!("{SERVICES}/{}/default/{name}", self.name),
            value.to_string().into_bytes(),
        )
    }

    /// One entry of the fixture (see the type docs).
    pub fn identity_pair(&self, i: u32) -> (String, Vec<u8>) {
        let labels = format!(
            "k8s:app=app-{i};k8s:io.cilium.k8s.policy.cluster={};k8s:io.kubernetes.pod.namespace=default;",
            self.name
        );
        (
            format!("{IDENTITIES}/id/{}", self.identity(i)),
            labels.into_bytes(),
        )
    }

    /// One entry of the fixture (see the type docs).
    pub fn ipcache(&self, i: u32) -> (String, Vec<u8>) {
        let ip = if i >> 16 == 0 {
            format!("10.{}.{}.{}", self.id, (i >> 8) & 0xff, i & 0xff)
        } else {
            format!("100.{}.{}.{}", 64 + (i >> 16), (i >> 8) & 0xff, i & 0xff)
        };
        let node = (i >> 8) % self.sizes.nodes.max(1);
        let value = json!({
            "IP": ip, "Mask": null,
            "HostIP": self.host_ip(node),
            "ID": self.identity(i % self.sizes.identities.max(1)), "Key": 0,
            "Metadata": format!("cilium-global:default:{}:{i}", self.node_name(node)),
            "K8sNamespace": "default", "K8sPodName": format!("pod-{i}"),
        });
        (
            format!("{IPCACHE}/default/{ip}"),
            value.to_string().into_bytes(),
        )
    }
}
