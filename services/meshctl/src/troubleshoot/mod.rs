//! `meshctl troubleshoot clustermesh`: Cilium's connectivity checks of each remote cluster
//! (cilium-semantics §12) — the config file, then per endpoint URL, DNS, TCP, TLS and a raw
//! `GET /version`, the certificates, an etcd client reading `cilium/.heartbeat` — and what
//! Cilium leaves out: certificate expiry and names, the heartbeat's age, and the remote's
//! cluster config against ours.
//!
//! - [`config`]: the config directory, read with the agent's own parser;
//! - [`probe`] runs one cluster's checks ([`endpoint`] at each [`target`], [`tls`],
//!   [`certs`], [`etcd`]) within its time budget;
//! - [`report`] is what they found, as plain data; [`render`] prints it, as text or JSON.

mod certs;
mod config;
mod endpoint;
mod etcd;
mod probe;
mod render;
mod report;
mod target;
mod tls;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::SystemTime;

use anyhow::{Context as _, bail};

use self::report::{Report, Status};
use crate::cli::ClustermeshArgs;
use crate::client::Agent;
use crate::kvstoremesh::Kvstoremesh;
use crate::status::{Source, print_text};

/// Exit status when a check failed (warnings do not count).
const EXIT_CHECK_FAILED: u8 = 1;

/// Runs `meshctl troubleshoot clustermesh`: the directory from `--clustermesh-config`, or
/// from the agent at `socket` (kvstoremesh at `kvstoremesh`), whose remotes are the default.
pub async fn clustermesh(
    socket: &Path,
    kvstoremesh: Option<&str>,
    args: &ClustermeshArgs,
) -> anyhow::Result<ExitCode> {
    let (dir, configured) = match &args.clustermesh_config {
        Some(dir) => (dir.clone(), None),
        None => {
            let mut source = match kvstoremesh {
                Some(addr) => Source::Kvstoremesh(Kvstoremesh::new(addr)),
                None => Source::Agent(Agent::new(socket)),
            };
            let mesh = source.clustermesh().await?;
            if mesh.config_dir.is_empty() {
                bail!(
                    "{} reports no clustermesh config directory (it runs without \
                     --clustermesh-config, or is older than this meshctl): pass \
                     --clustermesh-config DIR",
                    source.name()
                );
            }
            let names: Vec<String> = mesh.clusters.into_iter().map(|c| c.name).collect();
            (PathBuf::from(mesh.config_dir), Some(names))
        }
    };
    let names = if args.clusters.is_empty() {
        configured
    } else {
        Some(args.clusters.clone())
    };
    let files = config::read(&dir, names.as_deref())
        .with_context(|| format!("reading the clustermesh config directory {}", dir.display()))?;
    let settings = probe::Settings {
        timeout: args.timeout,
        max_connected_clusters: args.max_connected_clusters,
    };
    let now = SystemTime::now();
    // Concurrently: each cluster has its own budget, so the whole run takes one budget.
    let clusters =
        futures::future::join_all(files.iter().map(|file| probe::cluster(file, settings, now)))
            .await;
    let report = Report::new(&dir.display().to_string(), clusters);
    let text = if args.json {
        render::to_json_line(&report)
    } else {
        render::render(&report)
    };
    print_text(&text)?;
    Ok(if report.status == Status::Fail {
        ExitCode::from(EXIT_CHECK_FAILED)
    } else {
        ExitCode::SUCCESS
    })
}
