//! `meshctl`'s command line. It is the library's only module (the binary reads it with
//! [`Cli::parse`](clap::Parser)) so that other code can parse a command line exactly as
//! `meshctl` does: the deploy checks parse the `meshctl health` probes of the manifests with
//! [`parse_args`].

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Parses `args` (the program name first) as `meshctl` does, without exiting.
pub fn parse_args<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    Cli::try_parse_from(args)
}

/// The agent's API socket unless `--socket` or `MESHWORK_SOCKET` says otherwise.
pub const DEFAULT_SOCKET: &str = "/var/run/meshwork/agent.sock";

/// Inspect a running Meshwork agent.
#[derive(Debug, Parser)]
#[command(
    name = "meshctl",
    version,
    long_about = "Inspect a running Meshwork agent through its local API (a unix socket, the \
                  agent's --api-socket).",
    after_help = "Exit status: 0 ok; 1 `status --wait` timed out before every remote cluster was \
                  ready, `health` found the server NOT_SERVING, or `troubleshoot clustermesh` \
                  found a failing check; 2 usage error; 3 the agent could not be reached or \
                  answered with an error (or the clustermesh config directory could not be read)."
)]
pub struct Cli {
    /// The agent's API socket (the agent's --api-socket).
    #[arg(
        long,
        global = true,
        value_name = "PATH",
        env = "MESHWORK_SOCKET",
        hide_env_values = true,
        default_value = DEFAULT_SOCKET
    )]
    pub socket: PathBuf,

    /// A meshwork-apiserver's gRPC address (HOST:PORT, its --grpc-serve-addr), for
    /// `service` and `node`.
    #[arg(
        long,
        global = true,
        value_name = "HOST:PORT",
        env = "MESHWORK_APISERVER"
    )]
    pub apiserver: Option<String>,

    /// kvstoremesh's status API (HOST:PORT, its --api-serve-addr, default 127.0.0.1:9889):
    /// `status` then shows the remote clusters kvstoremesh caches instead of the agent's,
    /// and `troubleshoot clustermesh` checks those of kvstoremesh's config directory.
    #[arg(
        long,
        global = true,
        value_name = "HOST:PORT",
        env = "MESHWORK_KVSTOREMESH"
    )]
    pub kvstoremesh: Option<String>,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// meshctl's commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show the cluster mesh: each remote cluster's connection, sync state and errors.
    ///
    /// For each remote cluster: whether it is ready, its etcd connection and endpoints, its
    /// cluster configuration and cluster ID, whether its nodes, services, identities and
    /// endpoints (ipcache) have synced, how many entries of each the agent holds, its
    /// connection failures (with the last one's time) and its last error.
    ///
    /// With --kvstoremesh, the same for each remote cluster kvstoremesh caches, and the
    /// cache's state (ready, keys cached, write failures).
    Status(StatusArgs),
    /// Inspect the BPF maps directly on bpffs (no agent needed).
    #[command(subcommand)]
    Bpf(BpfCommand),
    /// List, add or delete the agent's local endpoints.
    #[command(subcommand)]
    Endpoint(EndpointCommand),
    /// Transparent encryption (WireGuard).
    #[command(subcommand)]
    Encrypt(EncryptCommand),
    /// Ask a Meshwork gRPC server's standard health service (grpc.health.v1) whether it is
    /// SERVING: the agent on its socket, or any server with --grpc-addr. A probe: exit 0
    /// when SERVING, 1 when not.
    ///
    /// The agent is SERVING once its start-up sync wait has returned (every remote cluster
    /// synced, or the --clustermesh-sync-timeout breaker fired); the operator once it has
    /// listed its CiliumNodes and described EC2. Both turn NOT_SERVING when they stop.
    Health(HealthArgs),
    /// Declare, delete and list the cluster's global services (on the apiserver, with
    /// --apiserver).
    #[command(subcommand)]
    Service(ServiceCommand),
    /// Manage the nodes the apiserver publishes (with --apiserver).
    #[command(subcommand)]
    Node(NodeCommand),
    /// Find out why a remote cluster does not connect.
    #[command(subcommand)]
    Troubleshoot(TroubleshootCommand),
    /// When each step of the agent's current start happened: the start, each remote
    /// connected, each remote's first lists, each sync wait returned (synced or breaker),
    /// each endpoint regenerated, WireGuard GC and prune passes; as a table, --json, or
    /// drawn with --svg FILE / --png FILE.
    Timeline(TimelineArgs),
}

