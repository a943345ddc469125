//! Metrics of EC2 calls (`meshwork_ipam_api_*` once registered in a registry with prefix
//! `meshwork`), named and labelled as Cilium's `ipam_api_*`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of `ipam_api_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// The EC2 action, e.g. `CreateNetworkInterface`.
    pub operation: String,
    /// `OK`, or EC2's error code (or the SDK's failure kind when EC2 did not answer).
    pub response_code: String,
}

/// Labels of `ipam_api_rate_limit_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    /// The EC2 action.
    pub operation: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn seconds_histogram() -> Histogram {
    // 1 ms … ~33 s: from a local moto answer to a call that sat out the SDK's retries.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// Handles to the EC2 metrics; clones share the same series.
#[derive(Clone, Debug)]
pub struct Ec2Metrics {
    /// Duration of each EC2 call (after the token bucket), by operation and answer.
    pub api_duration: HistogramFamily<CallLabels>,
    /// Time each call waited for the token bucket, by operation.
    pub rate_limit_duration: HistogramFamily<OperationLabels>,
}

impl Default for Ec2Metrics {
    fn default() -> Self {
        Self {
            api_duration: Family::new_with_constructor(seconds_histogram),
            rate_limit_duration: Family::new_with_constructor(seconds_histogram),
        }
    }
}

impl Ec2Metrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "ipam_api_duration_seconds",
            "Duration of interactions with the EC2 API",
            metrics.api_duration.clone(),
        );
        registry.register(
            "ipam_api_rate_limit_duration_seconds",
            "Duration of client-side rate limiter blocking before an EC2 call",
            metrics.rate_limit_duration.clone(),
        );
        metrics
    }

    pub(crate) fn observe_call(&self, operation: &str, response_code: &str, seconds: f64) {
        self.api_duration
            .get_or_create(&CallLabels {
                operation: operation.to_owned(),
                response_code: response_code.to_owned(),
            })
            .observe(seconds);
    }

    pub(crate) fn observe_wait(&self, operation: &str, seconds: f64) {
        self.rate_limit_duration
            .get_or_create(&OperationLabels {
                operation: operation.to_owned(),
            })
            .observe(seconds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn names_carry_the_meshwork_prefix() {
        let mut registry = Registry::with_prefix("meshwork");
        let metrics = Ec2Metrics::register(&mut registry);
        metrics.observe_call("AttachNetworkInterface", "OK", 0.01);
        metrics.observe_wait("AttachNetworkInterface", 0.0);
        let mut text = String::new();
        encode(&mut text, &registry).expect("encode");
        assert!(text.contains(
            "meshwork_ipam_api_duration_seconds_count{operation=\"AttachNetworkInterface\",response_code=\"OK\"} 1"
        ), "{text}");
        assert!(text.contains(
            "meshwork_ipam_api_rate_limit_duration_seconds_count{operation=\"AttachNetworkInterface\"} 1"
        ), "{text}");
    }
}
