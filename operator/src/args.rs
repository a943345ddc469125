//! `meshwork-operator`'s command line, with Cilium's operator flag names where Cilium has
//! one. It lives in the library (the binary reads it with [`Cli::parse`](clap::Parser)) so
//! that other code can parse an operator command line exactly as the binary does: the
//! deploy checks parse every manifest's container args with [`parse_args`].

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::limits::{Limits, LimitsTable};
use crate::model::Tags;

/// Parses `args` (the program name first) as `meshwork-operator` does, without exiting.
pub fn parse_args<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    Cli::try_parse_from(args)
}

/// Meshwork's AWS ENI IPAM operator: allocates ENIs and secondary IPv4 addresses (or /28
/// prefixes) through EC2 for every CiliumNode carrying `spec.eni.instance-id`, and
/// publishes them to the node's `status.eni` and `spec.ipam.pool` — status first, so no
/// agent ever sees a pool IP whose ENI is unknown.
///
/// Nodes live in Kubernetes (`--kube`) or in etcd (`--kvstore-endpoints`, key
/// `meshwork/ciliumnodes/v1/<node>`, spec and status written in one transaction; TLS to
/// etcd with `--kvstore-trusted-ca-file`, and client-certificate auth with
/// `--kvstore-cert-file` and `--kvstore-key-file`). etcd must answer at start.
///
/// `/metrics` answers in the classic Prometheus text format, or in OpenMetrics to scrapers
/// that ask for it (`Accept: application/openmetrics-text`).
#[derive(Debug, Parser)]
#[command(name = "meshwork-operator", version, about, long_about)]
pub struct Cli {
    /// Run a subcommand instead of the operator.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The operator's settings.
    #[command(flatten)]
    pub run: RunArgs,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the CiliumNode CustomResourceDefinition (cilium.io/v2) as YAML.
    Crd,
}

/// The operator's settings.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Name of this cluster; every ENI the operator creates is tagged
    /// `meshwork.io/cluster-name=<name>`, which also scopes the GC of leaked ENIs.
    #[arg(long, env = "MESHWORK_CLUSTER_NAME", default_value = "default")]
    pub cluster_name: String,

    /// AWS region of the instances.
    #[arg(long, env = "AWS_REGION")]
    pub aws_region: Option<String>,
    /// EC2 endpoint URL replacing AWS's (e.g. a moto server on 127.0.0.1); static dummy
    /// credentials are used with it.
    #[arg(long)]
    pub ec2_endpoint: Option<String>,
    /// Sustained EC2 calls per second, shared by every call the operator makes.
    #[arg(long, default_value_t = crate::ec2::DEFAULT_QPS)]
    pub limit_ipam_api_qps: f64,
    /// EC2 calls that may go out back to back.
    #[arg(long, default_value_t = crate::ec2::DEFAULT_BURST)]
    pub limit_ipam_api_burst: u32,

    /// Watch and publish CiliumNodes in Kubernetes (kubeconfig, else in-cluster config).
    #[arg(long, conflicts_with = "kvstore_endpoints")]
    pub kube: bool,
    /// Kubeconfig file for `--kube` (default: $KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long, env = "KUBECONFIG", requires = "kube")]
    pub kubeconfig: Option<PathBuf>,
    /// etcd endpoints (comma-separated URLs) holding the CiliumNodes (kvstore mode);
    /// `https://` ones with the TLS flags below.
    #[arg(long, value_delimiter = ',')]
    pub kvstore_endpoints: Vec<String>,
    /// CA file (PEM) that signed etcd's server certificate: TLS to etcd.
    #[arg(
        long,
        value_name = "FILE",
        requires = "kvstore_endpoints",
        conflicts_with = "kube"
    )]
    pub kvstore_trusted_ca_file: Option<PathBuf>,
    /// Client certificate file (PEM) presented to etcd; with etcd's client-certificate auth
    /// its CN is the etcd user, which needs read and write access to
    /// `meshwork/ciliumnodes/v1/`. Requires `--kvstore-key-file`.
    #[arg(
        long,
        value_name = "FILE",
        requires_all = ["kvstore_endpoints", "kvstore_key_file"],
        conflicts_with = "kube"
    )]
    pub kvstore_cert_file: Option<PathBuf>,
    /// Private key file (PEM) of `--kvstore-cert-file`.
    #[arg(
        long,
        value_name = "FILE",
        requires = "kvstore_cert_file",
        conflicts_with = "kube"
    )]
    pub kvstore_key_file: Option<PathBuf>,

    /// Allocate /28 prefixes instead of single addresses on nitro instances.
    #[arg(long)]
    pub aws_enable_prefix_delegation: bool,
    /// Release excess addresses through the release handshake with the agent.
    #[arg(long)]
    pub aws_release_excess_ips: bool,
    /// Seconds an address must be in excess before it is marked for release.
    #[arg(long, default_value_t = 180)]
    pub excess_ip_release_delay: u64,
    /// Tags put on every ENI created, `key=value` pairs separated by commas.
    #[arg(long, value_parser = parse_tags, default_value = "")]
    pub eni_tags: Tags,
    /// Only manage instances carrying these tags (`key=value,…`).
    #[arg(long, value_parser = parse_tags, default_value = "")]
    pub instance_tags_filter: Tags,
    /// Only create ENIs in these subnets (comma-separated IDs).
    #[arg(long, value_delimiter = ',')]
    pub subnet_ids_filter: Vec<String>,
    /// Only create ENIs in subnets carrying these tags (`key=value,…`).
    #[arg(long, value_parser = parse_tags, default_value = "")]
    pub subnet_tags_filter: Tags,
    /// Nodes allocated in parallel.
    #[arg(long, default_value_t = 50)]
    pub parallel_alloc_workers: usize,
    /// Seconds between garbage collections of leaked (unattached, tagged) ENIs.
    #[arg(long, default_value_t = 300)]
    pub eni_gc_interval: u64,

    /// Instance-type limits that win over DescribeInstanceTypes, as Cilium's
    /// `--aws-instance-limit-mapping`: `TYPE=ADAPTERS,IPV4,IPV6` (repeat the flag for more
    /// types), e.g. `m5.large=3,10,10`.
    #[arg(long, value_parser = parse_limit_mapping, value_name = "TYPE=ADAPTERS,IPV4,IPV6")]
    pub aws_instance_limit_mapping: Vec<(String, Limits)>,

    /// Address of `/metrics` (classic Prometheus text, or OpenMetrics when asked for) and
    /// `/healthz` (empty disables).
    #[arg(long, default_value = "127.0.0.1:9963")]
    pub prometheus_serve_addr: String,
    /// Address of the `meshwork.ipam.v1.NodeIpam` gRPC service (with health and
    /// reflection), for agents: a node registers its CiliumNode spec, watches its published
    /// snapshots (status and pool of one stored generation) and reports the IPs it handed
    /// out and its release answers. Empty disables it.
    #[arg(long, default_value = "", value_name = "ADDR")]
    pub grpc_serve_addr: String,
    /// Server certificate (PEM: the leaf, then any intermediates) of the gRPC endpoint: TLS
    /// instead of plaintext. Requires `--grpc-tls-key` and `--grpc-serve-addr`.
    #[arg(long, value_name = "FILE", requires = "grpc_tls_key")]
    pub grpc_tls_cert: Option<PathBuf>,
    /// Private key (PEM) of `--grpc-tls-cert`.
    #[arg(long, value_name = "FILE", requires = "grpc_tls_cert")]
    pub grpc_tls_key: Option<PathBuf>,
    /// CA (PEM) that signs the agents' client certificates: mTLS. A client must present a
    /// certificate it signed (the handshake refuses one without), and may register, watch
    /// and report only the node its certificate's subject CN names (PERMISSION_DENIED
    /// otherwise). Requires `--grpc-tls-cert`.
    #[arg(long, value_name = "FILE", requires = "grpc_tls_cert")]
    pub grpc_tls_client_ca: Option<PathBuf>,
    /// Leader election among the operator's replicas (with `--kube` only).
    #[command(flatten)]
    pub leader_election: crate::leader_election::LeaderElectionArgs,

    /// TEST ONLY, never in production: the first `WatchNode` watcher of NODE to get a
    /// snapshot with a pool gets, once, a broken one first (a pool IP naming an ENI the
    /// snapshot lacks, as Cilium's ordering bug produced), then the real one; for testing
    /// that an agent waits it out.
    #[arg(long, value_name = "NODE", hide = true)]
    pub test_hook_inconsistent_snapshot: Option<String>,
}