/// `meshctl troubleshoot …`.
#[derive(Debug, Subcommand)]
pub enum TroubleshootCommand {
    /// Check, step by step, the connection to each remote cluster's etcd, as Cilium's
    /// `cilium-dbg troubleshoot clustermesh` does.
    ///
    /// For each remote cluster, in order: its config file parses (the agent's own parser);
    /// for each endpoint, its URL, DNS (names only), a TCP connection, the TLS handshake
    /// (with the CAs the server accepts when the client certificate matches none; the TLS
    /// version and cipher suite), the server's certificate (names the endpoint, valid), and
    /// a raw GET /version (etcd's version; a TLS 1.3 client-certificate refusal shows only
    /// here); the certificates of trusted-ca-file and cert-file (serial, subject, issuer,
    /// validity; expired or not yet valid fails, expiring within 30 days warns); then an etcd
    /// client as the agent's (1 s dial) reading cilium/.heartbeat (authorization), the etcd
    /// cluster ID and version, the heartbeat's age (over 2 minutes warns) and the remote's
    /// cilium/cluster-config/<name> (present, valid, compatible with
    /// --max-connected-clusters).
    ///
    /// The clusters are those of the agent's clustermesh config directory, which the agent
    /// reports (with --kvstoremesh, kvstoremesh's), or every file of --clustermesh-config
    /// DIR without asking anyone. Run it where the agent runs: it reads the same files.
    Clustermesh(ClustermeshArgs),
}

/// `meshctl troubleshoot clustermesh`.
#[derive(Debug, Args)]
#[command(
    after_help = "One line per check: ✔ passed, ⚠ warning, ✖ failed (with the reason and a \
                  hint). A check that needs an earlier one that failed is not run. Exit \
                  status: 0 when nothing failed (warnings included), 1 when a check failed, \
                  3 when the agent, kvstoremesh or the directory could not be read."
)]
pub struct ClustermeshArgs {
    /// Remote clusters to check (default: every one configured).
    #[arg(value_name = "CLUSTER")]
    pub clusters: Vec<String>,

    /// Read this clustermesh config directory instead of asking the agent (or kvstoremesh)
    /// for its own.
    #[arg(long, value_name = "DIR")]
    pub clustermesh_config: Option<PathBuf>,

    /// How long the checks of one cluster may take (clusters are checked at once).
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "5s",
        value_parser = humantime::parse_duration
    )]
    pub timeout: Duration,

    /// Our --max-connected-clusters (255 or 511), which a remote's cluster config must be
    /// compatible with.
    #[arg(long, value_name = "N", default_value_t = 255)]
    pub max_connected_clusters: u32,

    /// Print the report as one line of JSON instead of the human view.
    #[arg(long)]
    pub json: bool,
}

