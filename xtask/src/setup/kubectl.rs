//! kubectl, which the manifests' tests render with (`kubectl kustomize`, offline). Debian's
//! archive has no kubectl, so setup installs nothing: it reports the one found, or fails
//! saying how to get one.

use super::probe::{Component, Probe};
use super::{Row, Status};

/// kubectl, found on `PATH` (or in /usr/bin and the sbin directories).
const KUBECTL: Component =
    Component::program("kubectl", "kubectl", &["kubectl"], &["version", "--client"]);

/// How to get kubectl when it is missing.
const HOW: &str = "install it from the Kubernetes project's apt repository \
                   (https://pkgs.k8s.io, package kubectl) or as a release binary \
                   (https://dl.k8s.io/release/<version>/bin/linux/amd64/kubectl) on PATH";

/// kubectl's line of the report.
pub fn row() -> Row {
    let status = match KUBECTL.probe() {
        Probe::Present(detail) => Status::Present(detail),
        Probe::Missing(why) => Status::Failed(format!("{why}: {HOW}")),
    };
    Row {
        name: KUBECTL.name,
        status,
    }
}
