//! The EC2 client of the operator: aws-sdk-ec2 with the SDK's standard retry, behind one
//! token bucket, every call measured.
//!
//! Each logical call (one page of a describe, one mutation) takes one token; the SDK's own
//! retries of that call happen inside it, paced by the SDK's retry backoff and its retry
//! quota rather than by the bucket.

mod calls;
mod convert;
mod error;
mod limiter;
mod metrics;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_config::BehaviorVersion;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_ec2::config::{Credentials, Region};
use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};

pub use calls::{CreateEniRequest, SubnetFilter, attached_to};
pub use error::Ec2Error;
pub use limiter::{ApiLimiter, DEFAULT_BURST, DEFAULT_QPS, LimiterError};
pub use metrics::{CallLabels, Ec2Metrics, OperationLabels};

/// Items per describe page by default (EC2's maximum for the describes used here).
pub const DEFAULT_PAGE_SIZE: i32 = 1000;
/// EC2's minimum page size.
const MIN_PAGE_SIZE: i32 = 5;

/// Deadline of one attempt of one EC2 call; the SDK retries a timed-out attempt.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// Deadline of one EC2 call, retries included.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(30);

/// Where and how to reach EC2.
#[derive(Debug, Clone, PartialEq)]
pub struct Ec2Config {
    /// The region (`--aws-region`).
    pub region: String,
    /// An endpoint URL replacing EC2's (`--ec2-endpoint`, e.g. moto on 127.0.0.1). Static
    /// dummy credentials are used with it, since such an endpoint does not check them and
    /// the default chain would go looking for instance metadata.
    pub endpoint: Option<String>,
    /// Sustained EC2 calls per second (`--limit-ipam-api-qps`).
    pub qps: f64,
    /// Calls that may go out back to back (`--limit-ipam-api-burst`).
    pub burst: u32,
}

impl Ec2Config {
    /// Real EC2 in `region`, default rate limits.
    pub fn new(region: impl Into<String>) -> Self {
        Self {
            region: region.into(),
            endpoint: None,
            qps: DEFAULT_QPS,
            burst: DEFAULT_BURST,
        }
    }

    /// The same, at another endpoint.
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }
}

/// The settings could not make a client.
#[derive(Debug, thiserror::Error)]
pub enum Ec2SetupError {
    /// Unusable rate limits.
    #[error(transparent)]
    Limiter(#[from] LimiterError),
}

/// The EC2 client; clones share the token bucket and the metrics.
#[derive(Debug, Clone)]
pub struct Ec2 {
    client: aws_sdk_ec2::Client,
    limiter: Arc<ApiLimiter>,
    metrics: Ec2Metrics,
    page_size: i32,
}

impl Ec2 {
    /// Builds the client. Metrics go to `metrics` (register them first to export them).
    pub async fn connect(config: &Ec2Config, metrics: Ec2Metrics) -> Result<Self, Ec2SetupError> {
        let limiter = ApiLimiter::new(config.qps, config.burst)?;
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .region(Region::new(config.region.clone()))
            .retry_config(RetryConfig::standard())
            .timeout_config(
                TimeoutConfig::builder()
                    .operation_attempt_timeout(ATTEMPT_TIMEOUT)
                    .operation_timeout(OPERATION_TIMEOUT)
                    .build(),
            );
        if let Some(endpoint) = &config.endpoint {
            loader = loader
                .endpoint_url(endpoint)
                .credentials_provider(Credentials::new(
                    "testing",
                    "testing",
                    None,
                    None,
                    "meshwork-static",
                ));
        }
        let sdk_config = loader.load().await;
        Ok(Self {
            client: aws_sdk_ec2::Client::new(&sdk_config),
            limiter: Arc::new(limiter),
            metrics,
            page_size: DEFAULT_PAGE_SIZE,
        })
    }

    /// The same client with another describe page size (clamped to EC2's 5–1000), e.g. to
    /// exercise pagination.
    pub fn with_page_size(mut self, page_size: i32) -> Self {
        self.page_size = page_size.clamp(MIN_PAGE_SIZE, DEFAULT_PAGE_SIZE);
        self
    }

    /// The metrics this client records into.
    pub fn metrics(&self) -> &Ec2Metrics {
        &self.metrics
    }

    /// Runs one EC2 call: waits for a token, sends, records both durations. `request` is the
    /// SDK's lazy `send()` future, so nothing goes out before the token is taken.
    async fn call<T, E, R>(
        &self,
        operation: &'static str,
        request: impl Future<Output = Result<T, SdkError<E, R>>>,
    ) -> Result<T, Ec2Error>
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
        R: std::fmt::Debug,
    {
        let waited = self.limiter.acquire().await;
        self.metrics.observe_wait(operation, waited.as_secs_f64());
        let start = Instant::now();
        let result = request.await;
        let seconds = start.elapsed().as_secs_f64();
        match result {
            Ok(output) => {
                self.metrics.observe_call(operation, "OK", seconds);
                Ok(output)
            }
            Err(err) => {
                let err = Ec2Error::from_sdk(operation, &err);
                self.metrics
                    .observe_call(operation, err.response_code(), seconds);
                tracing::debug!(%err, "EC2 call failed");
                Err(err)
            }
        }
    }
}