/// `meshctl service …`.
#[derive(Debug, Subcommand)]
pub enum ServiceCommand {
    /// Declare (create or replace) a global service; its backends are this cluster's
    /// endpoints whose labels carry every selector label.
    Put(ServicePutArgs),
    /// Delete a global service.
    Delete {
        /// NAMESPACE/NAME.
        service: String,
    },
    /// Every declared service with its backends.
    List {
        /// One line of JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `meshctl service put`.
#[derive(Debug, Args)]
pub struct ServicePutArgs {
    /// NAMESPACE/NAME.
    pub service: String,
    /// A frontend IP, its cluster IP (repeat for more).
    #[arg(long = "frontend", value_name = "IP", required = true)]
    pub frontends: Vec<String>,
    /// A port, NAME:PORT[/PROTOCOL] (protocol TCP, UDP or SCTP; default TCP; repeat for more).
    #[arg(long = "port", value_name = "NAME:PORT[/PROTO]", required = true)]
    pub ports: Vec<String>,
    /// The labels a backend carries, source:key=value, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub selector: Vec<String>,
    /// Share it with remote clusters (Cilium's service.cilium.io/shared); only shared
    /// services are written to etcd.
    #[arg(long)]
    pub shared: bool,
}

/// `meshctl node …`.
#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Delete a node's entries at once (its agent must be gone), instead of waiting for the
    /// apiserver's --node-gc-grace.
    Delete {
        /// The node's name.
        name: String,
    },
}

/// `meshctl health`.
#[derive(Debug, Args)]
pub struct HealthArgs {
    /// One service's status (e.g. meshwork.agent.v1.Datapath) instead of the server's.
    #[arg(long, value_name = "NAME", default_value = "")]
    pub service: String,
    /// A server on TCP (HOST:PORT, e.g. the operator's --grpc-serve-addr) instead of the
    /// agent's socket.
    #[arg(long, value_name = "HOST:PORT")]
    pub grpc_addr: Option<String>,
}

/// `meshctl bpf …`.
#[derive(Debug, Subcommand)]
pub enum BpfCommand {
    /// The ipcache map.
    #[command(subcommand)]
    Ipcache(IpcacheCommand),
}

/// `meshctl bpf ipcache …`.
#[derive(Debug, Subcommand)]
pub enum IpcacheCommand {
    /// Every entry of the pinned `cilium_ipcache`: prefix, identity, encryption key, tunnel
    /// endpoint (0.0.0.0: the local node) and cluster ID, like `cilium-dbg bpf ipcache list`.
    List {
        /// The agent's --bpf-root.
        #[arg(long, default_value = "/sys/fs/bpf", value_name = "DIR")]
        bpf_root: PathBuf,
        /// One line of JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `meshctl endpoint …`.
#[derive(Debug, Subcommand)]
pub enum EndpointCommand {
    /// Every endpoint with its state (waiting-for-sync, ready, failed) and generation.
    List {
        /// One line of JSON.
        #[arg(long)]
        json: bool,
    },
    /// Create or replace an endpoint; the agent persists it and attaches its program.
    Add(EndpointAddArgs),
    /// Delete an endpoint: its program is detached and its ipcache entries removed.
    Delete {
        /// The endpoint's ID.
        id: u64,
    },
}

/// `meshctl endpoint add`.
#[derive(Debug, Args)]
pub struct EndpointAddArgs {
    /// Unique, non-zero ID.
    #[arg(long)]
    pub id: u64,
    /// The host side of the endpoint's veth.
    #[arg(long)]
    pub interface: String,
    /// The network namespace holding the interface (e.g. /run/netns/node-a).
    #[arg(long, value_name = "PATH")]
    pub netns: Option<PathBuf>,
    /// An IP of the endpoint (repeat for more).
    #[arg(long, required = true)]
    pub ip: Vec<String>,
    /// The endpoint's security identity; without it, `--labels` get one from the cluster's
    /// apiserver (the agent runs with --apiserver-addr).
    #[arg(long, default_value_t = 0, required_unless_present = "labels")]
    pub identity: u32,
    /// The endpoint's security labels, source:key=value, comma-separated (e.g.
    /// k8s:app=web); published to the apiserver with the endpoint.
    #[arg(long, value_delimiter = ',')]
    pub labels: Vec<String>,
    /// The pod it is, NAMESPACE/NAME.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pub pod: Option<String>,
    /// A destination identity it may reach (repeat for more); all else is dropped.
    #[arg(long)]
    pub allow: Vec<u32>,
    /// This is the host endpoint.
    #[arg(long)]
    pub host: bool,
}

/// `meshctl encrypt`.
#[derive(Debug, Subcommand)]
pub enum EncryptCommand {
    /// Show the WireGuard device (name, public key, listen port), each peer (node, endpoint,
    /// allowed IPs, last handshake, bytes received/sent) and restored peers still awaiting
    /// garbage collection with the wait that blocks them.
    Status {
        /// Print the status as one line of JSON instead of the human view.
        #[arg(long)]
        json: bool,
    },
}

/// `meshctl status`.
#[derive(Debug, Args)]
#[command(
    after_help = "A cluster is ready when its etcd is connected, its cluster configuration \
                        is retrieved and valid, its cluster ID is reserved, and all four kinds have \
                        synced. With --wait, live progress goes to stderr (one line per change \
                        when stderr is not a terminal) and the status to stdout."
)]
pub struct StatusArgs {
    /// Print the status as one line of JSON instead of the human view.
    #[arg(long)]
    pub json: bool,

