//! The etcd client's checks: connect as the agent connects (the kvstore layer's
//! `EtcdBackend`, the same TLS settings, a 1 s dial as in Cilium), read `cilium/.heartbeat`
//! as the authorization check, report the etcd cluster's ID and version, and — beyond
//! Cilium — judge the heartbeat's age and the remote's cluster config.

use std::time::{Duration, SystemTime};

use meshwork_clustermesh::remote_cluster::heartbeat::written_at;
use meshwork_clustermesh::remote_cluster::runner::read_cluster_config;
use meshwork_kvstore::{EtcdBackend, EtcdConfig, KvstoreError, TxnRead, keys};
use meshwork_types::keys::HEARTBEAT_KEY;
use meshwork_types::{ClusterConfig, ClusterConfigError};

use super::certs::{rfc3339, span};
use super::probe::Budget;
use super::report::{Check, CheckKind};

/// Cilium's dial timeout of the troubleshooting client: the client hangs on a failed
/// connection otherwise.
const DIAL_TIMEOUT: Duration = Duration::from_secs(1);
/// Twice the heartbeat interval: older is a quorum error for the agent.
pub const HEARTBEAT_STALE_AFTER: Duration = Duration::from_secs(2 * 60);

/// What the etcd checks need to know of the cluster.
pub struct Remote<'a> {
    /// The cluster's name.
    pub name: &'a str,
    /// Its etcd config.
    pub config: &'a EtcdConfig,
    /// The etcd user: the client certificate's CN.
    pub user: Option<&'a str>,
    /// Our `--max-connected-clusters`.
    pub max_connected_clusters: u32,
}

/// Runs the etcd checks in order; each needs the one before.
pub async fn check(remote: &Remote<'_>, budget: &Budget, now: SystemTime, out: &mut Vec<Check>) {
    let dial = DIAL_TIMEOUT.min(budget.remaining());
    let backend = match budget
        .within(EtcdBackend::connect(remote.config, dial))
        .await
    {
        Ok(Ok(backend)) => backend,
        Ok(Err(err)) => {
            out.push(Check::fail(
                CheckKind::EtcdConnect,
                format!("{err}"),
                "the endpoint checks above show where it breaks; `meshctl status` shows the \
                 agent's own error",
            ));
            return;
        }
        Err(elapsed) => {
            out.push(elapsed.check(CheckKind::EtcdConnect));
            return;
        }
    };
    out.push(Check::ok(
        CheckKind::EtcdConnect,
        format!("connected to {}", backend.endpoints()),
    ));

    let user = remote.user.unwrap_or("(no client certificate)");
    let mut kv = backend.client().kv_client();
    let heartbeat = match budget.within(kv.get(HEARTBEAT_KEY, None)).await {
        Ok(Ok(response)) => response,
        Ok(Err(err)) => {
            out.push(Check::fail(
                CheckKind::Authorization,
                format!("user {user} cannot read {HEARTBEAT_KEY}: {err}"),
                format!(
                    "the user needs Cilium's remote role: read on {HEARTBEAT_KEY}, cilium/state/, \
                     cilium/cluster-config/{name} and cilium/synced/{name}/ \
                     (`meshwork-apiserver etcd-init` creates it)",
                    name = remote.name
                ),
            ));
            return;
        }
        Err(elapsed) => {
            out.push(elapsed.check(CheckKind::Authorization));
            return;
        }
    };
    out.push(Check::ok(
        CheckKind::Authorization,
        format!("user {user} reads {HEARTBEAT_KEY}"),
    ));

    let cluster_id = heartbeat.header().map(|h| format!("{:x}", h.cluster_id()));
    let mut maintenance = backend.client().maintenance_client();
    let version = match budget.within(maintenance.status()).await {
        Ok(Ok(status)) => format!("etcd {}", status.version()),
        Ok(Err(err)) => format!("version unknown: {err}"),
        Err(_) => "version unknown: no answer in time".to_owned(),
    };
    out.push(Check::ok(
        CheckKind::EtcdCluster,
        format!(
            "ID {}, {version}",
            cluster_id.as_deref().unwrap_or("unknown")
        ),
    ));

    let value = heartbeat.kvs().first().map(|kv| kv.value());
    out.push(heartbeat_check(value, now));

    // The agent's own first read: a user refused any key of it fails the agent.
    out.push(
        match budget
            .within(read_cluster_config(&backend, remote.name))
            .await
        {
            Ok(Ok(TxnRead { values, .. })) => cluster_config_check(
                remote.name,
                values.first().is_some_and(Option::is_some),
                values.get(1).and_then(Option::as_deref),
                remote.max_connected_clusters,
            ),
            Ok(Err(err)) => cluster_config_unreadable(remote.name, &err),
            Err(elapsed) => elapsed.check(CheckKind::ClusterConfig),
        },
    );
}