impl RunArgs {
    /// `--eni-tags` plus the cluster-name tag.
    pub fn effective_eni_tags(&self) -> Tags {
        let mut tags = self.eni_tags.clone();
        tags.entry("meshwork.io/cluster-name".to_owned())
            .or_insert_with(|| self.cluster_name.clone());
        tags
    }

    /// The `--aws-instance-limit-mapping` overrides.
    pub fn limit_overrides(&self) -> LimitsTable {
        let mut table = LimitsTable::new();
        for (instance_type, limits) in &self.aws_instance_limit_mapping {
            table.set(instance_type.clone(), limits.clone());
        }
        table
    }

    /// The release delay.
    pub fn release_delay(&self) -> Duration {
        Duration::from_secs(self.excess_ip_release_delay)
    }
}

/// `TYPE=ADAPTERS,IPV4,IPV6` → one instance type's limits.
pub fn parse_limit_mapping(text: &str) -> Result<(String, Limits), String> {
    let (instance_type, numbers) = text
        .split_once('=')
        .filter(|(t, _)| !t.trim().is_empty())
        .ok_or_else(|| format!("expected TYPE=ADAPTERS,IPV4,IPV6, got {text:?}"))?;
    let numbers: Vec<u32> = numbers
        .split(',')
        .map(|n| n.trim().parse::<u32>())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{text:?}: {e}"))?;
    let [adapters, ipv4, ipv6] = numbers[..] else {
        return Err(format!(
            "{text:?}: expected three numbers: adapters, IPv4 and IPv6 per adapter"
        ));
    };
    if adapters == 0 || ipv4 == 0 {
        return Err(format!(
            "{text:?}: adapters and IPv4 addresses must be at least 1"
        ));
    }
    Ok((
        instance_type.trim().to_owned(),
        Limits {
            adapters,
            ipv4,
            ipv6,
            hypervisor: String::new(),
        },
    ))
}

/// `k1=v1,k2=v2` → tags (empty string → none).
pub fn parse_tags(text: &str) -> Result<Tags, String> {
    text.split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            pair.split_once('=')
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .filter(|(k, _)| !k.is_empty())
                .ok_or_else(|| format!("expected key=value, got {pair:?}"))
        })
        .collect()
}
