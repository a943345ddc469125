//! The command line, with Cilium's clustermesh-apiserver flag names where Cilium has one.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Args, Parser, Subcommand};
use meshwork_apiserver::exporter::Settings;
use meshwork_kvstore::EtcdConfig;
use meshwork_types::{validate_cluster_id, validate_cluster_name, validate_max_connected_clusters};

/// Meshwork's clustermesh apiserver: the only writer of its cluster's etcd.
///
/// Agents publish their node and endpoints to it over gRPC
/// (`meshwork.apiserver.v1.Export`, on `--grpc-serve-addr`); it allocates their identities
/// in the cluster's range and writes everything in Cilium's layout under leases, with
/// `cilium/cluster-config/<cluster>`, the heartbeat, and — once every agent that connected
/// within `--initial-sync-timeout` has published — the sync canaries, so remote agents read
/// a complete state. A restart adopts what the previous process wrote and changes nothing
/// that is still true. SIGTERM exits 0 and deletes nothing.
#[derive(Debug, Parser)]
#[command(
    name = "meshwork-apiserver",
    version,
    about,
    long_about,
    subcommand_negates_reqs = true
)]
pub struct Cli {
    /// Run a subcommand instead of the apiserver.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Name of this cluster (Cilium's rules: up to 32 lower-case letters, digits and '-').
    #[arg(long, env = "MESHWORK_CLUSTER_NAME", required = true)]
    pub cluster_name: Option<String>,
    /// This cluster's ID, 1..=--max-connected-clusters.
    #[arg(long, env = "MESHWORK_CLUSTER_ID", required = true)]
    pub cluster_id: Option<u32>,
    /// Clusters a mesh may hold: 255 or 511 (it sizes the identity ranges).
    #[arg(long, default_value_t = 255)]
    pub max_connected_clusters: u32,

    /// This cluster's etcd.
    #[command(flatten)]
    pub kvstore: KvstoreArgs,
    /// TTL of the leases every key is written under; a key whose lease expires is written
    /// again.
    #[arg(long, default_value = "15m", value_parser = humantime::parse_duration)]
    pub kvstore_lease_ttl: Duration,

    /// How long after start the agents have to reconnect and republish before the sync
    /// canaries are written without them.
    #[arg(long, default_value = "1m", value_parser = humantime::parse_duration)]
    pub initial_sync_timeout: Duration,
    /// How long the entries of a node whose agent went away stay in etcd.
    #[arg(long, default_value = "15m", value_parser = humantime::parse_duration)]
    pub node_gc_grace: Duration,
    /// How long an identity no endpoint uses is kept before it is released.
    #[arg(long, default_value = "15m", value_parser = humantime::parse_duration)]
    pub identity_gc_interval: Duration,

