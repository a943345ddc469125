//! Pods of the node as network namespaces (`/run/netns/<pod>`), added to the network as a
//! container runtime adds them: the node's conflist (written into the image by
//! `meshwork-cni install`) names the plugin; the plugin runs with the spec's `CNI_*`
//! environment and the network config on stdin, and its stdout is the result. "Try again
//! later" (code 11: the agent's pool is still empty) is retried, as a kubelet retries a
//! sandbox.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command as Process, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use meshwork_proto::agent::v1 as pb;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, unshare};
use serde_json::{Value, json};

use crate::api;

/// The node's CNI config directory and the conflist in it.
const CONFLIST: &str = "/etc/cni/net.d/05-meshwork.conflist";
/// Where the runtime finds plugins.
const CNI_PATH: &str = "/opt/cni/bin";
/// The pods' interface.
const IFNAME: &str = "eth0";
/// The pods' Kubernetes namespace.
const POD_NAMESPACE: &str = "default";
/// How long an ADD is retried while the plugin says "try again later".
const ADD_TIMEOUT: Duration = Duration::from_secs(90);
/// The CNI error code for "try again later".
const TRY_AGAIN_LATER: i64 = 11;

/// `meshwork-devnode pod …`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Create the pod's network namespace and ADD it through the node's conflist; prints the
    /// plugin's result.
    Add {
        /// The pod's name.
        name: String,
        /// A label of the pod, `key=value` (repeatable), passed as `args.cni.labels`.
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
    },
    /// DEL the pod and remove its namespace.
    Del {
        /// The pod's name.
        name: String,
    },
    /// Let the pod's endpoint reach these identities (its other fields unchanged).
    Allow {
        /// The pod's name.
        name: String,
        /// An allowed identity (repeatable).
        #[arg(long = "identity", required = true)]
        identities: Vec<u32>,
    },
    /// Print the pod's endpoint as JSON: id, ips, identity, allowed identities, state,
    /// generation, and the IPAM allocation of its IP (its ENI, with `--ipam eni`).
    Show {
        /// The pod's name.
        name: String,
    },
}

/// Runs one pod command.
pub fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Add { name, labels } => add(&name, &labels),
        Command::Del { name } => del(&name),
        Command::Allow { name, identities } => allow(&name, identities),
        Command::Show { name } => show(&name),
    }
}

/// The pod's namespace path.
fn netns(name: &str) -> PathBuf {
    Path::new("/run/netns").join(name)
}

/// The pod's container ID: 64 hex digits derived from its name, stable across calls.
fn container_id(name: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in name.bytes() {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}").repeat(4)
}

