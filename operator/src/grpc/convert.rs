//! From a stored CiliumNode to the API's `NodeSnapshot`: status and pool of that one stored
//! generation, so a client can never get a pool IP whose ENI is missing from the snapshot's
//! ENIs. Also the one deliberately broken snapshot, for the test hook.

use meshwork_proto::ipam::v1::{Eni, NodeSnapshot, PoolIp};

use crate::cilium_node::{CiliumNode, EniEntry};

/// What the test hook appends to the generation of the broken snapshot it sends: never a
/// generation the operator published, so no report can answer it.
pub const INCONSISTENT_GENERATION_SUFFIX: &str = "-test-hook-inconsistent";

/// A watermark as the API carries it (the store's are `i64`, the API's `int32`).
fn watermark(value: i64) -> i32 {
    i32::try_from(value).unwrap_or(if value < 0 { i32::MIN } else { i32::MAX })
}

/// The snapshot of a published node.
pub fn snapshot(node: &CiliumNode) -> NodeSnapshot {
    let status = node.status.clone().unwrap_or_default();
    let ipam = &node.spec.ipam;
    NodeSnapshot {
        node: node.metadata.name.clone().unwrap_or_default(),
        generation: node.metadata.resource_version.clone().unwrap_or_default(),
        pool: ipam
            .pool
            .iter()
            .map(|(ip, allocation)| PoolIp {
                ip: ip.clone(),
                resource: allocation.resource.clone(),
            })
            .collect(),
        enis: status.eni.enis.values().map(eni).collect(),
        operator_error: status.ipam.operator_status.error,
        release_ips: status.ipam.release_ips.into_iter().collect(),
        pre_allocate: watermark(ipam.pre_allocate),
        min_allocate: watermark(ipam.min_allocate),
        max_allocate: watermark(ipam.max_allocate),
        max_above_watermark: watermark(ipam.max_above_watermark),
    }
}

fn eni(entry: &EniEntry) -> Eni {
    Eni {
        id: entry.id.clone(),
        ip: entry.ip.clone(),
        mac: entry.mac.clone(),
        number: entry.number,
        subnet_id: entry.subnet.id.clone(),
        subnet_cidr: entry.subnet.cidr.clone(),
        vpc_id: entry.vpc.id.clone(),
        vpc_cidrs: entry.vpc.cidrs.clone(),
        addresses: entry.addresses.clone(),
        prefixes: entry.prefixes.clone(),
        security_groups: entry.security_groups.clone(),
    }
}

/// The snapshot Cilium's ordering bug produced (pool written before the status naming its
/// newest ENI): `snapshot` without the highest-numbered ENI that a pool IP names, under a
/// generation of its own. `None` when the pool is empty (nothing to break).
pub fn inconsistent(snapshot: &NodeSnapshot) -> Option<NodeSnapshot> {
    let newest = snapshot
        .enis
        .iter()
        .filter(|eni| snapshot.pool.iter().any(|ip| ip.resource == eni.id))
        .max_by_key(|eni| eni.number)?
        .id
        .clone();
    let mut broken = snapshot.clone();
    broken.enis.retain(|eni| eni.id != newest);
    broken.generation = format!("{}{INCONSISTENT_GENERATION_SUFFIX}", snapshot.generation);
    Some(broken)
}

/// Pool IPs of `snapshot` whose ENI is not among its ENIs (empty for every snapshot the
/// operator publishes).
pub fn pool_ips_without_eni(snapshot: &NodeSnapshot) -> Vec<&PoolIp> {
    snapshot
        .pool
        .iter()
        .filter(|ip| !snapshot.enis.iter().any(|eni| eni.id == ip.resource))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cilium_node::{AllocationIp, CiliumNodeSpec, CiliumNodeStatus};

    fn published() -> CiliumNode {
        let mut node = CiliumNode::new("n1", CiliumNodeSpec::default());
        node.metadata.resource_version = Some("42".to_owned());
        node.spec.ipam.pre_allocate = 8;
        node.spec.ipam.min_allocate = 2;
        node.spec.ipam.max_allocate = 30;
        node.spec.ipam.max_above_watermark = 1;
        let mut status = CiliumNodeStatus::default();
        for (id, number, ip) in [("eni-0", 0, "10.0.0.4"), ("eni-1", 1, "10.0.0.5")] {
            node.spec.ipam.pool.insert(
                ip.to_owned(),
                AllocationIp {
                    owner: String::new(),
                    resource: id.to_owned(),
                },
            );
            status.eni.enis.insert(
                id.to_owned(),
                EniEntry {
                    id: id.to_owned(),
                    number,
                    addresses: vec![ip.to_owned()],
                    ..EniEntry::default()
                },
            );
        }
        status
            .ipam
            .release_ips
            .insert("10.0.0.5".to_owned(), "marked-for-release".to_owned());
        node.status = Some(status);
        node
    }

    #[test]
    fn a_snapshot_carries_pool_enis_and_watermarks_of_one_generation() {
        let snapshot = snapshot(&published());
        assert_eq!(
            (snapshot.node.as_str(), snapshot.generation.as_str()),
            ("n1", "42")
        );
        assert_eq!(snapshot.pool.len(), 2);
        assert_eq!(snapshot.enis.len(), 2);
        assert!(pool_ips_without_eni(&snapshot).is_empty());
        assert_eq!(
            (
                snapshot.pre_allocate,
                snapshot.min_allocate,
                snapshot.max_allocate,
                snapshot.max_above_watermark
            ),
            (8, 2, 30, 1)
        );
        assert_eq!(
            snapshot.release_ips.get("10.0.0.5").map(String::as_str),
            Some("marked-for-release")
        );
    }

    #[test]
    fn the_inconsistent_snapshot_lacks_the_newest_eni_and_has_a_generation_of_its_own() {
        let real = snapshot(&published());
        let broken = inconsistent(&real).expect("a pool to break");
        let missing: Vec<&str> = pool_ips_without_eni(&broken)
            .iter()
            .map(|ip| ip.resource.as_str())
            .collect();
        assert_eq!(missing, ["eni-1"], "the ENI at the highest device index");
        assert_ne!(broken.generation, real.generation);
        assert_eq!(broken.pool, real.pool);

        let mut empty = real;
        empty.pool.clear();
        assert!(inconsistent(&empty).is_none(), "an empty pool cannot break");
    }

    #[test]
    fn watermarks_beyond_the_api_saturate() {
        assert_eq!(watermark(i64::MAX), i32::MAX);
        assert_eq!(watermark(i64::MIN), i32::MIN);
        assert_eq!(watermark(-3), -3);
    }
}
