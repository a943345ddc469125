//! `meshwork-cni install`: the plugin installs itself on the node, for an init container of
//! the agent's DaemonSet (whose image has no shell to copy files with): the running
//! executable goes to `--cni-bin-dir` as `meshwork-cni`, and a conflist naming it, with the
//! agent's socket, to `--cni-conf-dir` (Cilium's agent writes `05-cilium.conflist` there).
//! Both are written to a temporary file in the same directory and renamed over the old one,
//! so a runtime never reads half a file; installing the same again changes nothing.
//!
//! A runtime runs the plugin with no arguments (the CNI protocol is environment and stdin),
//! so a first argument `install` cannot be a runtime's call.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};
use serde_json::json;

use crate::config::DEFAULT_AGENT_SOCKET;

/// The plugin's file name in the bin dir: the conflist's `type`.
pub const PLUGIN_NAME: &str = "meshwork-cni";

/// The plugin's command line outside the CNI protocol.
#[derive(Debug, Parser)]
#[command(
    name = "meshwork-cni",
    version,
    about = "The Meshwork CNI plugin. Run by a container runtime (CNI_COMMAND and stdin), or \
             with `install` to install itself and its conflist on the node."
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: CliCommand,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum CliCommand {
    /// Copy this executable into the CNI bin dir and write the conflist.
    Install(InstallArgs),
}

/// `meshwork-cni install`.
#[derive(Debug, Clone, clap::Args)]
pub struct InstallArgs {
    /// Where the runtime looks for plugins (the node's /opt/cni/bin, as mounted here).
    #[arg(long, default_value = "/host/opt/cni/bin", value_name = "DIR")]
    pub cni_bin_dir: PathBuf,
    /// Where the runtime reads network configs (the node's /etc/cni/net.d, as mounted here).
    #[arg(long, default_value = "/host/etc/cni/net.d", value_name = "DIR")]
    pub cni_conf_dir: PathBuf,
    /// The conflist's file name; runtimes take the first in lexical order.
    #[arg(long, default_value = "05-meshwork.conflist", value_name = "FILE")]
    pub cni_conf_name: String,
    /// The network's name in the conflist.
    #[arg(long, default_value = "meshwork", value_name = "NAME")]
    pub network_name: String,
    /// The agent's API socket as the plugin will see it: a path on the node (the agent's
    /// `--api-socket` on its host-path state dir).
    #[arg(long, default_value = DEFAULT_AGENT_SOCKET, value_name = "PATH")]
    pub agent_socket: PathBuf,
}

/// Parses `args` (the program name first) as `meshwork-cni` does outside the CNI protocol.
pub fn parse_args<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    Cli::try_parse_from(args)
}

/// Why installing failed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// A file could not be read or written.
    #[error("{what} {}: {error}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        error: std::io::Error,
    },
    /// `--cni-conf-name` is not a plain file name.
    #[error("--cni-conf-name {0:?} must be a file name ending in .conflist")]
    ConfName(String),
}

/// What [`install`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// The plugin.
    pub plugin: PathBuf,
    /// The conflist.
    pub conflist: PathBuf,
}

/// The conflist `args` install: spec 1.0.0, one plugin of type [`PLUGIN_NAME`] with the
/// agent's socket.
pub fn conflist(args: &InstallArgs) -> String {
    let value = json!({
        "cniVersion": "1.0.0",
        "name": args.network_name,
        "plugins": [{
            "type": PLUGIN_NAME,
            "agent-socket": args.agent_socket,
        }],
    });
    let mut text = serde_json::to_string_pretty(&value).unwrap_or_default();
    text.push('\n');
    text
}

/// Copies `plugin` (normally this executable) into the bin dir and writes the conflist.
pub fn install(args: &InstallArgs, plugin: &Path) -> Result<Installed, InstallError> {
    let name = &args.cni_conf_name;
    if name.contains('/') || name.starts_with('.') || !name.ends_with(".conflist") {
        return Err(InstallError::ConfName(name.clone()));
    }
    let bytes = std::fs::read(plugin).map_err(io("reading the plugin", plugin))?;
    let plugin_path = args.cni_bin_dir.join(PLUGIN_NAME);
    replace(&plugin_path, &bytes, 0o755)?;
    let conflist_path = args.cni_conf_dir.join(name);
    replace(&conflist_path, conflist(args).as_bytes(), 0o644)?;
    Ok(Installed {
        plugin: plugin_path,
        conflist: conflist_path,
    })
}

