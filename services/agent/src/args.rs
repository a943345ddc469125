//! The agent's flags; names and defaults follow Cilium's where Cilium has them.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{CommandFactory as _, Parser};

/// The Meshwork agent: watches every remote cluster's etcd (nodes, services, identities,
/// IP→identity) and serves its status on a local unix socket for `meshctl`.
#[derive(Debug, Parser)]
#[command(name = "meshwork-agent", version, about, long_about = None)]
pub struct Args {
    /// Name of the local cluster (remote config files named like it are ignored).
    #[arg(long, default_value = "default", env = "MESHWORK_CLUSTER_NAME")]
    pub cluster_name: String,

    /// ID of the local cluster, unique in the mesh (0: not part of a mesh).
    #[arg(long, default_value_t = 0)]
    pub cluster_id: u32,

    /// Directory with one etcd config file per remote cluster (file name = cluster name;
    /// fields `endpoints`, `trusted-ca-file`, `cert-file`, `key-file`). Watched for changes.
    #[arg(long, value_name = "DIR")]
    pub clustermesh_config: Option<PathBuf>,

    /// Maximum number of clusters in the mesh: 255 or 511.
    #[arg(long, default_value_t = 255)]
    pub max_connected_clusters: u32,

    /// How long waits for remote clusters to sync may take before the agent proceeds anyway
    /// (the circuit breaker), e.g. `1m`, `30s`.
    #[arg(long, default_value = "1m", value_parser = humantime::parse_duration)]
    pub clustermesh_sync_timeout: Duration,

    /// Where the agent keeps its state (endpoints, the IPAM checkpoint, the API socket). On a
    /// node `/var/run` is tmpfs: the state outlives the agent, not the node, and the
    /// checkpoint's fsync on every allocation costs nothing there.
    #[arg(long, default_value = "/var/run/meshwork")]
    pub state_dir: PathBuf,

    /// Unix socket of the local API (default: `<state-dir>/agent.sock`).
    #[arg(long, value_name = "PATH")]
    pub api_socket: Option<PathBuf>,

    /// Root of the BPF filesystem; maps are pinned under `<root>/tc/globals/`.
    #[arg(long, default_value = "/sys/fs/bpf", value_name = "DIR")]
    pub bpf_root: PathBuf,

    /// Run the BPF datapath (ipcache map, endpoint programs). `false` runs the control plane
    /// alone (benchmarks of the sync path, machines without bpffs).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub enable_bpf_datapath: bool,

    /// How long restored endpoints wait for every remote cluster's ipcache, identities and
    /// nodes before they regenerate anyway (warning once: expect possible disruption of
    /// cross-cluster connections). `0s` does not wait.
    #[arg(long, default_value = "1m", value_parser = humantime::parse_duration)]
    pub clustermesh_ip_identities_sync_timeout: Duration,

    /// IPsec is on: the host endpoint regenerates first, synchronously, and the wait above is
    /// capped at 5 s.
    #[arg(long)]
    pub enable_ipsec: bool,

    /// This node's IP: ipcache entries hosted on it get tunnel endpoint 0.
    #[arg(long, value_name = "IP")]
    pub node_ip: Option<IpAddr>,

    /// Address of the Prometheus metrics endpoint (`/metrics`); empty disables it.
    #[arg(long, default_value = "127.0.0.1:9962", value_name = "ADDR")]
    pub prometheus_serve_addr: String,

    /// This node's name, as published to the apiserver (Cilium's `K8S_NODE_NAME`; default:
    /// the host name).
    #[arg(long, env = "K8S_NODE_NAME", value_name = "NAME")]
    pub node_name: Option<String>,

    /// This node's IPv4 pod CIDR, published with the node (its endpoints' IPs are in it);
    /// with `--ipam cluster-pool`, the CIDR pod IPs are handed out from (the first host
    /// address is the router IP).
    #[arg(long, value_name = "CIDR")]
    pub ipv4_alloc_cidr: Option<String>,

