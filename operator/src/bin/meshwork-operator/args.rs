//! The settings the binary checks before it starts, over the library's command line
//! ([`meshwork_operator::args`]).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, bail};
use meshwork_kvstore::EtcdConfig;
use meshwork_operator::grpc::tls::TlsFiles;

pub use meshwork_operator::args::{Cli, Command, RunArgs};

/// Where the CiliumNodes live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreChoice {
    /// The Kubernetes API, with an optional kubeconfig.
    Kube(Option<PathBuf>),
    /// etcd, as configured by the `--kvstore-*` flags.
    Etcd(EtcdConfig),
}

/// The settings that need checking or reading before the operator starts (errors name the
/// flag).
pub trait RunArgsExt {
    /// The store, exactly one of `--kube` and `--kvstore-endpoints`.
    fn store(&self) -> anyhow::Result<StoreChoice>;
    /// The region.
    fn region(&self) -> anyhow::Result<String>;
    /// The metrics address, if enabled.
    fn metrics_addr(&self) -> anyhow::Result<Option<SocketAddr>>;
    /// The gRPC address, if enabled.
    fn grpc_addr(&self) -> anyhow::Result<Option<SocketAddr>>;
    /// The gRPC endpoint's TLS, read from the files; `None` without `--grpc-tls-cert`.
    fn grpc_tls(&self) -> anyhow::Result<Option<TlsFiles>>;
}

impl RunArgsExt for RunArgs {
    /// The store, exactly one of `--kube` and `--kvstore-endpoints`.
    fn store(&self) -> anyhow::Result<StoreChoice> {
        match (self.kube, self.kvstore_endpoints.is_empty()) {
            (true, true) => Ok(StoreChoice::Kube(self.kubeconfig.clone())),
            (false, false) => Ok(StoreChoice::Etcd(EtcdConfig {
                endpoints: self.kvstore_endpoints.clone(),
                trusted_ca_file: self.kvstore_trusted_ca_file.clone(),
                cert_file: self.kvstore_cert_file.clone(),
                key_file: self.kvstore_key_file.clone(),
            })),
            (false, true) => bail!("choose a store: --kube or --kvstore-endpoints"),
            (true, false) => bail!("--kube and --kvstore-endpoints exclude each other"),
        }
    }

    /// The region.
    fn region(&self) -> anyhow::Result<String> {
        self.aws_region
            .clone()
            .filter(|region| !region.is_empty())
            .context("--aws-region (or AWS_REGION) is required")
    }

    /// The metrics address, if enabled.
    fn metrics_addr(&self) -> anyhow::Result<Option<SocketAddr>> {
        optional_addr("--prometheus-serve-addr", &self.prometheus_serve_addr)
    }

    /// The gRPC address, if enabled.
    fn grpc_addr(&self) -> anyhow::Result<Option<SocketAddr>> {
        let addr = optional_addr("--grpc-serve-addr", &self.grpc_serve_addr)?;
        if addr.is_none() && self.grpc_tls_cert.is_some() {
            bail!("--grpc-tls-cert needs --grpc-serve-addr: the gRPC endpoint is off");
        }
        Ok(addr)
    }

    /// The gRPC endpoint's TLS, read from the files; `None` without `--grpc-tls-cert`.
    fn grpc_tls(&self) -> anyhow::Result<Option<TlsFiles>> {
        let (Some(cert), Some(key)) = (&self.grpc_tls_cert, &self.grpc_tls_key) else {
            return Ok(None);
        };
        let client_ca = self
            .grpc_tls_client_ca
            .as_deref()
            .map(|ca| read("--grpc-tls-client-ca", ca))
            .transpose()?;
        Ok(Some(TlsFiles {
            cert: read("--grpc-tls-cert", cert)?,
            key: read("--grpc-tls-key", key)?,
            client_ca,
        }))
    }
}

fn read(flag: &str, path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("{flag} {}", path.display()))
}

