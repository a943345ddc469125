//! The binaries the manifests run, each command line parsed by that binary's own parser
//! (the libraries' `parse_args`, in [`parsers`]), and what the parse says it listens on,
//! reads and dials.

mod parsers;

use std::net::SocketAddr;

use clap::CommandFactory as _;
use meshwork_cni::install::InstallArgs;

use crate::env::Environment;

/// The images the manifests name and where each holds its binaries, as
/// `xtask/scenarios/src/dev/images.rs` lays them out (`FROM scratch`: no shell, so every
/// command and exec probe is one of these; the agent's image carries the CNI plugin where
/// it installs itself from).
pub const IMAGES: &[(&str, &[&str])] = &[
    (
        "meshwork/agent",
        &[
            "/usr/bin/meshwork-agent",
            "/usr/bin/meshctl",
            "/opt/cni/bin/meshwork-cni",
        ],
    ),
    (
        "meshwork/operator",
        &["/usr/bin/meshwork-operator", "/usr/bin/meshctl"],
    ),
    (
        "meshwork/apiserver",
        &["/usr/bin/meshwork-apiserver", "/usr/bin/meshctl"],
    ),
    ("meshwork/etcd", &["/usr/bin/etcd", "/usr/bin/etcdctl"]),
];

/// The binaries of `image` (its repository, without tag or digest), if it is known.
pub fn image_binaries(image: &str) -> Option<&'static [&'static str]> {
    let repository = image.split('@').next().unwrap_or(image);
    let repository = match repository.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') => name,
        _ => repository,
    };
    IMAGES
        .iter()
        .find(|(name, _)| *name == repository)
        .map(|(_, binaries)| *binaries)
}

/// A binary the checks know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binary {
    /// `meshwork-agent`.
    Agent,
    /// `meshwork-operator`.
    Operator,
    /// `meshwork-apiserver` (with `kvstoremesh` and `etcd-init`).
    Apiserver,
    /// `meshctl`.
    Meshctl,
    /// `meshwork-cni`.
    Cni,
    /// etcd (not Meshwork's: its flags are checked against the ones it has).
    Etcd,
}

impl Binary {
    /// The binary a command's path names.
    pub fn from_path(path: &str) -> Option<Self> {
        Some(match path.rsplit('/').next().unwrap_or(path) {
            "meshwork-agent" => Self::Agent,
            "meshwork-operator" => Self::Operator,
            "meshwork-apiserver" => Self::Apiserver,
            "meshctl" => Self::Meshctl,
            "meshwork-cni" => Self::Cni,
            "etcd" => Self::Etcd,
            _ => return None,
        })
    }
}

/// What a listener speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP serving these paths.
    Http(&'static [&'static str]),
    /// gRPC with the standard health service; `tls`: only over TLS.
    Grpc {
        /// TLS is required.
        tls: bool,
    },
    /// Another TCP protocol (etcd's client API).
    Tcp,
}

/// A TCP port a binary listens on, as its flags say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    /// The flag that sets it.
    pub flag: &'static str,
    /// The port.
    pub port: u16,
    /// Bound to a loopback address only (unreachable from outside the pod's network).
    pub loopback: bool,
    /// What it speaks.
    pub protocol: Protocol,
}

/// Which reader a clustermesh config directory is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    /// The agent (remotes read through the local etcd's cache: user `local-<cluster>`).
    Agent,
    /// kvstoremesh (each remote's own etcd: user `remote`).
    Kvstoremesh,
}

/// A clustermesh config directory and who reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigDir {
    /// The directory.
    pub dir: String,
    /// The local cluster (its own file is ignored).
    pub local_cluster: String,
    /// The reader.
    pub reader: Reader,
}

/// A file a binary reads, by the flag that names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileFlag {
    /// The flag.
    pub flag: &'static str,
    /// The path.
    pub path: String,
}

/// An address a binary connects to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dial {
    /// The flag.
    pub flag: &'static str,
    /// The host (a name or an IP).
    pub host: String,
    /// The port.
    pub port: u16,
    /// Over TLS (the server's certificate must name `host`).
    pub tls: bool,
}

/// A command line, parsed.
#[derive(Debug, Clone)]
pub struct Parsed {
    /// The binary.
    pub binary: Binary,
    /// Its TCP listeners.
    pub listeners: Vec<Listener>,
    /// The files it reads.
    pub files: Vec<FileFlag>,
    /// The addresses it connects to.
    pub dials: Vec<Dial>,
    /// Its clustermesh config directory.
    pub config_dir: Option<ConfigDir>,
    /// The agent's API socket.
    pub api_socket: Option<String>,
    /// The etcd client certificate it presents (`--kvstore-cert-file`) and the etcd users
    /// that certificate's CN may be.
    pub etcd_user: Option<(String, Vec<String>)>,
    /// `meshctl health`: the socket, and the `--grpc-addr` if given.
    pub health: Option<(String, Option<String>)>,
    /// `meshwork-cni install`.
    pub install: Option<InstallArgs>,
    /// The operator on Kubernetes: the namespace of its Lease (`None`: the pod's).
    pub kube_operator: Option<Option<String>>,
}

