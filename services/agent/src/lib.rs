//! `meshwork-agent` as a library: the one wiring of the agent's actors ([`AgentBuilder`]),
//! used by the binary, the tests and the scenarios, and the actor shells of the datapath and
//! WireGuard layers (whose crates hold no actors).
//!
//! - [`args`]: the agent's flags (Cilium's names and defaults).
//! - [`builder`]: start-up in phases, and the running [`Agent`].
//! - [`datapath`]: the `DatapathWriter` and `EndpointManager` actors, the Datapath API.
//! - [`wireguard`]: the `WireGuard` actor, the Encrypt API.
//! - [`publisher`]: this node and its endpoints published to the cluster's apiserver.
//! - [`ipam`]: pod IPs (`--ipam eni | cluster-pool`), the operator session, the Ipam API.

pub mod api;
pub mod args;
pub mod builder;
pub mod datapath;
pub mod ipam;
pub mod publisher;
pub mod wireguard;

pub use args::Args;
pub use builder::{Agent, AgentBuilder, StartError};
