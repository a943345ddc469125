//! A long-running TCP stream from pod A to pod B carrying consecutive sequence numbers; the
//! receiver counts gaps (stalls longer than [`GAP`], out-of-order data) and resets. Both
//! sockets are made inside the pods' namespaces; bounded in time and message count.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use meshwork_lab::net::Netns;

/// A pause in arrivals longer than this counts as a gap: TCP hides drops as retransmission
/// delays, the first of which is ≥ 200 ms (the minimum RTO).
pub const GAP: Duration = Duration::from_millis(190);
/// One message every this long.
const INTERVAL: Duration = Duration::from_millis(2);
/// Hard bounds on the traffic.
const MAX_MESSAGES: u64 = 60_000;
const MAX_DURATION: Duration = Duration::from_secs(120);
const PORT: u16 = 7301;

/// What the receiver saw.
#[derive(Debug, Default, Clone, Copy)]
pub struct StreamReport {
    /// Messages received in order.
    pub received: u64,
    /// Stalls longer than [`GAP`] and out-of-order sequence numbers.
    pub gaps: u64,
    /// Resets or other socket errors.
    pub resets: u64,
    /// The longest pause between two messages.
    pub longest_pause: Duration,
}

/// A running stream.
pub struct Stream {
    stop: Arc<AtomicBool>,
    received: Arc<AtomicU64>,
    sender: JoinHandle<u64>,
    receiver: JoinHandle<StreamReport>,
}

impl Stream {
    /// Listens in `server` on `server_ip`, connects from `client`, starts both ends.
    pub fn start(client: &Netns, server: &Netns, server_ip: &str) -> anyhow::Result<Self> {
        let addr: SocketAddr = format!("{server_ip}:{PORT}").parse()?;
        let listener = server.enter(move || TcpListener::bind(addr))??;
        let out = client
            .enter(move || TcpStream::connect_timeout(&addr, Duration::from_secs(5)))?
            .with_context(|| format!("connecting pod A to {addr}"))?;
        let (incoming, _) = listener.accept().context("accepting the stream")?;
        out.set_nodelay(true)?;
        incoming.set_read_timeout(Some(Duration::from_millis(50)))?;
        let stop = Arc::new(AtomicBool::new(false));
        let received = Arc::new(AtomicU64::new(0));
        let sender = {
            let stop = stop.clone();
            std::thread::spawn(move || send(out, &stop))
        };
        let receiver = {
            let stop = stop.clone();
            let received = received.clone();
            std::thread::spawn(move || receive(incoming, &stop, &received))
        };
        Ok(Self {
            stop,
            received,
            sender,
            receiver,
        })
    }

    /// Messages received so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Stops both ends and reports.
    pub fn finish(self) -> StreamReport {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.sender.join();
        self.receiver.join().unwrap_or_default()
    }
}

fn send(mut out: TcpStream, stop: &AtomicBool) -> u64 {
    let started = Instant::now();
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) && seq < MAX_MESSAGES && started.elapsed() < MAX_DURATION {
        if out.write_all(&seq.to_be_bytes()).is_err() {
            break;
        }
        seq += 1;
        std::thread::sleep(INTERVAL);
    }
    seq
}

fn receive(mut incoming: TcpStream, stop: &AtomicBool, received: &AtomicU64) -> StreamReport {
    let mut arrivals = Arrivals::new();
    let mut buf = [0u8; 8];
    let mut filled = 0;
    while !stop.load(Ordering::Relaxed) {
        match incoming.read(&mut buf[filled..]) {
            // The sender closing at the end is not a reset.
            Ok(0) => {
                if !stop.load(Ordering::Relaxed) {
                    arrivals.report.resets += 1;
                }
                break;
            }
            Ok(n) => {
                filled += n;
                if filled < 8 {
                    continue;
                }
                filled = 0;
                arrivals.arrived(u64::from_be_bytes(buf));
                received.store(arrivals.report.received, Ordering::Relaxed);
            }
            Err(err) if is_timeout(&err) => {}
            Err(_) => {
                if !stop.load(Ordering::Relaxed) {
                    arrivals.report.resets += 1;
                }
                break;
            }
        }
    }
    arrivals.finish()
}

/// Whether a read with a timeout just timed out.
pub fn is_timeout(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// A receiver's bookkeeping of sequence numbers as they arrive.
pub struct Arrivals {
    /// What it saw so far.
    pub report: StreamReport,
    last: Instant,
    expected: u64,
}

impl Default for Arrivals {
    fn default() -> Self {
        Self::new()
    }
}

impl Arrivals {
    /// Nothing arrived yet; the clock for the first pause starts now.
    pub fn new() -> Self {
        Self {
            report: StreamReport::default(),
            last: Instant::now(),
            expected: 0,
        }
    }

    /// Sequence number `seq` arrived: a pause longer than [`GAP`] before it is a gap, and so
    /// is a number other than the next one expected.
    pub fn arrived(&mut self, seq: u64) {
        let pause = self.last.elapsed();
        self.last = Instant::now();
        self.report.longest_pause = self.report.longest_pause.max(pause);
        if pause > GAP {
            self.report.gaps += 1;
        }
        if seq != self.expected {
            self.report.gaps += 1;
        }
        self.expected = seq + 1;
        self.report.received += 1;
    }

    /// The report; a stream that stalled for good has no later arrival to show the pause, so
    /// the pause up to now counts too.
    pub fn finish(mut self) -> StreamReport {
        let pause = self.last.elapsed();
        self.report.longest_pause = self.report.longest_pause.max(pause);
        if pause > GAP {
            self.report.gaps += 1;
        }
        self.report
    }
}
