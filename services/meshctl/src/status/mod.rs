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

/// Exit status when `--wait` timed out.
const EXIT_NOT_READY: u8 = 1;

/// Runs `meshctl status` against the agent at `socket`.
pub async fn run(socket: &Path, args: &StatusArgs) -> anyhow::Result<ExitCode> {
    let mut agent = Agent::new(socket);
    if !args.wait {
        let status = agent.full_status().await?;
        let view = StatusView::from(&status.clustermesh.clone().unwrap_or_default());
        print(&view, args.json)?;
        // The JSON shape is fixed to the cluster mesh; the datapath shows in the human view.
        if let (false, Some(datapath)) = (args.json, &status.datapath) {
            print_text(&crate::datapath::render_status(datapath))?;
        }
        if let (false, Some(apiserver)) = (args.json, &status.apiserver) {
            print_text(&render_apiserver(apiserver))?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    match wait::wait(&mut agent, args.timeout).await {
        Outcome::Ready(view) => {
            print(&view, args.json)?;
            Ok(ExitCode::SUCCESS)
        }
        Outcome::TimedOut { last, error } => {
            // The last status still tells the on-call engineer where each cluster is stuck.
            if let Some(view) = &last {
                print(view, args.json)?;
            }
            let msg = wait::timeout_message(args.timeout, last.as_ref(), error.as_deref());
            eprintln!("meshctl: {msg}");
            Ok(ExitCode::from(EXIT_NOT_READY))
        }
    }
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
