//! The order in which restored endpoints regenerate (§5), as a plain function.

use std::time::Duration;

use super::spec::EndpointSpec;

/// The IPsec cap on the wait: the host endpoint regenerates synchronously first, so the other
/// endpoints cannot wait long for remote clusters.
pub const IPSEC_WAIT_CAP: Duration = Duration::from_secs(5);

/// What to regenerate at once and what after the `IPIdentitiesSynced` wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestorePlan {
    /// Regenerated synchronously before anything waits (the host endpoint with IPsec).
    pub immediate: Vec<u64>,
    /// Regenerated after the wait.
    pub after_wait: Vec<u64>,
    /// How long the wait may take.
    pub wait_timeout: Duration,
}

/// Plans the regeneration of `restored` endpoints.
pub fn restore_plan(
    restored: &[EndpointSpec],
    enable_ipsec: bool,
    timeout: Duration,
) -> RestorePlan {
    let (immediate, after_wait): (Vec<_>, Vec<_>) =
        restored.iter().partition(|spec| enable_ipsec && spec.host);
    RestorePlan {
        immediate: immediate.iter().map(|s| s.id).collect(),
        after_wait: after_wait.iter().map(|s| s.id).collect(),
        wait_timeout: if enable_ipsec {
            timeout.min(IPSEC_WAIT_CAP)
        } else {
            timeout
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::spec::test_spec;

    fn spec(id: u64, host: bool) -> EndpointSpec {
        EndpointSpec {
            host,
            ..test_spec(id)
        }
    }

    #[test]
    fn plans_follow_cilium() {
        let eps = [spec(1, true), spec(2, false), spec(3, false)];
        let minute = Duration::from_secs(60);
        let cases = [
            // (ipsec, timeout, immediate, after, wait)
            (false, minute, vec![], vec![1, 2, 3], minute),
            (true, minute, vec![1], vec![2, 3], IPSEC_WAIT_CAP),
            (
                true,
                Duration::from_secs(2),
                vec![1],
                vec![2, 3],
                Duration::from_secs(2),
            ),
            (false, Duration::ZERO, vec![], vec![1, 2, 3], Duration::ZERO),
        ];
        for (ipsec, timeout, immediate, after_wait, wait_timeout) in cases {
            assert_eq!(
                restore_plan(&eps, ipsec, timeout),
                RestorePlan {
                    immediate,
                    after_wait,
                    wait_timeout
                },
                "ipsec={ipsec} timeout={timeout:?}"
            );
        }
    }
}
