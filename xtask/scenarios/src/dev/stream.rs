//! A TCP stream between two pods of the stack, each end a `meshwork-devnode stream` run by
//! `docker exec` in its node's container: the receiver's progress is read from its output as
//! it comes; closing the sender's stdin stops the sender, whose close ends the receiver with
//! its report. Both ends are bounded in time by themselves ([`MAX_SECS`]).

use std::io::{BufRead as _, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail};
use meshwork_lab::wait::Wait;

use super::compose;

/// Each end stops by itself after this many seconds.
const MAX_SECS: &str = "240";
/// The stream's port in the receiving pod.
const PORT: u16 = 7301;

/// One pod of the stack: its node (service) and name, and its IP.
#[derive(Debug, Clone)]
pub struct Pod {
    /// The node's service name.
    pub node: &'static str,
    /// The pod's name (its namespace is `/run/netns/<name>` in the node).
    pub name: &'static str,
    /// Its IP.
    pub ip: String,
}

impl Pod {
    /// The pod's network namespace inside its node.
    pub fn netns(&self) -> String {
        format!("/run/netns/{}", self.name)
    }
}

/// What the receiver reported.
#[derive(Debug, Clone, Copy, Default)]
pub struct Report {
    /// Numbers received.
    pub received: u64,
    /// Pauses over 190 ms and numbers out of order.
    pub gaps: u64,
    /// Resets and other socket errors.
    pub resets: u64,
    /// The longest pause between two numbers, in milliseconds.
    pub longest_pause_ms: u64,
    /// Numbers the sender sent.
    pub sent: u64,
}

/// What the receiver has said so far.
#[derive(Debug, Default)]
struct Seen {
    listening: bool,
    received: u64,
    report: Option<serde_json::Value>,
    lines: Vec<String>,
}

/// A running stream; dropping it kills both `docker exec` clients (each end then stops by
/// itself: the sender on its closed stdin, the receiver on the sender's close).
pub struct Stream {
    receiver: Child,
    sender: Option<Child>,
    sender_stdin: Option<ChildStdin>,
    seen: Arc<Mutex<Seen>>,
}

impl Stream {
    /// Starts the receiver in `to`, waits until it listens, then the sender in `from`.
    pub fn start(from: &Pod, to: &Pod) -> anyhow::Result<Self> {
        let listen = format!("{}:{PORT}", to.ip);
        let mut receiver = Command::new("docker")
            .args(["exec", &compose::container(to.node)])
            .args(["meshwork-devnode", "stream", "recv", "--netns", &to.netns()])
            .args(["--listen", &listen, "--max-secs", MAX_SECS])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the receiver")?;
        let seen = Arc::new(Mutex::new(Seen::default()));
        let out = receiver.stdout.take().context("the receiver's stdout")?;
        {
            let seen = seen.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    let mut seen = seen.lock().expect("not poisoned");
                    if line.starts_with("listening") {
                        seen.listening = true;
                    } else if let Some(n) = line.strip_prefix("received=") {
                        seen.received = n.trim().parse().unwrap_or(seen.received);
                    } else if line.starts_with('{') {
                        seen.report = serde_json::from_str(&line).ok();
                    }
                    seen.lines.push(line);
                }
            });
        }
        let listening = Wait::new(format!("{} listening in {}", listen, to.name))
            .timeout(Duration::from_secs(20))
            .until(|| seen.lock().expect("not poisoned").listening, |l| *l);
        if let Err(err) = listening {
            let _ = receiver.kill();
            let _ = receiver.wait();
            return Err(err.into());
        }
        let mut sender = Command::new("docker")
            .args(["exec", "-i", &compose::container(from.node)])
            .args([
                "meshwork-devnode",
                "stream",
                "send",
                "--netns",
                &from.netns(),
            ])
            .args(["--to", &listen, "--max-secs", MAX_SECS])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the sender")?;
        let sender_stdin = sender.stdin.take();
        Ok(Self {
            receiver,
            sender: Some(sender),
            sender_stdin,
            seen,
        })
    }

    /// Numbers received so far.
    pub fn received(&self) -> u64 {
        self.seen.lock().expect("not poisoned").received
    }

    /// Waits (at most `timeout`) until `more` numbers past `from` have arrived.
    pub fn wait_flowing(&self, from: u64, more: u64, timeout: Duration) -> anyhow::Result<u64> {
        Ok(
            Wait::new(format!("{more} more numbers of the stream (from {from})"))
                .timeout(timeout)
                .until(|| self.received(), |n| *n >= from + more)?,
        )
    }

    /// Stops the sender and waits for the receiver's report.
    pub fn finish(mut self) -> anyhow::Result<Report> {
        drop(self.sender_stdin.take());
        let mut sender = self.sender.take().context("the sender ran")?;
        let status = Wait::new("the sender to stop")
            .timeout(Duration::from_secs(20))
            .every(Duration::from_millis(50))
            .some(|| sender.try_wait().ok().flatten())?;
        let out = sender.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !status.success() {
            bail!("the sender failed ({status}): {text}");
        }
        let sent: u64 = text
            .lines()
            .find_map(|line| line.strip_prefix("sent="))
            .and_then(|n| n.trim().parse().ok())
            .with_context(|| format!("the sender printed no count: {text:?}"))?;
        let report = Wait::new("the receiver's report")
            .timeout(Duration::from_secs(20))
            .some(|| self.seen.lock().expect("not poisoned").report.clone())
            .with_context(|| {
                format!(
                    "the receiver said: {:?}",
                    self.seen.lock().expect("not poisoned").lines
                )
            })?;
        let _ = self.receiver.wait();
        let field = |name: &str| report[name].as_u64().unwrap_or_default();
        Ok(Report {
            received: field("received"),
            gaps: field("gaps"),
            resets: field("resets"),
            longest_pause_ms: field("longest_pause_ms"),
            sent,
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        drop(self.sender_stdin.take());
        for child in self.sender.iter_mut().chain([&mut self.receiver]) {
            if child.try_wait().ok().flatten().is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