    /// The cluster's meshwork-apiserver (HOST:PORT): the agent publishes its node and
    /// endpoints to it, and endpoints with labels get their identity from it. Publishing
    /// reconnects with backoff and never blocks the datapath.
    #[arg(long, value_name = "HOST:PORT")]
    pub apiserver_addr: Option<String>,

    /// CA (PEM) that signed the apiserver's certificate: publish over TLS.
    #[arg(long, value_name = "FILE", requires = "apiserver_addr")]
    pub apiserver_ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for mTLS; its CN must be this node's name. Requires
    /// `--apiserver-key-file` and `--apiserver-ca-file`.
    #[arg(long, value_name = "FILE", requires_all = ["apiserver_key_file", "apiserver_ca_file"])]
    pub apiserver_cert_file: Option<PathBuf>,
    /// Private key (PEM) of `--apiserver-cert-file`.
    #[arg(long, value_name = "FILE", requires = "apiserver_cert_file")]
    pub apiserver_key_file: Option<PathBuf>,

    /// Socket-LB.
    #[command(flatten)]
    pub socket_lb: crate::datapath::socket_lb::SocketLbArgs,

    /// IPAM.
    #[command(flatten)]
    pub ipam: crate::ipam::args::IpamArgs,

    /// WireGuard.
    #[command(flatten)]
    pub wireguard: crate::wireguard::WireguardArgs,

    /// The remotes' heartbeat.
    #[command(flatten)]
    pub heartbeat: meshwork_clustermesh::remote_cluster::heartbeat::HeartbeatArgs,
}

impl Args {
    /// The API socket path, defaulted under the state dir.
    pub fn api_socket(&self) -> PathBuf {
        self.api_socket
            .clone()
            .unwrap_or_else(|| self.state_dir.join("agent.sock"))
    }

    /// The metrics address, `None` when disabled.
    pub fn metrics_addr(&self) -> Result<Option<SocketAddr>, ArgsError> {
        if self.prometheus_serve_addr.is_empty() {
            return Ok(None);
        }
        let addr = self.prometheus_serve_addr.parse().map_err(|e| {
            let message = format!("{:?}: {e}", self.prometheus_serve_addr);
            ArgsError::new("prometheus-serve-addr", &message)
        })?;
        Ok(Some(addr))
    }

    /// Refuses flag values the agent cannot run with.
    pub fn validate(&self) -> Result<(), ArgsError> {
        meshwork_types::validate_max_connected_clusters(self.max_connected_clusters)
            .map_err(|e| ArgsError::new("max-connected-clusters", &e))?;
        meshwork_types::validate_cluster_name(&self.cluster_name)
            .map_err(|e| ArgsError::new("cluster-name", &e))?;
        if self.cluster_id != 0 {
            meshwork_types::validate_cluster_id(self.cluster_id, self.max_connected_clusters)
                .map_err(|e| ArgsError::new("cluster-id", &e))?;
        }
        self.metrics_addr()?;
        self.apiserver_tls()?;
        if let Some(name) = &self.node_name {
            meshwork_types::validate_node_name(name)
                .map_err(|why| ArgsError::new("node-name", &format!("{name:?}: {why}")))?;
        }
        if let Some(cidr) = &self.ipv4_alloc_cidr {
            let prefix: meshwork_types::IpPrefix = cidr.parse().map_err(|_| {
                ArgsError::new("ipv4-alloc-cidr", &format!("{cidr:?} is not a CIDR"))
            })?;
            if !prefix.addr().is_ipv4() {
                return Err(ArgsError::new(
                    "ipv4-alloc-cidr",
                    &format!("{cidr:?} is not IPv4"),
                ));
            }
        }
        self.ipam.validate(self.ipv4_alloc_cidr.as_deref())?;
        if self.ipam.ipam == Some(crate::ipam::args::IpamMode::Eni) {
            // The operator names the CiliumNode after it; the host name may not fit.
            let name = self.node_name();
            meshwork_types::validate_node_name(&name).map_err(|why| {
                ArgsError::new(
                    "node-name",
                    &format!("{name:?} (the CiliumNode --ipam eni registers): {why}"),
                )
            })?;
        }
        Ok(())
    }