fn optional_addr(flag: &str, text: &str) -> anyhow::Result<Option<SocketAddr>> {
    if text.is_empty() {
        return Ok(None);
    }
    text.parse()
        .map(Some)
        .with_context(|| format!("{flag} {text:?}"))
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use meshwork_operator::args::{parse_limit_mapping, parse_tags};
    use meshwork_operator::leader_election::Timing;

    use super::*;

    #[test]
    fn tags_parse_and_refuse_garbage() {
        let tags = parse_tags("a=1, b = 2").expect("tags");
        assert_eq!(tags.get("b").map(String::as_str), Some("2"));
        assert!(parse_tags("").expect("empty").is_empty());
        assert!(parse_tags("novalue").is_err());
    }

    #[test]
    fn limit_mappings_parse_like_cilium_and_refuse_garbage() {
        let cli = Cli::parse_from([
            "meshwork-operator",
            "--aws-instance-limit-mapping",
            "m5.large=2,4,4",
            "--aws-instance-limit-mapping=x1.custom=8,30,30",
        ]);
        let table = cli.run.limit_overrides();
        assert_eq!(
            table.get("m5.large").map(|l| (l.adapters, l.ipv4)),
            Some((2, 4))
        );
        assert_eq!(table.get("x1.custom").map(|l| l.ipv6), Some(30));
        for bad in [
            "m5.large",
            "=1,2,3",
            "m5.large=1,2",
            "m5.large=0,4,4",
            "m5.large=a,b,c",
        ] {
            assert!(parse_limit_mapping(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn exactly_one_store() {
        let cli = Cli::parse_from([
            "meshwork-operator",
            "--kvstore-endpoints",
            "http://127.0.0.1:1",
        ]);
        assert_eq!(
            cli.run.store().expect("store"),
            StoreChoice::Etcd(EtcdConfig::new(["http://127.0.0.1:1"]))
        );
        assert!(Cli::parse_from(["meshwork-operator"]).run.store().is_err());
        assert!(
            Cli::try_parse_from(["meshwork-operator", "--kube", "--kvstore-endpoints", "x"])
                .is_err()
        );
    }

    #[test]
    fn kvstore_tls_flags_configure_etcd_and_come_as_cert_and_key() {
        let cli = Cli::parse_from([
            "meshwork-operator",
            "--kvstore-endpoints",
            "https://127.0.0.1:1",
            "--kvstore-trusted-ca-file",
            "/tls/ca.crt",
            "--kvstore-cert-file",
            "/tls/operator.crt",
            "--kvstore-key-file",
            "/tls/operator.key",
        ]);
        let StoreChoice::Etcd(config) = cli.run.store().expect("store") else {
            panic!("kvstore mode");
        };
        assert_eq!(config.endpoints, ["https://127.0.0.1:1"]);
        assert_eq!(config.trusted_ca_file, Some("/tls/ca.crt".into()));
        assert_eq!(config.cert_file, Some("/tls/operator.crt".into()));
        assert_eq!(config.key_file, Some("/tls/operator.key".into()));
        for partial in [
            &["--kvstore-endpoints", "x", "--kvstore-cert-file", "c"][..],
            &["--kvstore-endpoints", "x", "--kvstore-key-file", "k"][..],
            &["--kvstore-trusted-ca-file", "ca"][..],
            &["--kube", "--kvstore-trusted-ca-file", "ca"][..],
            &[
                "--kube",
                "--kvstore-cert-file",
                "c",
                "--kvstore-key-file",
                "k",
            ][..],
        ] {
            let args = std::iter::once("meshwork-operator").chain(partial.iter().copied());
            assert!(Cli::try_parse_from(args).is_err(), "{partial:?}");
        }
    }

    #[test]
    fn grpc_tls_flags_come_as_cert_and_key_and_need_the_endpoint() {
        let dir = tempfile::tempdir().expect("temp dir");
        for name in ["tls.crt", "tls.key", "ca.crt"] {
            std::fs::write(dir.path().join(name), name).expect("write");
        }
        let file = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
        let (cert, key, ca) = (file("tls.crt"), file("tls.key"), file("ca.crt"));
        let cli = Cli::parse_from([
            "meshwork-operator",
            "--grpc-serve-addr",
            "127.0.0.1:9000",
            "--grpc-tls-cert",
            &cert,
            "--grpc-tls-key",
            &key,
            "--grpc-tls-client-ca",
            &ca,
        ]);
        let tls = cli.run.grpc_tls().expect("readable").expect("TLS");
        assert_eq!(
            (tls.cert.as_slice(), tls.key.as_slice()),
            (&b"tls.crt"[..], &b"tls.key"[..])
        );
        assert!(tls.node_is_cn(), "a client CA turns on mTLS");
        assert!(cli.run.grpc_addr().expect("addr").is_some());
        for partial in [
            &["--grpc-tls-cert", "c"][..],
            &["--grpc-tls-key", "k"][..],
            &["--grpc-tls-client-ca", "ca"][..],
        ] {
            let args = std::iter::once("meshwork-operator").chain(partial.iter().copied());
            assert!(Cli::try_parse_from(args).is_err(), "{partial:?}");
        }
        let no_endpoint = Cli::parse_from([
            "meshwork-operator",
            "--grpc-tls-cert",
            &cert,
            "--grpc-tls-key",
            &key,
        ]);
        assert!(
            no_endpoint.run.grpc_addr().is_err(),
            "TLS on a disabled endpoint"
        );
        let missing = Cli::parse_from([
            "meshwork-operator",
            "--grpc-tls-cert",
            "/nonexistent/tls.crt",
            "--grpc-tls-key",
            &key,
        ]);
        let err = missing.run.grpc_tls().expect_err("unreadable");
        assert!(format!("{err:#}").contains("--grpc-tls-cert"), "{err:#}");
    }

    #[test]
    fn the_test_hook_is_hidden_from_help() {
        use clap::CommandFactory;
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("--grpc-tls-client-ca"), "{help}");
        assert!(!help.contains("test-hook"), "{help}");
        let cli = Cli::parse_from([
            "meshwork-operator",
            "--test-hook-inconsistent-snapshot",
            "node-1",
        ]);
        assert_eq!(
            cli.run.test_hook_inconsistent_snapshot.as_deref(),
            Some("node-1")
        );
    }

    #[test]
    fn leader_election_defaults_are_ciliums_and_bad_timings_are_refused() {
        let cli = Cli::parse_from(["meshwork-operator", "--kube"]);
        let timing = cli.run.leader_election.timing();
        assert_eq!(timing, Timing::default());
        assert_eq!(timing.lease_duration, std::time::Duration::from_secs(15));
        assert_eq!(timing.renew_deadline, std::time::Duration::from_secs(10));
        assert_eq!(timing.retry_period, std::time::Duration::from_secs(2));
        timing.validate().expect("Cilium's defaults are valid");
        let cli = Cli::parse_from([
            "meshwork-operator",
            "--kube",
            "--leader-election-lease-duration",
            "10s",
            "--leader-election-renew-deadline",
            "10s",
        ]);
        let err = cli
            .run
            .leader_election
            .timing()
            .validate()
            .expect_err("lease = renew");
        assert!(
            err.to_string()
                .starts_with("--leader-election-lease-duration"),
            "{err}"
        );
        assert!(
            Cli::try_parse_from([
                "meshwork-operator",
                "--leader-election-retry-period",
                "soon"
            ])
            .is_err()
        );
    }

    #[test]
    fn the_cluster_name_tags_every_eni() {
        let cli = Cli::parse_from([
            "meshwork-operator",
            "--cluster-name",
            "c1",
            "--eni-tags",
            "team=net",
        ]);
        let tags = cli.run.effective_eni_tags();
        assert_eq!(
            tags.get("meshwork.io/cluster-name").map(String::as_str),
            Some("c1")
        );
        assert_eq!(tags.get("team").map(String::as_str), Some("net"));
    }
}