    /// Where `meshwork.apiserver.v1.Export` (with gRPC health and reflection) is served.
    #[arg(long, default_value = "127.0.0.1:9891", value_name = "ADDR")]
    pub grpc_serve_addr: String,
    /// Server certificate (PEM) of the gRPC endpoint: TLS. Requires `--grpc-key-file`.
    #[arg(long, value_name = "FILE", requires = "grpc_key_file")]
    pub grpc_cert_file: Option<PathBuf>,
    /// Private key (PEM) of `--grpc-cert-file`.
    #[arg(long, value_name = "FILE", requires = "grpc_cert_file")]
    pub grpc_key_file: Option<PathBuf>,
    /// CA (PEM) that signs the agents' client certificates: mTLS, and an agent may publish
    /// only the node its certificate's CN names (PERMISSION_DENIED otherwise). Requires
    /// `--grpc-cert-file`.
    #[arg(long, value_name = "FILE", requires = "grpc_cert_file")]
    pub grpc_ca_file: Option<PathBuf>,
    /// Where `/healthz` and `/readyz` (200 once the sync canaries are written) are served.
    #[arg(long, default_value = "127.0.0.1:9880", value_name = "ADDR")]
    pub health_serve_addr: String,
    /// Where `/metrics` (`meshwork_apiserver_*`, `meshwork_kvstore_*`) is served; empty
    /// disables it.
    #[arg(long, default_value = "127.0.0.1:9964", value_name = "ADDR")]
    pub prometheus_serve_addr: String,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Cache every remote cluster in this cluster's etcd, so its agents connect only to it.
    ///
    /// Reads `--clustermesh-config` as the agent does (one file per remote, watched), connects
    /// to each remote with the agent's machinery, validates every entry as the agent does and
    /// mirrors nodes, services, identities and ipcache entries under
    /// `cilium/cache/<type>/v1/<cluster>/`, each remote's cluster config under
    /// `cilium/cluster-config/<cluster>` with `cached: true`, and the canaries
    /// `cilium/synced/<cluster>/cilium/cache/<type>/v1` once a remote's first list is in. A
    /// restart deletes nothing that is still true; a remote removed from the directory is
    /// drained: its config first, its canaries and entries after `--cache-removal-grace`.
    Kvstoremesh(Box<crate::kvstoremesh::KvstoremeshArgs>),
    /// Create Cilium's etcd users and roles for the cluster (idempotent), then enable auth.
    ///
    /// Users (client-certificate auth: a certificate's CN is its user): `root` and
    /// `admin-<cluster>` (the apiserver's own, role root); `local-<cluster>` (role local: read
    /// cilium/.heartbeat, cilium/cache/, cilium/cluster-config/, cilium/synced/); `remote`
    /// (role remote, read-only: cilium/.heartbeat, cilium/state/, cilium/cluster-config/<cluster>,
    /// cilium/synced/<cluster>/). Run it as root (`--kvstore-cert-file` of CN root).
    EtcdInit {
        /// Name of the cluster.
        #[arg(long, env = "MESHWORK_CLUSTER_NAME")]
        cluster_name: String,
        /// The cluster's etcd.
        #[command(flatten)]
        kvstore: KvstoreArgs,
    },
}

/// The `--kvstore-*` connection flags.
#[derive(Debug, Args)]
pub struct KvstoreArgs {
    /// etcd endpoints (comma-separated URLs) of this cluster's kvstore; `https://` ones with
    /// the TLS flags below. etcd must answer at start.
    #[arg(long, value_delimiter = ',', required = true)]
    pub kvstore_endpoints: Vec<String>,
    /// CA file (PEM) that signed etcd's server certificate.
    #[arg(long, value_name = "FILE")]
    pub kvstore_trusted_ca_file: Option<PathBuf>,
    /// Client certificate file (PEM) presented to etcd; with client-certificate auth its CN
    /// is the etcd user (`meshwork-apiserver etcd-init` creates `admin-<cluster>`). Requires
    /// `--kvstore-key-file`.
    #[arg(long, value_name = "FILE", requires = "kvstore_key_file")]
    pub kvstore_cert_file: Option<PathBuf>,
    /// Private key file (PEM) of `--kvstore-cert-file`.
    #[arg(long, value_name = "FILE", requires = "kvstore_cert_file")]
    pub kvstore_key_file: Option<PathBuf>,
}

impl KvstoreArgs {
    /// The etcd connection settings.
    pub fn etcd(&self) -> EtcdConfig {
        EtcdConfig {
            endpoints: self.kvstore_endpoints.clone(),
            trusted_ca_file: self.kvstore_trusted_ca_file.clone(),
            cert_file: self.kvstore_cert_file.clone(),
            key_file: self.kvstore_key_file.clone(),
        }
    }
}

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

impl Cli {
    /// The gRPC endpoint's TLS; `None` without `--grpc-cert-file`.
    pub fn grpc_tls(&self) -> anyhow::Result<Option<GrpcTls>> {
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
    pub fn settings(&self) -> anyhow::Result<Settings> {
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
    pub fn addrs(&self) -> anyhow::Result<Addrs> {
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
    use clap::CommandFactory as _;

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