    /// The TLS to the apiserver, read from the `--apiserver-*-file` flags; `None` without
    /// `--apiserver-ca-file`.
    pub fn apiserver_tls(&self) -> Result<Option<tonic::transport::ClientTlsConfig>, ArgsError> {
        let Some(ca) = &self.apiserver_ca_file else {
            return Ok(None);
        };
        let read = |flag: &'static str, path: &PathBuf| {
            std::fs::read(path)
                .map_err(|e| ArgsError::new(flag, &format!("{}: {e}", path.display())))
        };
        let ca = tonic::transport::Certificate::from_pem(read("apiserver-ca-file", ca)?);
        let mut config = tonic::transport::ClientTlsConfig::new().ca_certificate(ca);
        if let (Some(cert), Some(key)) = (&self.apiserver_cert_file, &self.apiserver_key_file) {
            config = config.identity(tonic::transport::Identity::from_pem(
                read("apiserver-cert-file", cert)?,
                read("apiserver-key-file", key)?,
            ));
        }
        Ok(Some(config))
    }

    /// This node's name: `--node-name`, else the host name.
    pub fn node_name(&self) -> String {
        self.node_name.clone().unwrap_or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|name| name.trim().to_owned())
                .unwrap_or_default()
        })
    }
}

/// Parses the agent's command line (the program name first) exactly as the binary does,
/// without exiting: clap, once Go-style booleans — `--enable-wireguard=true`,
/// `--enable-ipsec=false`, as Cilium's flags and the keys of its ConfigMap are written —
/// became clap's (the bare flag, or nothing). The deploy checks parse manifests with it.
pub fn parse_args<I, T>(args: I) -> Result<Args, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    Args::try_parse_from(go_booleans(&Args::command(), args))
}

/// `--SWITCH=true` → `--SWITCH`, `--SWITCH=false` → nothing, for every on/off flag of
/// `command` (clap's `SetTrue`); every other argument as it is.
fn go_booleans<I, T>(command: &clap::Command, args: I) -> Vec<std::ffi::OsString>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let switches: Vec<&str> = command
        .get_arguments()
        .filter(|arg| matches!(arg.get_action(), clap::ArgAction::SetTrue))
        .filter_map(clap::Arg::get_long)
        .collect();
    args.into_iter()
        .map(Into::into)
        .filter_map(|arg| {
            let switch = arg
                .to_str()
                .and_then(|text| text.strip_prefix("--"))
                .and_then(|text| text.split_once('='))
                .filter(|(name, _)| switches.contains(name));
            match switch {
                Some((name, "true")) => Some(format!("--{name}").into()),
                Some((_, "false")) => None,
                _ => Some(arg),
            }
        })
        .collect()
}

/// A flag value the agent cannot run with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--{flag}: {message}")]
pub struct ArgsError {
    /// The flag, without its dashes.
    pub flag: &'static str,
    /// What is wrong.
    pub message: String,
}

impl ArgsError {
    pub(crate) fn new(flag: &'static str, message: &dyn std::fmt::Display) -> Self {
        Self {
            flag,
            message: message.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_style_booleans_parse_as_cilium_writes_them() {
        let args = parse_args([
            "meshwork-agent",
            "--enable-wireguard=true",
            "--enable-ipsec=false",
            "--bpf-lb-sock=true",
        ])
        .expect("parses");
        assert!(args.wireguard.enable_wireguard);
        assert!(!args.enable_ipsec);
        assert!(args.socket_lb.bpf_lb_sock, "a valued boolean is clap's own");
        let off = parse_args(["meshwork-agent", "--enable-wireguard=false"]).expect("parses");
        assert!(!off.wireguard.enable_wireguard);
        // Only true and false; clap itself refuses the rest.
        assert!(parse_args(["meshwork-agent", "--enable-wireguard=yes"]).is_err());
        assert!(Args::try_parse_from(["meshwork-agent", "--enable-wireguard=true"]).is_err());
    }
}
