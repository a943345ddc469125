//! What `troubleshoot clustermesh` found, as plain data: one [`Check`] per line of the human
//! view, in the field names and order of `--json`. The probes fill it, [`super::render`]
//! prints it; neither knows the other.

use serde::Serialize;

/// How a check came out. A warning does not fail the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Fine.
    Ok,
    /// Works today, but needs attention (a certificate about to expire, a stale heartbeat).
    Warn,
    /// Broken: the agent cannot use this remote (or this endpoint) as configured.
    Fail,
}

/// Which check, in the order they run (Cilium's order, then Meshwork's additions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CheckKind {
    /// The cluster's config file parses as the agent parses it.
    Config,
    /// An endpoint's URL: scheme, host, port.
    Url,
    /// The endpoint's host name resolves (only for names).
    Dns,
    /// A TCP connection to the endpoint.
    Tcp,
    /// The TLS handshake, with the version and cipher suite negotiated.
    Tls,
    /// The certificate the endpoint's server presented.
    ServerCert,
    /// A raw `GET /version` over the connection (etcd's version; shows a TLS 1.3
    /// client-authentication failure, which the handshake does not).
    Version,
    /// The CA certificates of `trusted-ca-file`.
    TrustedCa,
    /// The client certificates of `cert-file`.
    ClientCert,
    /// An etcd client connection, as the agent makes it (1 s dial).
    EtcdConnect,
    /// Reading `cilium/.heartbeat` as the configured user.
    Authorization,
    /// The etcd cluster's ID and version.
    EtcdCluster,
    /// How old the remote's heartbeat is.
    Heartbeat,
    /// The remote's `cilium/cluster-config/<name>`: present, valid, compatible with ours.
    ClusterConfig,
}

impl CheckKind {
    /// The check's name in the human view.
    pub fn title(self) -> &'static str {
        match self {
            Self::Config => "config file",
            Self::Url => "URL",
            Self::Dns => "DNS",
            Self::Tcp => "TCP",
            Self::Tls => "TLS",
            Self::ServerCert => "server certificate",
            Self::Version => "GET /version",
            Self::TrustedCa => "trusted CA",
            Self::ClientCert => "client certificate",
            Self::EtcdConnect => "etcd connection",
            Self::Authorization => "authorization",
            Self::EtcdCluster => "etcd cluster",
            Self::Heartbeat => "heartbeat",
            Self::ClusterConfig => "cluster config",
        }
    }
}

/// One check's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Which check.
    pub check: CheckKind,
    /// The endpoint it is about; `None` for the cluster's own checks.
    pub endpoint: Option<String>,
    /// How it came out.
    pub status: Status,
    /// What was found, or why it failed.
    pub message: String,
    /// Further lines: certificate fields, the CAs a server accepts.
    pub details: Vec<String>,
    /// What to do about a failure or warning.
    pub hint: Option<String>,
}

impl Check {
    /// A check that passed.
    pub fn ok(check: CheckKind, message: impl Into<String>) -> Self {
        Self::new(check, Status::Ok, message.into(), None)
    }

    /// A check that passed with a warning, and what to do about it.
    pub fn warn(check: CheckKind, message: impl Into<String>, hint: impl Into<String>) -> Self {
        Self::new(check, Status::Warn, message.into(), Some(hint.into()))
    }

    /// A check that failed, and what to do about it.
    pub fn fail(check: CheckKind, message: impl Into<String>, hint: impl Into<String>) -> Self {
        Self::new(check, Status::Fail, message.into(), Some(hint.into()))
    }

    fn new(check: CheckKind, status: Status, message: String, hint: Option<String>) -> Self {
        Self {
            check,
            endpoint: None,
            status,
            message,
            details: Vec::new(),
            hint,
        }
    }

    /// The same check, about `endpoint`.
    pub fn at(mut self, endpoint: &str) -> Self {
        self.endpoint = Some(endpoint.to_owned());
        self
    }

    /// The same check, with further lines.
    pub fn with_details(mut self, details: Vec<String>) -> Self {
        self.details = details;
        self
    }
}

/// One remote cluster: its config file and its checks in the order they ran. A check that
/// cannot run after an earlier failure (TLS after a refused TCP connection) is not listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClusterReport {
    /// The cluster's name (its file's name).
    pub name: String,
    /// The config file checked.
    pub config_file: String,
    /// The worst status of its checks.
    pub status: Status,
    /// The checks.
    pub checks: Vec<Check>,
}

impl ClusterReport {
    /// The report of `name`, read from `config_file`.
    pub fn new(name: &str, config_file: &str, checks: Vec<Check>) -> Self {
        Self {
            name: name.to_owned(),
            config_file: config_file.to_owned(),
            status: worst(checks.iter().map(|c| c.status)),
            checks,
        }
    }
}

/// Every cluster checked: the top level of `--json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The clustermesh config directory.
    pub config_dir: String,
    /// The worst status of every cluster; `fail` makes meshctl exit 1.
    pub status: Status,
    /// One per cluster, sorted by name.
    pub clusters: Vec<ClusterReport>,
}

impl Report {
    /// The report over `clusters`.
    pub fn new(config_dir: &str, mut clusters: Vec<ClusterReport>) -> Self {
        clusters.sort_by(|a, b| a.name.cmp(&b.name));
        Self {
            config_dir: config_dir.to_owned(),
            status: worst(clusters.iter().map(|c| c.status)),
            clusters,
        }
    }
}

fn worst(statuses: impl Iterator<Item = Status>) -> Status {
    statuses.max().unwrap_or(Status::Ok)
}

/// A fixed report for the rendering tests: one healthy cluster, one failing.
#[cfg(test)]
pub fn sample() -> Report {
    let ep = "https://127.0.0.1:2379";
    let healthy = vec![
        Check::ok(
            CheckKind::Config,
            "1 endpoint; TLS: trusted-ca-file, cert-file",
        ),
        Check::ok(CheckKind::Url, "https, host 127.0.0.1, port 2379").at(ep),
        Check::ok(CheckKind::Tcp, "connected to 127.0.0.1:2379").at(ep),
        Check::ok(CheckKind::Tls, "TLS 1.3, TLS13_AES_256_GCM_SHA384").at(ep),
        Check::warn(
            CheckKind::ClientCert,
            "CN=remote expires in 9 days (2026-12-11T00:00:00Z)",
            "issue a new client certificate (cert-file) before it expires",
        )
        .with_details(vec!["serial 0a:1b".into(), "issuer CN=lab-ca".into()]),
    ];
    let failing = vec![
        Check::ok(CheckKind::Config, "1 endpoint; plain http"),
        Check::fail(
            CheckKind::Tcp,
            "cannot connect to 127.0.0.1:2381: Connection refused (os error 111)",
            "is the remote's etcd running and listening there?",
        )
        .at("http://127.0.0.1:2381"),
    ];
    Report::new(
        "/etc/meshwork/clustermesh",
        vec![
            ClusterReport::new("c3", "/etc/meshwork/clustermesh/c3", failing),
            ClusterReport::new("c2", "/etc/meshwork/clustermesh/c2", healthy),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_status_wins_and_none_is_ok() {
        let report = sample();
        assert_eq!(
            report
                .clusters
                .iter()
                .map(|c| (c.name.as_str(), c.status))
                .collect::<Vec<_>>(),
            [("c2", Status::Warn), ("c3", Status::Fail)]
        );
        assert_eq!(report.status, Status::Fail);
        assert_eq!(Report::new("/d", Vec::new()).status, Status::Ok);
    }
}
