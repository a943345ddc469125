//! Checks of Meshwork's Kubernetes manifests (`deploy/kubernetes`) that no schema makes,
//! on a rendering (`kubectl kustomize` of an overlay):
//!
//! - [`selectors`]: a workload's selector selects its own pods; a Service's and a
//!   PodDisruptionBudget's select some workload's.
//! - [`references`]: every ServiceAccount, Secret and ConfigMap (and key) a workload or
//!   binding names exists, every mount's volume and every object's namespace too.
//! - [`analysis`]: every container's command is a binary of its image, its `$(VAR)`s
//!   resolve in its environment (downward API, ConfigMaps, Secrets, Services' link
//!   variables, which need the Service created first), and its args parse with that
//!   binary's own flag parser ([`binaries`]: the libraries' `parse_args`; etcd's against its
//!   flag list, [`etcd`]).
//! - [`probes`]: every container port is one the binary listens on, every listener is
//!   declared, every probe reaches a listener serving its path (or plaintext gRPC), or runs
//!   the image's own probe command against this container's socket; every Service port
//!   reaches a listener.
//! - [`config`]: every key of `meshwork-config` reaches the flag named like it; every file
//!   a flag names is on a mount that holds it; etcd client certificates name the etcd user
//!   they need; clustermesh config directories pass the agent's own parser, at Cilium's
//!   path, with the files they name beside them; the CNI plugin's conflist names the
//!   agent's socket as the node sees it.
//! - [`dials`]: every address a flag or a clustermesh file dials reaches a listener or a
//!   host alias, and over TLS a certificate that names it.
//! - [`rbac`]: the operator's service account may make every call the operator makes.
//!
//! [`render`] runs `kubectl kustomize` and `kubernetes-validate --strict`.

pub mod analysis;
pub mod binaries;
pub mod config;
pub mod dials;
pub mod env;
pub mod etcd;
pub mod files;
pub mod manifest;
pub mod pod;
pub mod probes;
pub mod rbac;
pub mod references;
pub mod render;
pub mod selectors;

#[cfg(test)]
mod tests;

pub use manifest::{Manifests, Object};

/// Something that does not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The object (and container) it is about.
    pub subject: String,
    /// What does not hold.
    pub message: String,
}

impl Finding {
    /// A finding about `subject`.
    pub fn new(subject: &str, message: impl Into<String>) -> Self {
        Self {
            subject: subject.to_owned(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.subject, self.message)
    }
}

/// Every check, on one rendering; no finding means it holds.
pub fn check(manifests: &Manifests) -> Vec<Finding> {
    let mut findings = Vec::new();
    selectors::check(manifests, &mut findings);
    references::check(manifests, &mut findings);
    let pods = analysis::analyze(manifests, &mut findings);
    probes::check(manifests, &pods, &mut findings);
    config::check(manifests, &pods, &mut findings);
    dials::check(manifests, &pods, &mut findings);
    rbac::check(manifests, &pods, &mut findings);
    findings
}
