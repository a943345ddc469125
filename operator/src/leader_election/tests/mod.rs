//! Tests of the election: the elector's decisions in paused time ([`state`]), the driver
//! with two candidates on one in-memory lease ([`driver`]), and the exact Kubernetes
//! requests ([`kube`]).

mod driver;
mod kube;
mod state;

use std::time::Duration;

use super::Timing;

/// Cilium's defaults: 15 s lease, 10 s renew deadline, 2 s retry period.
fn timing() -> Timing {
    Timing::default()
}

/// A millisecond, for "just before" and "just after".
const MS: Duration = Duration::from_millis(1);