    /// Poll the agent (every 250 ms, retrying while it is unreachable) until every remote
    /// cluster is ready, showing live per-cluster progress, then print the status. Exits 1
    /// if the timeout comes first.
    #[arg(long)]
    pub wait: bool,

    /// How long --wait waits, e.g. 30s, 2m, 1h30m.
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "5m",
        value_parser = humantime::parse_duration,
        requires = "wait"
    )]
    pub timeout: Duration,
}

/// `meshctl timeline`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Steps: start; connected (a remote's etcd connected and its cluster config \
                  valid); first-list (a remote's store listed and applied by every consumer); \
                  wait-returned (a sync wait returned: synced, breaker, timeout or failed, with \
                  who waited: readiness, regeneration, prune, wireguard-gc); regenerated (an \
                  endpoint's program); wireguard-gc; prune (restored map entries). The picture \
                  has one row per remote × store with a bar from the start to its first list, \
                  a lane of the agent's own steps, and a red line where a breaker fired."
)]
pub struct TimelineArgs {
    /// Print the timeline as one line of JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also draw it as SVG into FILE.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Also draw it as PNG into FILE (its text needs a TrueType font: --font, or one found
    /// under /usr/share/fonts).
    #[arg(long, value_name = "FILE")]
    pub png: Option<PathBuf>,
    /// The font for --png's text (a .ttf or .otf file).
    #[arg(long, value_name = "FILE", requires = "png")]
    pub font: Option<PathBuf>,
    /// The picture's caption.
    #[arg(
        long,
        value_name = "TEXT",
        default_value = "meshwork-agent start timeline"
    )]
    pub title: String,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn timeout_parses_human_durations_and_needs_wait() {
        let cli = Cli::try_parse_from(["meshctl", "status", "--wait", "--timeout", "2m"]).unwrap();
        let Command::Status(args) = cli.command else {
            panic!("status expected")
        };
        assert_eq!(args.timeout, Duration::from_secs(120));

        let cli = Cli::try_parse_from(["meshctl", "status"]).unwrap();
        let Command::Status(args) = cli.command else {
            panic!("status expected")
        };
        assert_eq!(args.timeout, Duration::from_secs(300));

        assert!(Cli::try_parse_from(["meshctl", "status", "--timeout", "2m"]).is_err());
        assert!(Cli::try_parse_from(["meshctl", "status", "--wait", "--timeout", "soon"]).is_err());
    }

    #[test]
    fn troubleshoot_defaults_to_every_cluster_within_five_seconds() {
        let troubleshoot = |args: &[&str]| {
            let cli = Cli::try_parse_from(args).unwrap();
            let Command::Troubleshoot(TroubleshootCommand::Clustermesh(args)) = cli.command else {
                panic!("troubleshoot clustermesh expected")
            };
            args
        };
        let args = troubleshoot(&["meshctl", "troubleshoot", "clustermesh"]);
        assert!(args.clusters.is_empty() && !args.json);
        assert_eq!(args.timeout, Duration::from_secs(5));
        assert_eq!(args.max_connected_clusters, 255);
        let args = troubleshoot(&[
            "meshctl",
            "troubleshoot",
            "clustermesh",
            "c1",
            "c2",
            "--timeout",
            "2s",
            "--clustermesh-config",
            "/etc/cm",
        ]);
        assert_eq!(args.clusters, ["c1", "c2"]);
        assert_eq!(args.timeout, Duration::from_secs(2));
        assert_eq!(args.clustermesh_config, Some(PathBuf::from("/etc/cm")));
    }
}
