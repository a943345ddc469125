//! `meshctl status`.

mod json;
mod progress;
mod render;
mod view;
mod wait;

use std::io::{self, Write as _};
use std::path::Path;
use std::process::ExitCode;
use std::time::SystemTime;

use self::view::StatusView;
use self::wait::Outcome;
use crate::cli::StatusArgs;
use crate::client::Agent;
use crate::kvstoremesh::{Kvstoremesh, render_cache};
use meshwork_proto::agent::v1::ClusterMeshStatus;

/// Exit status when `--wait` timed out.
const EXIT_NOT_READY: u8 = 1;

/// Where the remote clusters' status comes from: the agent, or kvstoremesh with
/// `--kvstoremesh`.
pub enum Source {
    /// The agent on its socket.
    Agent(Agent),
    /// kvstoremesh's status API.
    Kvstoremesh(Kvstoremesh),
}

impl Source {
    /// The remote clusters' status.
    pub async fn clustermesh(&mut self) -> anyhow::Result<ClusterMeshStatus> {
        match self {
            Self::Agent(agent) => agent.status().await,
            Self::Kvstoremesh(kvstoremesh) => {
                Ok(kvstoremesh.status().await?.clustermesh.unwrap_or_default())
            }
        }
    }

    /// Who answers, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Agent(_) => "the agent",
            Self::Kvstoremesh(_) => "kvstoremesh",
        }
    }
}

/// Runs `meshctl status` against the agent at `socket`, or kvstoremesh at `kvstoremesh`.
pub async fn run(
    socket: &Path,
    kvstoremesh: Option<&str>,
    args: &StatusArgs,
) -> anyhow::Result<ExitCode> {
    let mut source = match kvstoremesh {
        Some(addr) => Source::Kvstoremesh(Kvstoremesh::new(addr)),
        None => Source::Agent(Agent::new(socket)),
    };
    if !args.wait {
        return snapshot(&mut source, args.json).await;
    }
    match wait::wait(&mut source, args.timeout).await {
        Outcome::Ready(view) => {
            print(&view, args.json)?;
            Ok(ExitCode::SUCCESS)
        }
        Outcome::TimedOut { last, error } => {
            // The last status still tells the on-call engineer where each cluster is stuck.
            if let Some(view) = &last {
                print(view, args.json)?;
            }
            let msg =
                wait::timeout_message(source.name(), args.timeout, last.as_ref(), error.as_deref());
            eprintln!("meshctl: {msg}");
            Ok(ExitCode::from(EXIT_NOT_READY))
        }
    }
}

/// One status, with what only the human view shows: the agent's datapath and apiserver, or
/// kvstoremesh's cache.
async fn snapshot(source: &mut Source, json: bool) -> anyhow::Result<ExitCode> {
    match source {
        Source::Agent(agent) => {
            let status = agent.full_status().await?;
            print(
                &StatusView::from(&status.clustermesh.clone().unwrap_or_default()),
                json,
            )?;
            // The JSON shape is fixed to the cluster mesh; the datapath shows in the human view.
            if let (false, Some(datapath)) = (json, &status.datapath) {
                print_text(&crate::datapath::render_status(datapath))?;
            }
            if let (false, Some(apiserver)) = (json, &status.apiserver) {
                print_text(&render_apiserver(apiserver))?;
            }
        }
        Source::Kvstoremesh(kvstoremesh) => {
            let status = kvstoremesh.status().await?;
            print(
                &StatusView::from(&status.clustermesh.unwrap_or_default()),
                json,
            )?;
            if let (false, Some(cache)) = (json, &status.cache) {
                print_text(&render_cache(cache))?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print(view: &StatusView, json: bool) -> io::Result<()> {
    let text = if json {
        json::to_line(view)
    } else {
        render::render(&view.clustermesh, SystemTime::now())
    };
    print_text(&text)
}

/// The agent's publishing to its apiserver, one line (and the last error, if any).
fn render_apiserver(a: &meshwork_proto::agent::v1::ApiserverStatus) -> String {
    let state = match (a.connected, a.initial_state_written) {
        (true, true) => "connected, initial state written",
        (true, false) => "connected, publishing its initial state",
        (false, _) => "not connected",
    };
    let mut out = format!(
        "Apiserver:     {} ({state}; {} endpoints published, {} sessions)\n",
        a.address, a.endpoints, a.sessions
    );
    if let Some(error) = &a.last_error {
        out.push_str(&format!("  last error: {error}\n"));
    }
    out
}

/// Writes `text` to stdout.
pub fn print_text(text: &str) -> io::Result<()> {
    match io::stdout().lock().write_all(text.as_bytes()) {
        // `meshctl status | head` closing the pipe early is not an error.
        Err(err) if err.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}
