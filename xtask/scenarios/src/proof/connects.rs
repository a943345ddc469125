//! New TCP connections from pod A to a global service whose only backends are cluster B's
//! pods, at a bounded rate, for the restart window. The client is its own process, inside A's
//! pod namespace and A's node cgroup, where socket-LB translates the service's VIP (cgroup
//! programs act per process: a thread of this one could not be moved there). Each attempt
//! prints one line; a thread here counts them as they come.

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context as _;
use meshwork_lab::cgroup::ChildCgroup;
use meshwork_lab::net::Netns;

/// The service's port, on its VIP and on every backend.
pub const PORT: u16 = 7303;
/// One new connection every this long (20/s).
const INTERVAL: Duration = Duration::from_millis(50);
/// Hard bounds on the client: attempts and seconds.
const MAX_ATTEMPTS: u32 = 2_400;
const MAX_SECONDS: u32 = 120;
/// How long one connect may take before it counts as failed (generous: a loaded 2-core
/// machine must not turn a slow handshake into a failure).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Opens a connection to `vip:port` every `interval` s until stdin closes (or the bounds),
/// reading the backend's one-byte greeting; prints `ok` or `fail <errno name>` per attempt.
const CLIENT: &str = r#"
import errno, socket, sys, threading, time
vip, port, interval, timeout, attempts, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
start = time.monotonic()
for _ in range(attempts):
    if stop.is_set() or time.monotonic() - start > seconds:
        break
    began = time.monotonic()
    try:
        c = socket.create_connection((vip, port), timeout=timeout)
        c.settimeout(timeout)
        if c.recv(1) != b"k":
            raise OSError(errno.ECONNRESET, "no greeting")
        c.close()
        print("ok", flush=True)
    except socket.timeout:
        print("fail ETIMEDOUT", flush=True)
    except OSError as e:
        print("fail " + errno.errorcode.get(e.errno or 0, str(e)), flush=True)
    time.sleep(max(0.0, interval - (time.monotonic() - began)))
"#;

/// What the client saw.
#[derive(Debug, Default, Clone)]
pub struct ConnectReport {
    /// Connections that reached a backend.
    pub ok: u64,
    /// Connections that failed.
    pub failed: u64,
    /// The first few failures' reasons.
    pub reasons: Vec<String>,
}

/// The backends: a listener on each of cluster B's pods greeting every connection.
struct Backends {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Backends {
    fn start(pods: &[(&Netns, &str)]) -> anyhow::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for (pod, ip) in pods {
            let addr: SocketAddr = format!("{ip}:{PORT}").parse()?;
            let listener = pod
                .enter(move || TcpListener::bind(addr))?
                .with_context(|| format!("listening on {addr}"))?;
            listener.set_nonblocking(true)?;
            let stop = stop.clone();
            threads.push(std::thread::spawn(move || greet(&listener, &stop)));
        }
        Ok(Self { stop, threads })
    }
}

impl Drop for Backends {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn greet(listener: &TcpListener, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((mut socket, _)) => {
                let _ = socket.set_nonblocking(false);
                let _ = socket.write_all(b"k");
            }
            // Polled: the accept loop ends with the run.
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// The running client and backends.
pub struct Connects {
    child: Child,
    stdin: Option<ChildStdin>,
    counts: Arc<(AtomicU64, AtomicU64)>,
    /// (ok, failed) when counting began ([`Connects::count_from_here`]).
    baseline: (u64, u64),
    reasons: Arc<Mutex<Vec<String>>>,
    reader: Option<JoinHandle<()>>,
    _backends: Backends,
}

impl Connects {
    /// Starts the backends on `backends` (pod, IP) and the client in `client` (A's pod) as a
    /// process of `cgroup` (A's node cgroup), connecting to `vip`.
    pub fn start(
        client: &Netns,
        cgroup: &ChildCgroup,
        backends: &[(&Netns, &str)],
        vip: &str,
    ) -> anyhow::Result<Self> {
        let backends = Backends::start(backends)?;
        let python = meshwork_lab::paths::find_program("python3")?;
        let mut inner = client.command(python);
        inner.args([
            "-c",
            CLIENT,
            vip,
            &PORT.to_string(),
            &INTERVAL.as_secs_f64().to_string(),
            &CONNECT_TIMEOUT.as_secs_f64().to_string(),
            &MAX_ATTEMPTS.to_string(),
            &MAX_SECONDS.to_string(),
        ]);
        let mut child = cgroup
            .wrap(&inner)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the connecting client")?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("the client's stdout")?;
        let counts = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
        let reasons = Arc::new(Mutex::new(Vec::new()));
        let reader = {
            let (counts, reasons) = (counts.clone(), reasons.clone());
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if line == "ok" {
                        counts.0.fetch_add(1, Ordering::Relaxed);
                    } else {
                        counts.1.fetch_add(1, Ordering::Relaxed);
                        let mut reasons = reasons.lock().unwrap_or_else(|e| e.into_inner());
                        if reasons.len() < 5 {
                            reasons.push(line.trim_start_matches("fail ").to_owned());
                        }
                    }
                }
            })
        };
        Ok(Self {
            child,
            stdin,
            counts,
            baseline: (0, 0),
            reasons,
            reader: Some(reader),
            _backends: backends,
        })
    }

    /// Connections that reached a backend so far.
    pub fn ok(&self) -> u64 {
        self.counts.0.load(Ordering::Relaxed)
    }

    /// The report counts from here: attempts before the service reached A's maps are not
    /// the restart's.
    pub fn count_from_here(&mut self) {
        self.baseline = (
            self.counts.0.load(Ordering::Relaxed),
            self.counts.1.load(Ordering::Relaxed),
        );
        self.reasons
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Stops the client (its stdin closes) and reports.
    pub fn finish(mut self) -> ConnectReport {
        drop(self.stdin.take());
        let _ = self.child.wait();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        ConnectReport {
            ok: self.counts.0.load(Ordering::Relaxed) - self.baseline.0,
            failed: self.counts.1.load(Ordering::Relaxed) - self.baseline.1,
            reasons: self
                .reasons
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        }
    }
}

impl Drop for Connects {
    fn drop(&mut self) {
        // A run that failed midway: the client is ours, by PID.
        if self.reader.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