/// How old the heartbeat is: a warning when absent, unreadable or over 2 minutes old.
pub fn heartbeat_check(value: Option<&[u8]>, now: SystemTime) -> Check {
    let kind = CheckKind::Heartbeat;
    let writer = "the remote's meshwork-apiserver (Cilium's clustermesh-apiserver) writes it \
                  every minute; agents take a stale heartbeat for lost quorum and reconnect";
    let Some(value) = value else {
        return Check::warn(kind, format!("{HEARTBEAT_KEY} is absent"), writer);
    };
    let text = String::from_utf8_lossy(value);
    let Some(written) = written_at(value) else {
        return Check::warn(
            kind,
            format!("{HEARTBEAT_KEY} holds {text:?}, not an RFC 3339 time"),
            writer,
        );
    };
    match now.duration_since(written) {
        Ok(age) if age > HEARTBEAT_STALE_AFTER => Check::warn(
            kind,
            format!(
                "written {}, {} ago: older than {}",
                rfc3339(written),
                span(age),
                span(HEARTBEAT_STALE_AFTER)
            ),
            format!("{writer}: is it running, and can it reach its etcd?"),
        ),
        Ok(age) => Check::ok(
            kind,
            format!("written {}, {} ago", rfc3339(written), span(age)),
        ),
        Err(ahead) if ahead.duration() > HEARTBEAT_STALE_AFTER => Check::warn(
            kind,
            format!(
                "written {}, {} ahead of this machine's clock",
                rfc3339(written),
                span(ahead.duration())
            ),
            "the clocks of this machine and the remote's apiserver disagree",
        ),
        Err(_) => Check::ok(kind, format!("written {}, just now", rfc3339(written))),
    }
}

/// Whether the remote's cluster config is there, valid, and compatible with ours, as the
/// agent decides it before it reads anything else.
pub fn cluster_config_check(
    name: &str,
    required: bool,
    value: Option<&[u8]>,
    max_connected_clusters: u32,
) -> Check {
    let kind = CheckKind::ClusterConfig;
    let key = ClusterConfig::key(name);
    let Some(value) = value else {
        if required {
            return Check::fail(
                kind,
                format!(
                    "{key} is missing, and {} says the remote publishes one: the agent waits for it",
                    keys::HAS_CLUSTER_CONFIG_KEY
                ),
                "the remote's apiserver writes it at start (through kvstoremesh: once it has \
                 connected the remote); is it running, and is the file named after the cluster?",
            );
        }
        return Check::warn(
            kind,
            format!("{key} is absent: the agent connects without a cluster ID or capabilities"),
            "a remote older than cluster configs, or not a Cilium/Meshwork etcd? Its apiserver \
             writes the config at start",
        );
    };
    let config = match ClusterConfig::from_json(value) {
        Ok(config) => config,
        Err(err) => {
            return Check::fail(
                kind,
                format!("{key} is not a cluster config: {err}"),
                "the remote's apiserver rewrites it at once when it notices; who else writes it?",
            );
        }
    };
    if let Err(err) = config.validate_remote(max_connected_clusters) {
        let hint = match err {
            ClusterConfigError::ReservedClusterId
            | ClusterConfigError::ClusterIdTooLarge { .. } => {
                format!(
                    "the remote needs a --cluster-id from 1 to {max_connected_clusters} (our \
                     --max-connected-clusters)"
                )
            }
            ClusterConfigError::MismatchedMaxConnectedClusters { .. } => {
                "run every cluster with the same --max-connected-clusters".to_owned()
            }
            _ => format!(
                "--max-connected-clusters {max_connected_clusters} is not ours? (255 or 511)"
            ),
        };
        return Check::fail(kind, format!("{key} is not compatible: {err}"), hint);
    }
    let caps = &config.capabilities;
    let mut found = vec![format!("ID {}", config.id)];
    if caps.synced_canaries {
        found.push("syncedCanaries".to_owned());
    }
    if caps.cached {
        found.push("cached (kvstoremesh)".to_owned());
    }
    if caps.max_connected_clusters != 0 {
        found.push(format!(
            "maxConnectedClusters {}",
            caps.max_connected_clusters
        ));
    }
    Check::ok(kind, found.join(", "))
}

