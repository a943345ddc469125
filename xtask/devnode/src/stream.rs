//! A sequence-numbered TCP stream between two pods, each end's socket made inside its pod's
//! namespace. The sender writes the next number every `--interval-ms` until its stdin closes
//! (the caller's way to stop it) or its bounds run out; the receiver prints `received=N` as
//! numbers arrive (at most every 100 ms) and, when the sender has closed, one JSON report:
//! numbers received, gaps (a pause over [`GAP`] or a number out of order), resets and the
//! longest pause.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use meshwork_cni::netns::Netns;
use serde_json::json;

/// A pause in arrivals longer than this is a gap: TCP turns a drop into a retransmission
/// after at least 200 ms (the minimum RTO).
const GAP: Duration = Duration::from_millis(190);
/// How often the receiver reports progress.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);
/// How long the sender's connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// `meshwork-devnode stream …`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Listen in a pod for one sender and count what it sends.
    Recv {
        /// The pod's namespace (`/run/netns/<pod>`).
        #[arg(long)]
        netns: PathBuf,
        /// The address to listen on (the pod's IP and a port).
        #[arg(long)]
        listen: SocketAddr,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 300)]
        max_secs: u64,
    },
    /// Connect from a pod and send the next number every `--interval-ms` until stdin closes.
    Send {
        /// The pod's namespace (`/run/netns/<pod>`).
        #[arg(long)]
        netns: PathBuf,
        /// The receiver's address.
        #[arg(long)]
        to: SocketAddr,
        /// Milliseconds between two numbers.
        #[arg(long, default_value_t = 2)]
        interval_ms: u64,
        /// Stop after this many seconds in any case.
        #[arg(long, default_value_t = 300)]
        max_secs: u64,
    },
}

/// Runs one end of the stream.
pub fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Recv {
            netns,
            listen,
            max_secs,
        } => recv(&Netns::open(&netns)?, listen, Duration::from_secs(max_secs)),
        Command::Send {
            netns,
            to,
            interval_ms,
            max_secs,
        } => send(
            &Netns::open(&netns)?,
            to,
            Duration::from_millis(interval_ms),
            Duration::from_secs(max_secs),
        ),
    }
}

fn recv(pod: &Netns, listen: SocketAddr, max: Duration) -> anyhow::Result<()> {
    let listener = pod
        .run(move || TcpListener::bind(listen))?
        .with_context(|| format!("listening on {listen}"))?;
    println!("listening on {listen}");
    let (mut incoming, peer) = listener.accept().context("accepting the sender")?;
    println!("connected from {peer}");
    incoming.set_read_timeout(Some(Duration::from_millis(50)))?;
    let started = Instant::now();
    let mut report = Report::new();
    let mut buf = [0u8; 8];
    let mut filled = 0;
    let mut shown = Instant::now();
    while started.elapsed() < max {
        match incoming.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => {
                filled += n;
                if filled == buf.len() {
                    filled = 0;
                    report.arrived(u64::from_be_bytes(buf));
                    if shown.elapsed() >= PROGRESS_EVERY {
                        println!("received={}", report.received);
                        shown = Instant::now();
                    }
                }
            }
            Err(err)
                if matches!(
                    err.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => {
                report.resets += 1;
                break;
            }
        }
    }
    println!("{}", report.finish());
    Ok(())
}

fn send(pod: &Netns, to: SocketAddr, interval: Duration, max: Duration) -> anyhow::Result<()> {
    let mut out = pod
        .run(move || TcpStream::connect_timeout(&to, CONNECT_TIMEOUT))?
        .with_context(|| format!("connecting to {to}"))?;
    out.set_nodelay(true)?;
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
            stop.store(true, Ordering::Relaxed);
        });
    }
    let bound = max.as_millis() / interval.as_millis().max(1);
    let limit = u64::try_from(bound).unwrap_or(u64::MAX);
    let started = Instant::now();
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) && seq < limit && started.elapsed() < max {
        out.write_all(&seq.to_be_bytes())
            .with_context(|| format!("sending number {seq}"))?;
        seq += 1;
        std::thread::sleep(interval);
    }
    out.shutdown(std::net::Shutdown::Write)?;
    println!("sent={seq}");
    Ok(())
}

/// The receiver's bookkeeping.
struct Report {
    received: u64,
    gaps: u64,
    resets: u64,
    expected: u64,
    last: Instant,
    longest_pause: Duration,
}

impl Report {
    fn new() -> Self {
        Self {
            received: 0,
            gaps: 0,
            resets: 0,
            expected: 0,
            last: Instant::now(),
            longest_pause: Duration::ZERO,
        }
    }

    fn arrived(&mut self, seq: u64) {
        let pause = self.last.elapsed();
        self.last = Instant::now();
        // The wait for the first number is the sender's start, not a pause.
        if self.received > 0 {
            self.longest_pause = self.longest_pause.max(pause);
            if pause > GAP {
                self.gaps += 1;
            }
        }
        if seq != self.expected {
            self.gaps += 1;
        }
        self.expected = seq + 1;
        self.received += 1;
    }

    fn finish(&self) -> serde_json::Value {
        json!({
            "received": self.received,
            "gaps": self.gaps,
            "resets": self.resets,
            "longest_pause_ms": self.longest_pause.as_millis(),
        })
    }
}
