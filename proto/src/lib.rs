//! Meshwork's gRPC API, generated at build time from `proto/meshwork/**/*.proto` (protox +
//! tonic-prost-build, no system `protoc`).
//!
//! - [`agent::v1`]: the agent's local API (`meshwork.agent.v1.Agent`), served on a unix
//!   socket for `meshctl`: [`agent::v1::agent_client::AgentClient`] and
//!   [`agent::v1::agent_server::AgentServer`]; its WireGuard status
//!   (`meshwork.agent.v1.Encrypt`): [`agent::v1::encrypt_client::EncryptClient`].
//! - [`apiserver::v1`]: the apiserver's `Export` (`meshwork.apiserver.v1.Export`): agents
//!   publish their node and endpoints, operators declare global services.
//! - [`kvstoremesh::v1`]: kvstoremesh's status (`meshwork.kvstoremesh.v1.KvstoreMesh`):
//!   the remote clusters it caches, in the agent's shape, and the cache's state.
//! - [`ipam::v1`]: the operator's IPAM API for agents (`meshwork.ipam.v1.NodeIpam`): a node
//!   registers its CiliumNode spec, watches its published snapshots (status and pool of one
//!   generation) and reports its usage and release answers.
//! - [`standard`]: health and reflection, which every Meshwork gRPC server adds.
//! - [`connect_unix`]: a tonic [`Channel`](tonic::transport::Channel) to a unix socket.

pub mod standard;
mod unix;

pub use standard::{FILE_DESCRIPTOR_SET, Readiness, StandardServices};
pub use unix::{ConnectError, connect_unix, connect_unix_with};

/// The agent's API, package `meshwork.agent.v1`.
pub mod agent {
    /// Version 1 of the agent's local API.
    pub mod v1 {
        // Generated code: messages without proto comments have no docs, and prost's output
        // is not written to this workspace's lint set.
        #![allow(
            missing_docs,
            unused_qualifications,
            rust_2018_idioms,
            clippy::all,
            clippy::pedantic
        )]
        tonic::include_proto!("meshwork.agent.v1");
    }
}

/// The apiserver's API, package `meshwork.apiserver.v1`.
pub mod apiserver {
    /// Version 1 of the apiserver's API: what a cluster exports.
    pub mod v1 {
        // Generated code, as for the agent's API.
        #![allow(
            missing_docs,
            unused_qualifications,
            rust_2018_idioms,
            clippy::all,
            clippy::pedantic
        )]
        tonic::include_proto!("meshwork.apiserver.v1");
    }
}

/// kvstoremesh's API, package `meshwork.kvstoremesh.v1`.
pub mod kvstoremesh {
    /// Version 1 of kvstoremesh's status API.
    pub mod v1 {
        // Generated code, as for the agent's API.
        #![allow(
            missing_docs,
            unused_qualifications,
            rust_2018_idioms,
            clippy::all,
            clippy::pedantic
        )]
        tonic::include_proto!("meshwork.kvstoremesh.v1");
    }
}

/// The operator's IPAM API, package `meshwork.ipam.v1`.
pub mod ipam {
    /// Version 1 of the operator's IPAM API.
    pub mod v1 {
        // Generated code, as for the agent's API.
        #![allow(
            missing_docs,
            unused_qualifications,
            rust_2018_idioms,
            clippy::all,
            clippy::pedantic
        )]
        tonic::include_proto!("meshwork.ipam.v1");
    }
}