fn add(name: &str, labels: &[String]) -> anyhow::Result<()> {
    let path = netns(name);
    if !path.exists() {
        create_netns(&path)?;
    }
    let mut conf = netconf()?;
    let args: Vec<Value> = labels
        .iter()
        .map(|label| {
            let (key, value) = label.split_once('=').unwrap_or((label, ""));
            json!({ "key": key, "value": value })
        })
        .collect();
    conf["args"] = json!({ "cni": { "labels": args } });
    let started = Instant::now();
    loop {
        match cni("ADD", name, &conf)? {
            Ok(result) => {
                println!("{result}");
                return Ok(());
            }
            Err(error) if error["code"].as_i64() == Some(TRY_AGAIN_LATER) => {
                if started.elapsed() > ADD_TIMEOUT {
                    bail!("ADD of {name}: still {error} after {ADD_TIMEOUT:?}");
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(error) => bail!("ADD of {name} failed: {error}"),
        }
    }
}

fn del(name: &str) -> anyhow::Result<()> {
    let path = netns(name);
    if let Err(error) = cni("DEL", name, &netconf()?)? {
        bail!("DEL of {name} failed: {error}");
    }
    if path.exists() {
        umount2(&path, MntFlags::MNT_DETACH)
            .with_context(|| format!("unmounting {}", path.display()))?;
        std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    }
    println!("deleted {name}");
    Ok(())
}

/// Creates a network namespace pinned at `path`: a thread unshares its network namespace
/// and bind-mounts it there, so it outlives the thread.
fn create_netns(path: &Path) -> anyhow::Result<()> {
    File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let pinned = std::thread::scope(|scope| {
        scope
            .spawn(|| -> anyhow::Result<()> {
                unshare(CloneFlags::CLONE_NEWNET).context("unshare(CLONE_NEWNET)")?;
                mount(
                    Some("/proc/thread-self/ns/net"),
                    path,
                    None::<&str>,
                    MsFlags::MS_BIND,
                    None::<&str>,
                )
                .with_context(|| format!("bind-mounting the namespace at {}", path.display()))
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    });
    if pinned.is_err() {
        let _ = std::fs::remove_file(path);
    }
    pinned
}

/// The network config the runtime hands the plugin: the conflist's first plugin with the
/// list's `cniVersion` and `name`, as libcni builds it.
fn netconf() -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(CONFLIST).with_context(|| format!("reading {CONFLIST}"))?;
    let list: Value = serde_json::from_str(&text).with_context(|| format!("parsing {CONFLIST}"))?;
    let mut conf = list["plugins"][0].clone();
    anyhow::ensure!(conf.is_object(), "{CONFLIST} lists no plugin");
    conf["cniVersion"] = list["cniVersion"].clone();
    conf["name"] = list["name"].clone();
    Ok(conf)
}

/// Runs the plugin named by `conf`'s `type` for `command`: its JSON result, or its error
/// JSON.
fn cni(command: &str, name: &str, conf: &Value) -> anyhow::Result<Result<Value, Value>> {
    let plugin = Path::new(CNI_PATH).join(conf["type"].as_str().unwrap_or_default());
    let mut child = Process::new(&plugin)
        .env_clear()
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", container_id(name))
        .env("CNI_NETNS", netns(name))
        .env("CNI_IFNAME", IFNAME)
        .env(
            "CNI_ARGS",
            format!("K8S_POD_NAMESPACE={POD_NAMESPACE};K8S_POD_NAME={name}"),
        )
        .env("CNI_PATH", CNI_PATH)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("running {}", plugin.display()))?;
    child
        .stdin
        .take()
        .context("the plugin's stdin")?
        .write_all(conf.to_string().as_bytes())?;
    let out = child.wait_with_output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let value = if text.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text)
            .with_context(|| format!("{} printed no JSON: {text:?}", plugin.display()))?
    };
    Ok(if out.status.success() {
        Ok(value)
    } else {
        Err(value)
    })
}

/// The pod's endpoint on this node's agent.
async fn endpoint_of(name: &str) -> anyhow::Result<pb::EndpointStatus> {
    api::endpoints(Path::new(api::SOCKET))
        .await?
        .into_iter()
        .find(|e| e.endpoint.as_ref().is_some_and(|e| e.pod_name == name))
        .with_context(|| format!("the agent has no endpoint of pod {name}"))
}

fn allow(name: &str, identities: Vec<u32>) -> anyhow::Result<()> {
    api::block_on(async {
        let status = endpoint_of(name).await?;
        let mut endpoint = status.endpoint.context("an endpoint without its spec")?;
        endpoint.allowed_identities = identities;
        let allowed = endpoint.allowed_identities.clone();
        api::put_endpoint(Path::new(api::SOCKET), endpoint).await?;
        println!("{name} allows {allowed:?}");
        Ok(())
    })?
}

fn show(name: &str) -> anyhow::Result<()> {
    api::block_on(async {
        let status = endpoint_of(name).await?;
        let endpoint = status.endpoint.unwrap_or_default();
        let allocation = api::ipam_allocations(Path::new(api::SOCKET))
            .await
            .unwrap_or_default()
            .into_iter()
            .find(|a| endpoint.ips.contains(&a.ip));
        println!(
            "{}",
            json!({
                "id": endpoint.id,
                "ips": endpoint.ips,
                "identity": endpoint.identity,
                "allowed": endpoint.allowed_identities,
                "state": status.state,
                "generation": status.generation,
                "eni": allocation.as_ref().map(|a| a.eni_id.clone()),
                "ipam_owner": allocation.as_ref().map(|a| a.owner.clone()),
            })
        );
        Ok(())
    })?
}
