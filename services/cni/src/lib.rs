//! meshwork-cni: a CNI plugin (spec 1.0.0; 0.3.0, 0.3.1 and 0.4.0 configs too) that gives
//! a pod an IP from its node's agent, a veth, and a BPF endpoint.
//!
//! - ADD: `Ipam/Allocate` for the owner `<CNI_CONTAINERID>/<CNI_IFNAME>` → the veth (host end
//!   [`naming::host_ifname`], the peer made inside CNI_NETNS as CNI_IFNAME), the address,
//!   routes and gateway neighbour ([`plumbing`]) → `Datapath/PutEndpoint` (ID
//!   [`naming::endpoint_id`]) → the result. A failure after the allocation undoes the
//!   endpoint, the veth and the IP before it is reported.
//! - DEL: `Datapath/DeleteEndpoint`, the veth, `Ipam/Release`; anything already gone counts
//!   as done.
//! - CHECK: the endpoint, the IPAM allocation, and the veth, address and routes against
//!   `prevResult`.
//! - VERSION: the versions in [`config::SpecVersion::ALL`]; STATUS and GC (CNI 1.1) are
//!   answered as unknown commands (code 4).
//!
//! `meshwork-cni install` ([`install`]) puts the plugin and its conflist on the node, for the
//! agent DaemonSet's init container.
//!
//! The config keys are in [`config`], the error codes in [`error::ErrorCode`]. Every
//! failure is a [`CniError`], printed as the spec's error JSON with a non-zero exit.
//!
//! The host end goes into the plugin's own namespace, which is taken to be the agent's
//! (`Endpoint.netns` empty). When the runtime runs the plugin elsewhere than the agent (a
//! podman on the machine with the agent in a lab node namespace), the config's
//! `host-netns` names the agent's namespace: the host end and the pod's route go there,
//! and the endpoint is registered with that path, so the runtime's namespace is never
//! changed.
//!
//! Library use (the binary is [`main_entry`]):
//!
//! ```no_run
//! use meshwork_cni::{CniEnv, Command};
//! let env = CniEnv {
//!     container_id: Some("c0ffee".into()),
//!     netns: Some("/run/netns/pod".into()),
//!     ifname: Some("eth0".into()),
//!     ..CniEnv::default()
//! };
//! let config = br#"{"cniVersion":"1.0.0","name":"mesh","type":"meshwork-cni","identity":4242}"#;
//! match meshwork_cni::run(Command::Add, &env, config) {
//!     Ok(output) => println!("{}", output.to_json().unwrap_or_default()),
//!     Err(err) => eprintln!("{err}"),
//! }
//! ```

pub mod agent;
mod commands;
pub mod config;
pub mod env;
pub mod error;
pub mod install;
pub mod naming;
pub mod netlink;
pub mod netns;
pub mod plumbing;
pub mod result;

use std::io::Read as _;
use std::process::ExitCode;

pub use config::{NetConf, SpecVersion};
pub use env::{CniArgs, CniEnv, Command};
pub use error::{CniError, ErrorCode};
pub use result::{CniResult, VersionInfo};

/// What a successful command prints.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// ADD's result.
    Added(CniResult),
    /// DEL succeeded (prints nothing).
    Deleted,
    /// CHECK found everything in place (prints nothing).
    Checked,
    /// VERSION's answer.
    Version(VersionInfo),
}

impl Output {
    /// The JSON to print, if the command prints any.
    pub fn to_json(&self) -> Option<String> {
        match self {
            Self::Added(result) => Some(result.to_json()),
            Self::Version(info) => Some(info.to_json()),
            Self::Deleted | Self::Checked => None,
        }
    }
}

/// Runs `command` with `env` and the network config `stdin`, on a current-thread tokio
/// runtime of its own. Call [`run_async`] from inside a runtime.
pub fn run(command: Command, env: &CniEnv, stdin: &[u8]) -> Result<Output, CniError> {
    if is_local(command) {
        return answer_locally(command, stdin);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|err| {
            CniError::new(ErrorCode::Io, "cannot start the async runtime")
                .with_details(err.to_string())
        })?;
    runtime.block_on(run_async(command, env, stdin))
}

