//! Meshwork's AWS ENI IPAM operator: allocates ENIs and secondary IPv4 addresses through EC2
//! for every node, the way Cilium's operator does in ENI mode (contract:
//! `cilium-semantics.md` §7).
//!
//! - [`ec2`]: the EC2 client; every call waits for one shared token bucket and is measured.
//! - [`limits`]: per-instance-type ENI and address limits (DescribeInstanceTypes, overridable).
//! - [`allocation`]: Cilium's needed/excess arithmetic, as pure functions.
//! - [`instances`]: the describe cache (VPCs, subnets, security groups, ENIs per instance).
//! - [`node_allocator`]: per node, decides the next EC2 action from the cache and executes it.
//! - [`cilium_node`]: the CiliumNode custom resource, and conversions into it.
//! - [`node_store`]: where CiliumNodes live (Kubernetes or etcd) and the publishing rule.
//! - [`grpc`]: the `meshwork.ipam.v1.NodeIpam` gRPC service: a node registers its spec,
//!   watches its published snapshots and reports its usage and release answers.
//! - [`args`]: the binary's command line (here so a manifest's args parse as the binary
//!   parses them).
//! - [`leader_election`]: one active replica in Kubernetes, on a `coordination.k8s.io` Lease.
//! - [`manager`]: the actors (`NodeManager`, `InstancesManager`), the worst-deficit queue,
//!   passes, resync scheduling, and learning nodes from the store.

pub mod allocation;
pub mod args;
pub mod cilium_node;
pub mod ec2;
pub mod grpc;
pub mod instances;
pub mod leader_election;
pub mod limits;
pub mod manager;
pub mod model;
pub mod node_allocator;
pub mod node_store;