fn cluster_config_unreadable(name: &str, err: &KvstoreError) -> Check {
    Check::fail(
        CheckKind::ClusterConfig,
        format!(
            "cannot read {}, {}, {HEARTBEAT_KEY} and {}: {err}",
            keys::HAS_CLUSTER_CONFIG_KEY,
            ClusterConfig::key(name),
            keys::synced_prefix(name),
        ),
        "the agent reads them in one transaction: the user needs read access to all \
         (`meshwork-apiserver etcd-init`'s remote role grants them)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::troubleshoot::report::Status;

    fn now() -> SystemTime {
        humantime::parse_rfc3339("2026-12-01T10:00:00Z").unwrap()
    }

    #[test]
    fn heartbeat_ages() {
        let check = |value: Option<&str>| heartbeat_check(value.map(str::as_bytes), now());
        let fresh = check(Some("2026-12-01T09:59:48Z"));
        assert_eq!(
            (fresh.status, fresh.message.as_str()),
            (Status::Ok, "written 2026-12-01T09:59:48Z, 12 seconds ago")
        );
        let stale = check(Some("2026-12-01T09:55:00Z"));
        assert_eq!(stale.status, Status::Warn);
        assert_eq!(
            stale.message,
            "written 2026-12-01T09:55:00Z, 5 minutes ago: older than 2 minutes"
        );
        // Go's time.RFC3339 in a local zone: the same instant.
        assert_eq!(
            check(Some("2026-12-01T10:59:48+01:00")).message,
            fresh.message
        );
        assert_eq!(check(None).status, Status::Warn);
        assert!(
            check(Some("yesterday"))
                .message
                .contains("not an RFC 3339 time")
        );
        assert_eq!(check(Some("2026-12-01T10:10:00Z")).status, Status::Warn);
        assert_eq!(check(Some("2026-12-01T10:00:01Z")).status, Status::Ok);
    }

    #[test]
    fn cluster_configs() {
        let check = |required, value: Option<&str>, max| {
            cluster_config_check("c2", required, value.map(str::as_bytes), max)
        };
        let ok = check(
            true,
            Some(r#"{"id":2,"capabilities":{"syncedCanaries":true,"maxConnectedClusters":255}}"#),
            255,
        );
        assert_eq!(
            (ok.status, ok.message.as_str()),
            (Status::Ok, "ID 2, syncedCanaries, maxConnectedClusters 255")
        );
        let missing = check(true, None, 255);
        assert_eq!(missing.status, Status::Fail);
        assert!(
            missing
                .message
                .starts_with("cilium/cluster-config/c2 is missing")
        );
        assert_eq!(check(false, None, 255).status, Status::Warn);
        assert_eq!(check(true, Some("{not json"), 255).status, Status::Fail);
        let too_large = check(true, Some(r#"{"id":300}"#), 255);
        assert_eq!(too_large.status, Status::Fail);
        assert!(
            too_large.message.contains("ClusterID 300 is not supported"),
            "{}",
            too_large.message
        );
        let mismatched = check(
            true,
            Some(r#"{"id":3,"capabilities":{"maxConnectedClusters":255}}"#),
            511,
        );
        assert!(
            mismatched
                .message
                .contains("mismatched MaxConnectedClusters")
        );
        assert_eq!(
            mismatched.hint.as_deref(),
            Some("run every cluster with the same --max-connected-clusters")
        );
        assert_eq!(check(true, Some(r#"{"id":0}"#), 255).status, Status::Fail);
    }
}
