//! The settings the binary checks before it starts, over the library's command line
//! ([`meshwork_apiserver::cli`]).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context as _, bail};
use meshwork_apiserver::exporter::Settings;
use meshwork_types::{validate_cluster_id, validate_cluster_name, validate_max_connected_clusters};

pub use meshwork_apiserver::cli::{Cli, Command, KvstoreArgs};

/// Where the apiserver serves.
#[derive(Debug)]
pub struct Addrs {
    /// `--grpc-serve-addr`.
    pub grpc: SocketAddr,
    /// `--health-serve-addr`.
    pub health: SocketAddr,
    /// `--prometheus-serve-addr`, unless empty.
    pub metrics: Option<SocketAddr>,
}

/// `text` as an address, or an error naming `flag`.
pub fn addr(flag: &str, text: &str) -> anyhow::Result<SocketAddr> {
    text.parse()
        .with_context(|| format!("{flag} {text:?} is not an IP:port address"))
}

/// The gRPC endpoint's TLS, read from the files.
pub struct GrpcTls {
    /// The server identity and, with `--grpc-ca-file`, the client CA.
    pub config: tonic::transport::ServerTlsConfig,
    /// Clients must present a certificate (and publish as its CN).
    pub client_auth: bool,
}

fn read(flag: &str, path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("{flag} {}", path.display()))
}

/// The apiserver's settings, checked (errors name the flag).
pub trait CliExt {
    /// The gRPC endpoint's TLS; `None` without `--grpc-cert-file`.
    fn grpc_tls(&self) -> anyhow::Result<Option<GrpcTls>>;
    /// The loop's settings, checked against Cilium's rules.
    fn settings(&self) -> anyhow::Result<Settings>;
    /// The listen addresses.
    fn addrs(&self) -> anyhow::Result<Addrs>;
}

impl CliExt for Cli {
    /// The gRPC endpoint's TLS; `None` without `--grpc-cert-file`.
    fn grpc_tls(&self) -> anyhow::Result<Option<GrpcTls>> {
        let (Some(cert), Some(key)) = (&self.grpc_cert_file, &self.grpc_key_file) else {
            return Ok(None);
        };
        let identity = tonic::transport::Identity::from_pem(
            read("--grpc-cert-file", cert)?,
            read("--grpc-key-file", key)?,
        );
        let mut config = tonic::transport::ServerTlsConfig::new().identity(identity);
        if let Some(ca) = &self.grpc_ca_file {
            config = config.client_ca_root(tonic::transport::Certificate::from_pem(read(
                "--grpc-ca-file",
                ca,
            )?));
        }
        Ok(Some(GrpcTls {
            config,
            client_auth: self.grpc_ca_file.is_some(),
        }))
    }

    /// The loop's settings, checked against Cilium's rules.
    fn settings(&self) -> anyhow::Result<Settings> {
        let (Some(cluster_name), Some(cluster_id)) = (&self.cluster_name, self.cluster_id) else {
            bail!("--cluster-name and --cluster-id are required");
        };
        validate_cluster_name(cluster_name)
            .with_context(|| format!("--cluster-name {cluster_name:?}"))?;
        validate_max_connected_clusters(self.max_connected_clusters)
            .context("--max-connected-clusters")?;
        validate_cluster_id(cluster_id, self.max_connected_clusters)
            .with_context(|| format!("--cluster-id {cluster_id}"))?;
        if self.kvstore_lease_ttl < Duration::from_secs(10) {
            bail!("--kvstore-lease-ttl must be at least 10s");
        }
        Ok(Settings {
            max_connected_clusters: self.max_connected_clusters,
            lease_ttl: self.kvstore_lease_ttl,
            initial_sync_timeout: self.initial_sync_timeout,
            node_gc_grace: self.node_gc_grace,
            identity_gc_interval: self.identity_gc_interval,
            ..Settings::new(cluster_name, cluster_id)
        })
    }

    /// The listen addresses.
    fn addrs(&self) -> anyhow::Result<Addrs> {
        Ok(Addrs {
            grpc: addr("--grpc-serve-addr", &self.grpc_serve_addr)?,
            health: addr("--health-serve-addr", &self.health_serve_addr)?,
            metrics: (!self.prometheus_serve_addr.is_empty())
                .then(|| addr("--prometheus-serve-addr", &self.prometheus_serve_addr))
                .transpose()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory as _, Parser as _};

    use super::*;

    /// The flags `extra` adds, over cluster c1 with ID 1 (a flag given again wins).
    fn parse(extra: &[&str]) -> Cli {
        let name = flag_value(extra, "--cluster-name").unwrap_or("c1");
        let id = flag_value(extra, "--cluster-id").unwrap_or("1");
        let extra: Vec<&str> = extra
            .chunks(2)
            .filter(|pair| !matches!(pair[0], "--cluster-name" | "--cluster-id"))
            .flatten()
            .copied()
            .collect();
        let mut args = vec![
            "meshwork-apiserver",
            "--cluster-name",
            name,
            "--cluster-id",
            id,
        ];
        args.extend_from_slice(&["--kvstore-endpoints", "http://127.0.0.1:2379"]);
        args.extend_from_slice(&extra);
        Cli::try_parse_from(args).unwrap()
    }

    fn flag_value<'a>(args: &[&'a str], flag: &str) -> Option<&'a str> {
        args.chunks(2)
            .find(|pair| pair[0] == flag)
            .map(|pair| pair[1])
    }

    #[test]
    fn defaults_are_ciliums_and_bad_values_are_named() {
        Cli::command().debug_assert();
        let settings = parse(&[]).settings().unwrap();
        assert_eq!(settings.lease_ttl, Duration::from_secs(900));
        assert_eq!(settings.initial_sync_timeout, Duration::from_secs(60));
        let addrs = parse(&[]).addrs().unwrap();
        assert_eq!(addrs.grpc.to_string(), "127.0.0.1:9891");
        assert_eq!(addrs.health.to_string(), "127.0.0.1:9880");
        assert_eq!(
            addrs.metrics.map(|a| a.to_string()).as_deref(),
            Some("127.0.0.1:9964")
        );
        assert!(
            parse(&["--prometheus-serve-addr", ""])
                .addrs()
                .unwrap()
                .metrics
                .is_none()
        );
        let err = parse(&["--cluster-id", "256"]).settings().unwrap_err();
        assert!(
            format!("{err:#}").starts_with("--cluster-id 256"),
            "{err:#}"
        );
        let err = parse(&["--cluster-name", "C_1"]).settings().unwrap_err();
        assert!(
            format!("{err:#}").starts_with("--cluster-name \"C_1\""),
            "{err:#}"
        );
        let err = parse(&["--grpc-serve-addr", "localhost"])
            .addrs()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "--grpc-serve-addr \"localhost\" is not an IP:port address"
        );
    }
}
