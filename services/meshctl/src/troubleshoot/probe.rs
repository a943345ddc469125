//! One cluster's checks in Cilium's order — the file, each endpoint, the certificates, the
//! etcd client — within the cluster's time budget (`--timeout`, Cilium's 5 s).

use std::future::Future;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::certs::{self, CertInfo};
use super::config::{self, ClusterFile};
use super::endpoint;
use super::etcd::{self, Remote};
use super::report::{Check, CheckKind, ClusterReport};
use super::tls::TlsSetup;

/// How the clusters are checked.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// The time budget of one cluster.
    pub timeout: Duration,
    /// Our `--max-connected-clusters`.
    pub max_connected_clusters: u32,
}

/// The time left for one cluster's checks.
pub struct Budget {
    deadline: Instant,
    total: Duration,
}

/// The budget ran out while a check waited.
#[derive(Debug)]
pub struct OutOfTime(Duration);

impl Budget {
    /// `total` from now.
    pub fn new(total: Duration) -> Self {
        Self {
            deadline: Instant::now() + total,
            total,
        }
    }

    /// What is left.
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Runs `step` until it ends or the budget does.
    pub async fn within<F: Future>(&self, step: F) -> Result<F::Output, OutOfTime> {
        tokio::time::timeout_at(self.deadline, step)
            .await
            .map_err(|_| OutOfTime(self.total))
    }
}

impl OutOfTime {
    /// The failed check of the step that ran out of time.
    pub fn check(&self, kind: CheckKind) -> Check {
        Check::fail(
            kind,
            format!(
                "no answer within the cluster's {} (--timeout)",
                humantime::format_duration(self.0)
            ),
            "something drops the packets, or the server accepts and hangs; --timeout waits \
             longer",
        )
    }
}

/// Checks one cluster.
pub async fn cluster(file: &ClusterFile, settings: Settings, now: SystemTime) -> ClusterReport {
    let budget = Budget::new(settings.timeout);
    let path = file.path.display().to_string();
    let mut checks = vec![config::check(file)];
    let Ok(config) = &file.config else {
        return ClusterReport::new(&file.name, &path, checks);
    };
    // An https endpoint without TLS files still gets TLS, with no roots, as from the
    // agent's etcd client.
    let https = config.uses_tls() || config.endpoints.iter().any(|e| e.starts_with("https://"));
    let tls = https.then(|| TlsSetup::load(config));
    let mut reached = false;
    for ep in &config.endpoints {
        reached |= endpoint::check(ep, config, tls.as_ref(), &budget, now, &mut checks).await;
    }
    match &tls {
        Some(tls) => {
            checks.push(certs::trusted_ca_check(tls, now));
            checks.push(certs::client_cert_check(tls, now));
        }
        None => checks.push(Check::ok(
            CheckKind::TrustedCa,
            "not used: the endpoints are plain http",
        )),
    }
    if !reached {
        checks.push(Check::fail(
            CheckKind::EtcdConnect,
            "not tried: no endpoint accepted a TCP connection",
            "fix what the endpoint checks above show first",
        ));
        return ClusterReport::new(&file.name, &path, checks);
    }
    let user = tls
        .as_ref()
        .and_then(|tls| tls.client.as_ref()?.as_ref().ok())
        .and_then(|key| CertInfo::parse(key.cert.first()?).ok())
        .and_then(|info| info.common_name);
    let remote = Remote {
        name: &file.name,
        config,
        user: user.as_deref(),
        max_connected_clusters: settings.max_connected_clusters,
    };
    // Boxed: the etcd client's connect is a large future to carry inline.
    Box::pin(etcd::check(&remote, &budget, now, &mut checks)).await;
    ClusterReport::new(&file.name, &path, checks)
}
