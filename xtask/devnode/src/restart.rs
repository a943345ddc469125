//! `meshwork-devnode restart-agent`: stops the node's agent (SIGTERM); PID 1 starts it again at
//! once, with the flags given here added to its own (they stay for later starts until the
//! next restart names others). Returns once the new agent answers on its socket.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::api;
use crate::init::{AGENT_PID, EXTRA_FLAGS};

/// `meshwork-devnode restart-agent`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A flag added to the agent's own from this start on, e.g.
    /// `--flag=--clustermesh-sync-timeout=0s` (repeatable; none: its own alone).
    #[arg(long = "flag", value_name = "FLAG", allow_hyphen_values = true)]
    flags: Vec<String>,
    /// How long the new agent may take to answer, in seconds.
    #[arg(long, default_value_t = 30)]
    timeout_secs: u64,
}

/// Restarts the agent and waits for the new one.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let old = agent_pid().context("no agent runs on this node")?;
    std::fs::write(EXTRA_FLAGS, args.flags.join("\n"))
        .with_context(|| format!("writing {EXTRA_FLAGS}"))?;
    kill(old, Signal::SIGTERM).with_context(|| format!("stopping the agent (pid {old})"))?;
    let timeout = Duration::from_secs(args.timeout_secs);
    let started = Instant::now();
    loop {
        if let Some(new) = agent_pid().filter(|pid| *pid != old) {
            let answered = api::block_on(api::status(Path::new(api::SOCKET)))?;
            if answered.is_ok() {
                println!(
                    "meshwork-agent restarted: pid {old} -> {new} in {} ms, extra flags {:?}",
                    started.elapsed().as_millis(),
                    args.flags
                );
                return Ok(());
            }
        }
        if started.elapsed() > timeout {
            bail!("the restarted agent did not answer within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The running agent's PID, as PID 1 recorded it.
fn agent_pid() -> Option<Pid> {
    let text = std::fs::read_to_string(AGENT_PID).ok()?;
    text.trim().parse().ok().map(Pid::from_raw)
}
