//! The `meshwork.operator.v1.NodeIpam` gRPC service: each node's latest published
//! CiliumNode as one snapshot. Status and pool come from the same stored generation, so a
//! client can never get a pool IP whose ENI is missing from the snapshot's ENIs.

use actix::{MailboxError, Recipient};
use meshwork_proto::operator::v1::node_ipam_server::{NodeIpam, NodeIpamServer};
use meshwork_proto::operator::v1::{Eni, GetNodeIpamRequest, NodeIpamSnapshot, PoolIp};
use meshwork_types::validate_node_name;
use tonic::{Request, Response, Status};

use crate::cilium_node::{CiliumNode, EniEntry};
use crate::manager::{GetSnapshot, Snapshot};

/// The snapshot of a published node.
pub fn snapshot(node: &CiliumNode) -> NodeIpamSnapshot {
    let status = node.status.clone().unwrap_or_default();
    NodeIpamSnapshot {
        node: node.metadata.name.clone().unwrap_or_default(),
        generation: node.metadata.resource_version.clone().unwrap_or_default(),
        pool: node
            .spec
            .ipam
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

/// The service, answering from the node manager.
#[derive(Debug, Clone)]
pub struct NodeIpamService {
    nodes: Recipient<GetSnapshot>,
}

impl NodeIpamService {
    /// A service asking `nodes` (the node manager) for snapshots.
    pub fn new(nodes: Recipient<GetSnapshot>) -> Self {
        Self { nodes }
    }

    /// The tonic server wrapper.
    pub fn into_server(self) -> NodeIpamServer<Self> {
        NodeIpamServer::new(self)
    }
}

fn unavailable(err: &MailboxError) -> Status {
    Status::unavailable(format!("node manager: {err}"))
}

#[tonic::async_trait]
impl NodeIpam for NodeIpamService {
    async fn get_node_ipam(
        &self,
        request: Request<GetNodeIpamRequest>,
    ) -> Result<Response<NodeIpamSnapshot>, Status> {
        let node = request.into_inner().node;
        if let Err(why) = validate_node_name(&node) {
            return Err(Status::invalid_argument(format!(
                "node {node:?} is not a CiliumNode name: {why}"
            )));
        }
        match self
            .nodes
            .send(GetSnapshot(node.clone()))
            .await
            .map_err(|err| unavailable(&err))?
        {
            Snapshot::Unknown => Err(Status::not_found(format!(
                "no ENI node {node:?} (no CiliumNode with spec.eni.instance-id)"
            ))),
            Snapshot::Unpublished => Err(Status::unavailable(format!(
                "node {node:?} has not been published yet"
            ))),
            Snapshot::Published(object) => Ok(Response::new(snapshot(&object))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cilium_node::{AllocationIp, CiliumNodeSpec, CiliumNodeStatus};

    #[test]
    fn a_snapshot_carries_pool_and_enis_of_one_generation() {
        let mut node = CiliumNode::new("n1", CiliumNodeSpec::default());
        node.metadata.resource_version = Some("42".to_owned());
        node.spec.ipam.pool.insert(
            "10.0.0.5".to_owned(),
            AllocationIp {
                owner: String::new(),
                resource: "eni-1".to_owned(),
            },
        );
        let mut status = CiliumNodeStatus::default();
        status.eni.enis.insert(
            "eni-1".to_owned(),
            EniEntry {
                id: "eni-1".to_owned(),
                number: 1,
                addresses: vec!["10.0.0.5".to_owned()],
                ..EniEntry::default()
            },
        );
        node.status = Some(status);
        let snapshot = snapshot(&node);
        assert_eq!(
            (snapshot.node.as_str(), snapshot.generation.as_str()),
            ("n1", "42")
        );
        assert_eq!(snapshot.pool.len(), 1);
        assert_eq!(snapshot.pool[0].resource, "eni-1");
        assert_eq!(snapshot.enis.len(), 1);
        assert_eq!(snapshot.enis[0].addresses, ["10.0.0.5"]);
    }
}
