//! The command line, with Cilium's operator flag names where Cilium has one.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use meshwork_kvstore::EtcdConfig;
use meshwork_operator::grpc::tls::TlsFiles;
use meshwork_operator::limits::{Limits, LimitsTable};
use meshwork_operator::model::Tags;

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
    #[arg(long, default_value_t = meshwork_operator::ec2::DEFAULT_QPS)]
    pub limit_ipam_api_qps: f64,
    /// EC2 calls that may go out back to back.
    #[arg(long, default_value_t = meshwork_operator::ec2::DEFAULT_BURST)]
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
    /// TEST ONLY, never in production: the first `WatchNode` watcher of NODE to get a
    /// snapshot with a pool gets, once, a broken one first (a pool IP naming an ENI the
    /// snapshot lacks, as Cilium's ordering bug produced), then the real one; for testing
    /// that an agent waits it out.
    #[arg(long, value_name = "NODE", hide = true)]
    pub test_hook_inconsistent_snapshot: Option<String>,
}

/// Where the CiliumNodes live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreChoice {
    /// The Kubernetes API, with an optional kubeconfig.
    Kube(Option<PathBuf>),
    /// etcd, as configured by the `--kvstore-*` flags.
    Etcd(EtcdConfig),
}

impl RunArgs {
    /// The store, exactly one of `--kube` and `--kvstore-endpoints`.
    pub fn store(&self) -> anyhow::Result<StoreChoice> {
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
    pub fn region(&self) -> anyhow::Result<String> {
        self.aws_region
            .clone()
            .filter(|region| !region.is_empty())
            .context("--aws-region (or AWS_REGION) is required")
    }

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

    /// The metrics address, if enabled.
    pub fn metrics_addr(&self) -> anyhow::Result<Option<SocketAddr>> {
        optional_addr("--prometheus-serve-addr", &self.prometheus_serve_addr)
    }

    /// The gRPC address, if enabled.
    pub fn grpc_addr(&self) -> anyhow::Result<Option<SocketAddr>> {
        let addr = optional_addr("--grpc-serve-addr", &self.grpc_serve_addr)?;
        if addr.is_none() && self.grpc_tls_cert.is_some() {
            bail!("--grpc-tls-cert needs --grpc-serve-addr: the gRPC endpoint is off");
        }
        Ok(addr)
    }

    /// The gRPC endpoint's TLS, read from the files; `None` without `--grpc-tls-cert`.
    pub fn grpc_tls(&self) -> anyhow::Result<Option<TlsFiles>> {
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

#[cfg(test)]
mod tests {
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
