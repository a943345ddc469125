//! The WireGuard figure's stream: numbered UDP datagrams from pod B to pod A, through B's
//! and A's WireGuard devices (the mesh routes every other cluster's pods through them). It
//! runs against the restart: nothing of it passes A's endpoint program (that program sees only
//! what leaves A's pod, and UDP needs no answer), so what it loses is lost to WireGuard alone:
//! once A's agent prunes B's restored peer, A's device drops B's datagrams until the peer is
//! back and a new handshake is made. Both sockets are made inside the pods' namespaces;
//! bounded in time and datagrams.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use meshwork_lab::net::Netns;

use super::stream::{Arrivals, StreamReport, is_timeout};

/// One datagram every this long.
const INTERVAL: Duration = Duration::from_millis(5);
/// Hard bounds on the traffic.
const MAX_DATAGRAMS: u64 = 30_000;
const MAX_DURATION: Duration = Duration::from_secs(120);
const PORT: u16 = 7302;

/// A running stream.
pub struct WgStream {
    stop: Arc<AtomicBool>,
    received: Arc<AtomicU64>,
    gaps: Arc<AtomicU64>,
    gaps_before: u64,
    sender: JoinHandle<u64>,
    receiver: JoinHandle<StreamReport>,
}

impl WgStream {
    /// Binds in `server` on `server_ip`, sends from `client`, starts both ends.
    pub fn start(client: &Netns, server: &Netns, server_ip: &str) -> anyhow::Result<Self> {
        let addr: SocketAddr = format!("{server_ip}:{PORT}").parse()?;
        let incoming = server
            .enter(move || UdpSocket::bind(addr))?
            .with_context(|| format!("binding {addr} in pod A"))?;
        let out = client
            .enter(move || UdpSocket::bind("0.0.0.0:0").and_then(|s| s.connect(addr).map(|()| s)))?
            .with_context(|| format!("a socket in pod B towards {addr}"))?;
        incoming.set_read_timeout(Some(Duration::from_millis(50)))?;
        let stop = Arc::new(AtomicBool::new(false));
        let received = Arc::new(AtomicU64::new(0));
        let gaps = Arc::new(AtomicU64::new(0));
        let sender = {
            let stop = stop.clone();
            std::thread::spawn(move || send(&out, &stop))
        };
        let receiver = {
            let stop = stop.clone();
            let counts = (received.clone(), gaps.clone());
            std::thread::spawn(move || receive(&incoming, &stop, &counts))
        };
        Ok(Self {
            stop,
            received,
            gaps,
            gaps_before: 0,
            sender,
            receiver,
        })
    }

    /// Datagrams received so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Counts gaps only from here on: the first datagrams wait for the tunnel's handshake.
    pub fn count_from_here(&mut self) {
        self.gaps_before = self.gaps.load(Ordering::Relaxed);
    }

    /// Stops both ends and reports (gaps since [`Self::count_from_here`]).
    pub fn finish(self) -> StreamReport {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.sender.join();
        let mut report = self.receiver.join().unwrap_or_default();
        report.gaps = report.gaps.saturating_sub(self.gaps_before);
        report
    }
}

fn send(out: &UdpSocket, stop: &AtomicBool) -> u64 {
    let started = Instant::now();
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) && seq < MAX_DATAGRAMS && started.elapsed() < MAX_DURATION {
        // A datagram the route cannot take yet (no peer: ENOKEY) is lost like any other.
        let _ = out.send(&seq.to_be_bytes());
        seq += 1;
        std::thread::sleep(INTERVAL);
    }
    seq
}

/// Receives until stopped, publishing (received, gaps) as they change.
fn receive(
    incoming: &UdpSocket,
    stop: &AtomicBool,
    (received, gaps): &(Arc<AtomicU64>, Arc<AtomicU64>),
) -> StreamReport {
    let mut arrivals = Arrivals::new();
    let mut buf = [0u8; 64];
    while !stop.load(Ordering::Relaxed) {
        match incoming.recv(&mut buf) {
            Ok(8) => {
                let seq = u64::from_be_bytes(buf[..8].try_into().expect("8 bytes"));
                arrivals.arrived(seq);
                received.store(arrivals.report.received, Ordering::Relaxed);
                gaps.store(arrivals.report.gaps, Ordering::Relaxed);
            }
            // Not one of ours (the port is private to the lab's pod): ignored.
            Ok(_) => {}
            Err(err) if is_timeout(&err) => {}
            Err(_) => {
                arrivals.report.resets += 1;
                break;
            }
        }
    }
    arrivals.finish()
}
