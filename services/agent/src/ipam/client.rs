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
    /// The node's spec, as registered; an empty instance ID is asked of the metadata
    /// service before the first registration.
    pub register: pb::RegisterNodeRequest,
    /// `--eni-metadata-endpoint`.
    pub metadata_endpoint: String,
    /// Pacing.
    pub settings: IpamSettings,
}

/// Starts the session task feeding `ipam`.
pub fn start(ipam: Ipam, settings: ClientSettings) -> JoinHandle<()> {
    tokio::spawn(run(ipam, settings))
}

async fn run(ipam: Ipam, mut client: ClientSettings) {
    let backoff = ExponentialBuilder::default()
        .with_min_delay(client.settings.min_retry_delay)
        .with_max_delay(client.settings.max_retry_delay)
        .with_jitter()
        .without_max_times();
    let mut delays = backoff.build();
    loop {
        let started = tokio::time::Instant::now();
        let ended = match learn_instance_id(&mut client).await {
            Ok(()) => session(&ipam, &client).await,
            Err(status) => status,
        };
        ipam.set_connected(false);
        if started.elapsed() > STABLE_SESSION {
            delays = backoff.build();
        }
        let delay = delays.next().unwrap_or(client.settings.max_retry_delay);
        tracing::warn!(addr = %client.addr, status = %ended, ?delay, "IPAM: the operator session ended; reconnecting (allocating from the last snapshot meanwhile)");
        tokio::time::sleep(delay).await;
    }
}

/// Fills in the instance ID from the metadata service if `--eni-instance-id` was not given
/// (once: the answer is kept across sessions).
async fn learn_instance_id(client: &mut ClientSettings) -> Result<(), Status> {
    if !client.register.instance_id.is_empty() {
        return Ok(());
    }
    let timeout = client.settings.connect_timeout;
    let id = super::imds::instance_id(&client.metadata_endpoint, timeout)
        .await
        .map_err(|err| Status::unavailable(format!("this node's instance ID: {err}")))?;
    tracing::info!(instance_id = %id, endpoint = %client.metadata_endpoint, "IPAM: instance ID from the metadata service");
    client.register.instance_id = id;
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::imds::fake::fake;

    fn settings(instance_id: &str, metadata_endpoint: String) -> ClientSettings {
        ClientSettings {
            addr: "http://127.0.0.1:9".to_owned(),
            tls: None,
            register: pb::RegisterNodeRequest {
                node: "node-1".to_owned(),
                instance_id: instance_id.to_owned(),
                ..pb::RegisterNodeRequest::default()
            },
            metadata_endpoint,
            settings: IpamSettings::default(),
        }
    }

    #[tokio::test]
    async fn without_an_instance_id_the_metadata_service_is_asked_once() {
        let (endpoint, server) = fake(vec![
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\ntok",
            "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\ni-0abc1234",
        ])
        .await;
        let mut client = settings("", endpoint);
        learn_instance_id(&mut client).await.expect("learnt");
        assert_eq!(client.register.instance_id, "i-0abc1234");
        assert_eq!(
            server.await.expect("server").len(),
            2,
            "a token, then the ID"
        );
        // Known now (as with --eni-instance-id): nothing is asked, the endpoint may be gone.
        client.metadata_endpoint = "http://127.0.0.1:9".to_owned();
        learn_instance_id(&mut client).await.expect("kept");
        assert_eq!(client.register.instance_id, "i-0abc1234");
    }

    #[tokio::test]
    async fn an_unreachable_metadata_service_fails_the_session_unavailable() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
        drop(listener);
        let mut client = settings("", endpoint);
        let status = learn_instance_id(&mut client).await.expect_err("refused");
        assert_eq!(status.code(), Code::Unavailable);
        assert!(
            status.message().starts_with("this node's instance ID: "),
            "{status}"
        );
        assert!(client.register.instance_id.is_empty());
    }
}