impl Parsed {
    /// Nothing parsed yet, for `binary`.
    pub(crate) fn new_for(binary: Binary) -> Self {
        Self {
            binary,
            listeners: Vec::new(),
            files: Vec::new(),
            dials: Vec::new(),
            config_dir: None,
            api_socket: None,
            etcd_user: None,
            health: None,
            install: None,
            kube_operator: None,
        }
    }

    /// Records the file `path` names, if given.
    fn file(&mut self, flag: &'static str, path: Option<&std::path::Path>) {
        if let Some(path) = path {
            self.files.push(FileFlag {
                flag,
                path: path.display().to_string(),
            });
        }
    }

    /// Records the `--kvstore-*` flags every etcd client shares: its TLS files and the
    /// endpoints it dials.
    fn kvstore(
        &mut self,
        endpoints: &[String],
        trusted_ca: Option<&std::path::Path>,
        cert: Option<&std::path::Path>,
        key: Option<&std::path::Path>,
    ) -> Result<(), String> {
        self.file("kvstore-trusted-ca-file", trusted_ca);
        self.file("kvstore-cert-file", cert);
        self.file("kvstore-key-file", key);
        for endpoint in endpoints {
            self.dial(
                "kvstore-endpoints",
                endpoint,
                endpoint.starts_with("https://"),
            )?;
        }
        Ok(())
    }

    /// Records the listener `text` (`IP:PORT`; empty: disabled) sets.
    fn listen(&mut self, flag: &'static str, text: &str, protocol: Protocol) -> Result<(), String> {
        if text.is_empty() {
            return Ok(());
        }
        let addr: SocketAddr = text
            .parse()
            .map_err(|e| format!("--{flag} {text:?} is not IP:PORT: {e}"))?;
        self.listeners.push(Listener {
            flag,
            port: addr.port(),
            loopback: addr.ip().is_loopback(),
            protocol,
        });
        Ok(())
    }

    /// Records the address `address` (`[scheme://]HOST:PORT`) dials.
    fn dial(&mut self, flag: &'static str, address: &str, tls: bool) -> Result<(), String> {
        let rest = address.split_once("://").map_or(address, |(_, rest)| rest);
        let rest = rest.trim_end_matches('/');
        let (host, port) = rest
            .rsplit_once(':')
            .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
            .ok_or_else(|| format!("--{flag} {address:?} has no HOST:PORT"))?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        self.dials.push(Dial {
            flag,
            host,
            port,
            tls,
        });
        Ok(())
    }
}

/// Paths served on the agent's and the operator's metrics port.
const METRICS_AND_HEALTH: &[&str] = &["/metrics", "/healthz"];
/// Paths served on the apiserver's and kvstoremesh's health port.
const HEALTH: &[&str] = &["/healthz", "/readyz"];
/// Paths served on their metrics port.
const METRICS: &[&str] = &["/metrics"];

/// Parses `argv` (program first, `$(VAR)` expanded) with `binary`'s own parser, in the
/// container environment `env` (the variables its flags read, such as `K8S_NODE_NAME`, become
/// those flags), then checks what the binary checks before it starts, but the files.
pub fn parse(binary: Binary, argv: &[String], env: &Environment) -> Result<Parsed, String> {
    match binary {
        Binary::Agent => parsers::agent(&with_env(&meshwork_agent::Args::command(), argv, env)),
        Binary::Operator => parsers::operator(&with_env(
            &meshwork_operator::args::Cli::command(),
            argv,
            env,
        )),
        Binary::Apiserver => parsers::apiserver(&with_env(
            &meshwork_apiserver::cli::Cli::command(),
            argv,
            env,
        )),
        Binary::Meshctl => parsers::meshctl(&with_env(&meshctl::cli::Cli::command(), argv, env)),
        Binary::Cni => parsers::cni(argv),
        Binary::Etcd => crate::etcd::parse(argv),
    }
}

/// `argv` plus, for every flag reading an environment variable that `env` sets and `argv`
/// does not give, that flag: the root's after the program name, a subcommand's at the end.
fn with_env(command: &clap::Command, argv: &[String], env: &Environment) -> Vec<String> {
    let given = |long: &str| {
        argv.iter()
            .any(|arg| arg == &format!("--{long}") || arg.starts_with(&format!("--{long}=")))
    };
    let from_env = |command: &clap::Command| -> Vec<String> {
        command
            .get_arguments()
            .filter(|arg| arg.get_action().takes_values())
            .filter_map(|arg| {
                let long = arg.get_long()?;
                let value = env.get(arg.get_env()?.to_str()?)?;
                (!given(long)).then(|| format!("--{long}={value}"))
            })
            .collect()
    };
    let mut full: Vec<String> = argv.iter().take(1).cloned().collect();
    full.extend(from_env(command));
    full.extend(argv.iter().skip(1).cloned());
    let subcommand = argv
        .iter()
        .skip(1)
        .find(|arg| !arg.starts_with('-'))
        .and_then(|name| command.find_subcommand(name));
    if let Some(subcommand) = subcommand {
        full.extend(from_env(subcommand));
    }
    full
}
