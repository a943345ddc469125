//! An endpoint as the agent persists it: what its program needs after a restart.

use std::net::IpAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::super::program::AttachPoint;

/// A local endpoint (a pod, or the host with `host`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointSpec {
    /// Unique, non-zero.
    pub id: u64,
    /// The host side of the endpoint's veth.
    pub interface: String,
    /// The network namespace holding `interface` (`/run/netns/NAME`); absent: the agent's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<PathBuf>,
    /// The endpoint's IPs (written to the ipcache with `identity`, tunnel endpoint 0).
    pub ips: Vec<IpAddr>,
    /// The endpoint's security identity.
    pub identity: u32,
    /// Destination identities its traffic may reach; everything else is dropped.
    pub allowed_identities: Vec<u32>,
    /// The host endpoint (regenerated first and synchronously with IPsec).
    #[serde(default)]
    pub host: bool,
    /// Its security labels (`source:key=value`), published to the apiserver, which
    /// allocates `identity` for them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    /// The pod it is, `namespace/name`; absent for an endpoint that is no pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
}

/// Why a spec is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// Missing or zero field.
    #[error("endpoint {id}: {what}")]
    Invalid {
        /// The endpoint.
        id: u64,
        /// What is wrong.
        what: &'static str,
    },
}

impl EndpointSpec {
    /// Checks the fields a program needs.
    pub fn validate(&self) -> Result<(), SpecError> {
        let invalid = |what| Err(SpecError::Invalid { id: self.id, what });
        if self.id == 0 {
            return invalid("the ID must not be 0");
        }
        if self.interface.is_empty() || self.interface.len() > 15 {
            return invalid("the interface name must have 1 to 15 characters");
        }
        if self.identity == 0 {
            return invalid("identity 0 is not valid");
        }
        if self.ips.is_empty() {
            return invalid("an endpoint needs at least one IP");
        }
        Ok(())
    }

    /// The pod's namespace and name; empty ones for an endpoint that is no pod.
    pub fn pod_parts(&self) -> (String, String) {
        self.pod
            .as_deref()
            .and_then(|pod| pod.split_once('/'))
            .map(|(ns, name)| (ns.to_owned(), name.to_owned()))
            .unwrap_or_default()
    }

    /// Where its program is attached.
    pub fn attach_point(&self) -> AttachPoint {
        AttachPoint {
            netns: self.netns.clone(),
            interface: self.interface.clone(),
        }
    }
}

/// An endpoint for unit tests: `lxc<id>` in the agent's namespace, one IP, identity 1000.
#[cfg(test)]
pub(crate) fn test_spec(id: u64) -> EndpointSpec {
    EndpointSpec {
        id,
        interface: format!("lxc{id}"),
        netns: None,
        ips: vec!["10.214.1.10".parse().expect("an IP")],
        identity: 1000,
        allowed_identities: vec![2000],
        host: false,
        labels: Vec::new(),
        pod: None,
    }
}
