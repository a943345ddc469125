//! The operator session (ENI mode): one tokio task, in the publisher's style, that keeps
//! `meshwork.ipam.v1.NodeIpam` open.
//!
//! Each session: connect (TLS when configured; HTTP/2 keepalive, so a vanished operator is
//! noticed) → `RegisterNode` (idempotent: every session declares the spec again, so an
//! operator that lost the node learns it) → `WatchNode`, each snapshot handed to the pool →
//! `ReportUsage` whenever a report is due: after allocations and releases (coalesced: the
//! changes made while a report is in flight go in the next one), when a snapshot has IPs
//! marked for release, and once after every (re)connect. A report the operator refuses
//! (FAILED_PRECONDITION: the generation is unknown to it; or INVALID_ARGUMENT, NOT_FOUND,
//! PERMISSION_DENIED) is sent again, fresh, with the next snapshot; any other failure ends
//! the session. A lost session reconnects with backoff (200 ms to 30 s, jittered; reset
//! after a session that lasted 30 s); the pool keeps allocating from its last snapshot
//! meanwhile.

use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBuilder};
use meshwork_proto::ipam::v1 as pb;
use meshwork_proto::ipam::v1::node_ipam_client::NodeIpamClient;
use tokio::task::JoinHandle;
use tonic::transport::{ClientTlsConfig, Endpoint};
use tonic::{Code, Status};

use super::{Ipam, IpamSettings, convert};

/// A session that lasted this long was no failure pattern: the backoff starts over.
const STABLE_SESSION: Duration = Duration::from_secs(30);

/// What the session needs.
#[derive(Debug, Clone)]
pub struct ClientSettings {
    /// `--operator-addr` (`http(s)://HOST:PORT`).
    pub addr: String,
    /// The TLS to the operator.
    pub tls: Option<ClientTlsConfig>,
    /// The node's spec, as registered.
    pub register: pb::RegisterNodeRequest,
    /// Pacing.
    pub settings: IpamSettings,
}

/// Starts the session task feeding `ipam`.
pub fn start(ipam: Ipam, settings: ClientSettings) -> JoinHandle<()> {
    tokio::spawn(run(ipam, settings))
}

async fn run(ipam: Ipam, client: ClientSettings) {
    let backoff = ExponentialBuilder::default()
        .with_min_delay(client.settings.min_retry_delay)
        .with_max_delay(client.settings.max_retry_delay)
        .with_jitter()
        .without_max_times();
    let mut delays = backoff.build();
    loop {
        let started = tokio::time::Instant::now();
        let ended = session(&ipam, &client).await;
        ipam.set_connected(false);
        if started.elapsed() > STABLE_SESSION {
            delays = backoff.build();
        }
        let delay = delays.next().unwrap_or(client.settings.max_retry_delay);
        tracing::warn!(addr = %client.addr, status = %ended, ?delay, "IPAM: the operator session ended; reconnecting (allocating from the last snapshot meanwhile)");
        tokio::time::sleep(delay).await;
    }
}

/// One session, until it fails.
async fn session(ipam: &Ipam, client: &ClientSettings) -> Status {
    let node = client.register.node.clone();
    let endpoint = match Endpoint::from_shared(client.addr.clone()) {
        Ok(endpoint) => endpoint
            .connect_timeout(client.settings.connect_timeout)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true),
        Err(err) => {
            return Status::invalid_argument(format!("--operator-addr {:?}: {err}", client.addr));
        }
    };
    let endpoint = match &client.tls {
        Some(tls) => match endpoint.tls_config(tls.clone()) {
            Ok(endpoint) => endpoint,
            Err(err) => return Status::invalid_argument(format!("the operator's TLS: {err}")),
        },
        None => endpoint,
    };
    let channel = match endpoint.connect().await {
        Ok(channel) => channel,
        Err(err) => {
            return Status::unavailable(format!("connecting to {}: {err}", client.addr));
        }
    };
    let mut operator = NodeIpamClient::new(channel);
    let registered = match operator.register_node(client.register.clone()).await {
        Ok(response) => response.into_inner(),
        Err(status) => return status,
    };
    tracing::info!(addr = %client.addr, %node, created = registered.created, generation = %registered.generation, "IPAM: node registered with the operator");
    let mut snapshots = match operator
        .watch_node(pb::WatchNodeRequest { node: node.clone() })
        .await
    {
        Ok(response) => response.into_inner(),
        Err(status) => return status,
    };
    ipam.set_connected(true);
    // The operator hears the current usage after every (re)connect.
    ipam.mark_report_due();
    // The generation a report of which the operator refused: wait for the next one.
    let mut refused: Option<String> = None;
    loop {
        if let Some(report) = ipam.take_report(refused.as_deref()) {
            let request = convert::report(&node, &report);
            let sent = tokio::time::timeout(
                client.settings.report_timeout,
                operator.report_usage(request),
            )
            .await
            .unwrap_or_else(|_| Err(Status::deadline_exceeded("ReportUsage took too long")));
            match sent {
                Ok(response) => {
                    let response = response.into_inner();
                    tracing::debug!(
                        generation = %report.generation,
                        stored = %response.generation,
                        used = report.used.len(),
                        answers = report.answers.len(),
                        answers_applied = response.answers_applied,
                        "IPAM: usage reported"
                    );
                    refused = None;
                }
                Err(status)
                    if matches!(
                        status.code(),
                        Code::FailedPrecondition
                            | Code::InvalidArgument
                            | Code::NotFound
                            | Code::PermissionDenied
                    ) =>
                {
                    tracing::warn!(generation = %report.generation, %status, "IPAM: the operator refused the usage report; reporting again with the next snapshot");
                    ipam.mark_report_due();
                    refused = Some(report.generation);
                }
                Err(status) => {
                    ipam.mark_report_due();
                    return status;
                }
            }
        }
        tokio::select! {
            () = ipam.shared.changed.notified() => {}
            message = snapshots.message() => match message {
                Ok(Some(snapshot)) => ipam.offer(snapshot).await,
                Ok(None) => return Status::unavailable("the operator ended the snapshot stream"),
                Err(status) => return status,
            },
        }
    }
}