/// [`run`], on the caller's runtime (the network work goes to its blocking pool).
pub async fn run_async(command: Command, env: &CniEnv, stdin: &[u8]) -> Result<Output, CniError> {
    if is_local(command) {
        return answer_locally(command, stdin);
    }
    let conf = NetConf::parse(stdin)?;
    match command {
        Command::Del => commands::del(env, &conf).await.map(|()| Output::Deleted),
        Command::Check => commands::check(env, &conf).await.map(|()| Output::Checked),
        _ => commands::add(env, &conf).await.map(Output::Added),
    }
}

/// VERSION, STATUS and GC need neither a full config nor the agent.
fn is_local(command: Command) -> bool {
    matches!(command, Command::Version | Command::Status | Command::Gc)
}

fn answer_locally(command: Command, stdin: &[u8]) -> Result<Output, CniError> {
    if command == Command::Version {
        return config::parse_version_only(stdin)
            .map(|asked| Output::Version(VersionInfo::new(asked)));
    }
    Err(CniError::new(
        ErrorCode::InvalidEnvironment,
        format!(
            "CNI_COMMAND {command} is CNI 1.1's; meshwork-cni speaks up to 1.0.0 \
             (ADD, DEL, CHECK, VERSION)"
        ),
    ))
}

/// What the binary prints and how it exits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Printed on stdout (empty for DEL and CHECK).
    pub stdout: String,
    /// 0 on success, 1 on any error.
    pub exit_code: u8,
}

/// Runs the CNI_COMMAND `command` (`None`: unset) and renders the outcome: the result, or
/// the error JSON in the config's version (1.0.0 when it has none this plugin speaks).
pub fn respond(command: Option<&str>, env: &CniEnv, stdin: &[u8]) -> Response {
    let outcome = match command {
        None => Err(CniError::new(
            ErrorCode::InvalidEnvironment,
            "CNI_COMMAND is not set (ADD, DEL, CHECK or VERSION)",
        )),
        Some(text) => text
            .parse::<Command>()
            .and_then(|command| run(command, env, stdin)),
    };
    match outcome {
        Ok(output) => Response {
            stdout: output.to_json().unwrap_or_default(),
            exit_code: 0,
        },
        Err(err) => {
            let version = config::peek_version(stdin).unwrap_or(SpecVersion::V1_0_0);
            Response {
                stdout: err.to_json(version.as_str()),
                exit_code: 1,
            }
        }
    }
}

/// The binary: with the argument `install`, [`install::main`]; otherwise reads CNI_* from
/// the environment and the config from stdin (not when
/// CNI_COMMAND is unset: a plugin started by hand must not wait for input), prints the
/// outcome on stdout.
pub fn main_entry() -> ExitCode {
    // A runtime passes no arguments; `install` is the DaemonSet's init container.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|arg| arg == "install")
    {
        return install::main(std::env::args_os());
    }
    let command = std::env::var("CNI_COMMAND").ok().filter(|c| !c.is_empty());
    let env = CniEnv::from_vars(std::env::vars_os());
    let mut stdin = Vec::new();
    let response = match command {
        Some(_) => match std::io::stdin().read_to_end(&mut stdin) {
            Ok(_) => respond(command.as_deref(), &env, &stdin),
            Err(err) => Response {
                stdout: CniError::new(ErrorCode::Io, "cannot read the network config from stdin")
                    .with_details(err.to_string())
                    .to_json(SpecVersion::V1_0_0.as_str()),
                exit_code: 1,
            },
        },
        None => respond(None, &env, &stdin),
    };
    if !response.stdout.is_empty() {
        println!("{}", response.stdout);
    }
    ExitCode::from(response.exit_code)
}