/// Writes `bytes` to a temporary file beside `path`, syncs it, and renames it over `path`.
fn replace(path: &Path, bytes: &[u8], mode: u32) -> Result<(), InstallError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file_name = path.file_name().unwrap_or_default().to_string_lossy();
    let temporary = path.with_file_name(format!(".{file_name}.{}.tmp", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&temporary)
        .and_then(|mut file| {
            file.write_all(bytes)?;
            file.sync_all()
        });
    if let Err(error) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(io("writing", &temporary)(error));
    }
    std::fs::rename(&temporary, path).map_err(|error| {
        let _ = std::fs::remove_file(&temporary);
        io("renaming into place", path)(error)
    })
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> InstallError {
    let path = path.to_owned();
    move |error| InstallError::Io { what, path, error }
}

/// `meshwork-cni install …`: installs, printing what it wrote; exit 1 on failure.
pub fn main(args: impl IntoIterator<Item = std::ffi::OsString>) -> std::process::ExitCode {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(err) => err.exit(),
    };
    let CliCommand::Install(args) = cli.command;
    let installed = std::env::current_exe()
        .map_err(io("finding this executable", Path::new("/proc/self/exe")))
        .and_then(|exe| install(&args, &exe));
    match installed {
        Ok(installed) => {
            println!(
                "installed {} and {}",
                installed.plugin.display(),
                installed.conflist.display()
            );
            std::process::ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("meshwork-cni install: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NetConf;

    fn args(dir: &Path) -> InstallArgs {
        let cli = parse_args([
            "meshwork-cni".into(),
            "install".into(),
            "--cni-bin-dir".into(),
            dir.join("bin").into_os_string(),
            "--cni-conf-dir".into(),
            dir.join("net.d").into_os_string(),
            "--agent-socket".into(),
            std::ffi::OsString::from("/var/run/meshwork/agent.sock"),
        ])
        .expect("parses");
        let CliCommand::Install(args) = cli.command;
        args
    }

    #[test]
    fn installs_the_plugin_and_a_conflist_the_plugin_itself_accepts() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir(dir.path().join("bin")).expect("bin");
        std::fs::create_dir(dir.path().join("net.d")).expect("net.d");
        let plugin = dir.path().join("built-plugin");
        std::fs::write(&plugin, b"\x7fELF plugin").expect("plugin");
        let args = args(dir.path());

        let installed = install(&args, &plugin).expect("installs");
        assert_eq!(installed.plugin, dir.path().join("bin/meshwork-cni"));
        assert_eq!(
            std::fs::read(&installed.plugin).expect("copied"),
            b"\x7fELF plugin"
        );
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&installed.plugin)
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        assert_eq!(
            installed.conflist,
            dir.path().join("net.d/05-meshwork.conflist")
        );

        // What a runtime hands the plugin: the conflist's plugin entry with the list's
        // version and name (libcni's rule).
        let list: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&installed.conflist).expect("conflist"))
                .expect("JSON");
        let mut entry = list["plugins"][0].clone();
        assert_eq!(entry["type"], PLUGIN_NAME);
        entry["cniVersion"] = list["cniVersion"].clone();
        entry["name"] = list["name"].clone();
        let conf = NetConf::parse(entry.to_string().as_bytes()).expect("the plugin accepts it");
        assert_eq!(
            conf.agent_socket,
            PathBuf::from("/var/run/meshwork/agent.sock")
        );

        // Again: the same files, no temporary left behind.
        install(&args, &plugin).expect("idempotent");
        let left: Vec<_> = std::fs::read_dir(dir.path().join("net.d"))
            .expect("list")
            .map(|entry| entry.expect("entry").file_name())
            .collect();
        assert_eq!(left, ["05-meshwork.conflist"]);
    }

    #[test]
    fn a_missing_dir_or_a_bad_name_fails_naming_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let plugin = dir.path().join("plugin");
        std::fs::write(&plugin, b"plugin").expect("plugin");
        let err = install(&args(dir.path()), &plugin).expect_err("no bin dir");
        assert!(err.to_string().contains("/bin/.meshwork-cni."), "{err}");
        let mut bad = args(dir.path());
        bad.cni_conf_name = "../escape.conflist".to_owned();
        assert!(matches!(
            install(&bad, &plugin),
            Err(InstallError::ConfName(_))
        ));
        assert!(parse_args(["meshwork-cni", "install", "--cni-bin"]).is_err());
        assert!(
            parse_args(["meshwork-cni"]).is_err(),
            "a subcommand is required"
        );
    }
}
