//! `meshwork-apiserver`'s command line (the apiserver, `kvstoremesh` and `etcd-init`), with
//! Cilium's clustermesh-apiserver and kvstoremesh flag names where Cilium has one. It lives
//! in the library (the binary reads it with [`Cli::parse`](clap::Parser)) so that other code
//! can parse a command line exactly as the binary does: the deploy checks parse every
//! manifest's container args with [`parse_args`].

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use meshwork_clustermesh::remote_cluster::heartbeat::HeartbeatArgs;
use meshwork_kvstore::EtcdConfig;

/// Parses `args` (the program name first) as `meshwork-apiserver` does, without exiting.
pub fn parse_args<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    Cli::try_parse_from(args)
}

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
    Kvstoremesh(Box<KvstoremeshArgs>),
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

/// The flags of `kvstoremesh`.
#[derive(Debug, Args)]
pub struct KvstoremeshArgs {
    /// Name of this cluster (a remote of the same name is refused).
    #[arg(long, env = "MESHWORK_CLUSTER_NAME")]
    pub cluster_name: String,
    /// This cluster's ID, 1..=--max-connected-clusters (no remote may use it).
    #[arg(long, env = "MESHWORK_CLUSTER_ID")]
    pub cluster_id: u32,
    /// Clusters a mesh may hold: 255 or 511.
    #[arg(long, default_value_t = 255)]
    pub max_connected_clusters: u32,
    /// The clustermesh config directory: one file per remote cluster, named after it, in the
    /// agent's format (endpoints, TLS files).
    #[arg(long, value_name = "DIR")]
    pub clustermesh_config: PathBuf,
    /// This cluster's etcd, where the cache is written.
    #[command(flatten)]
    pub kvstore: KvstoreArgs,
    /// TTL of the leases the cache is written under.
    #[arg(long, default_value = "15m", value_parser = humantime::parse_duration)]
    pub kvstore_lease_ttl: Duration,
    /// A remote that does not connect within this after start is not waited for.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub per_cluster_ready_timeout: Duration,
    /// Ready after this regardless of the remotes.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub global_ready_timeout: Duration,
    /// How long a removed remote's entries stay after its cached config was deleted, so the
    /// agents reading it disconnect first.
    #[arg(long, default_value = "3m", value_parser = humantime::parse_duration)]
    pub cache_removal_grace: Duration,
    /// Where `/healthz` and `/readyz` (200 once every remote known at start is cached) are
    /// served.
    #[arg(long, default_value = "127.0.0.1:9881", value_name = "ADDR")]
    pub health_serve_addr: String,
    /// Where the status API (gRPC `meshwork.kvstoremesh.v1.KvstoreMesh`, with health and
    /// reflection) is served, for `meshctl --kvstoremesh ADDR status`; Cilium's kvstoremesh
    /// API port.
    #[arg(long, default_value = "127.0.0.1:9889", value_name = "ADDR")]
    pub api_serve_addr: String,
    /// Where `/metrics` (`meshwork_kvstoremesh_*`) is served; empty disables it.
    #[arg(long, default_value = "127.0.0.1:9965", value_name = "ADDR")]
    pub prometheus_serve_addr: String,

    /// The remotes' heartbeat.
    #[command(flatten)]
    pub heartbeat: HeartbeatArgs,
}
