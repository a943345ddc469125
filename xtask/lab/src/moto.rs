//! A moto server patched to behave like EC2, as the EC2 endpoint of tests and benchmarks.
//!
//! The server is `python -m meshwork_moto` from the venv of `cargo xtask setup`, with
//! `xtask/lab/moto` on `PYTHONPATH`; that package (see its docstring) patches moto's address
//! allocation, ENI/IP limits, prefix delegation, device indexes, pagination and filters, and
//! adds control endpoints for fault injection and call counting, which [`MotoServer`] wraps.
//! It listens on 127.0.0.1 only and is stopped (by PID) when its handle is dropped.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;

use crate::process::LabProcess;
use crate::{LabError, Result, paths, wait};

/// How long the server may take to answer its first request.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// Deadline of one control request (`/moto-api/reset` takes up to ~2 s).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Deadline of one readiness probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// A running patched moto server on 127.0.0.1; stopped and its log directory removed on drop.
#[derive(Debug)]
pub struct MotoServer {
    process: LabProcess,
    port: u16,
    // Last, so the process is stopped before its directory goes.
    dir: TempDir,
}

/// An HTTP answer from the server: status code and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpReply {
    /// The HTTP status code.
    pub status: u16,
    /// The response body.
    pub body: String,
}

impl MotoServer {
    /// The directory holding the `meshwork_moto` package and its tests.
    pub fn moto_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("moto")
    }

    /// Starts the server on a free port and waits until it answers. If the port was taken
    /// between picking and binding, it retries with another.
    pub fn start() -> Result<Self> {
        let python = paths::venv_python()?;
        let dir = tempfile::Builder::new()
            .prefix("meshwork-moto-")
            .tempdir()
            .map_err(LabError::io("creating the moto temp dir"))?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = wait::free_port()?;
            match Self::spawn(&python, dir.path(), port) {
                Ok(process) => return Ok(Self { process, port, dir }),
                Err(err) if attempt < 3 => {
                    tracing::warn!(%err, "moto did not start; retrying with another port");
                }
                Err(err) => return Err(err),
            }
        }
    }

    fn spawn(python: &Path, dir: &Path, port: u16) -> Result<LabProcess> {
        let moto_dir = Self::moto_dir();
        let mut command = Command::new(python);
        command
            .args(["-m", "meshwork_moto", "--host", "127.0.0.1", "--port"])
            .arg(port.to_string())
            .current_dir(&moto_dir)
            .env("PYTHONPATH", &moto_dir)
            .env("PYTHONUNBUFFERED", "1")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_DEFAULT_REGION", "us-east-1");
        let log = dir.join(format!("moto-{port}.log"));
        let mut process = LabProcess::spawn("meshwork_moto", command, &log)?;
        let ready = wait::until(
            "meshwork_moto to answer",
            READY_TIMEOUT,
            Duration::from_millis(50),
            || {
                if let Err(err) = process.check_running() {
                    return Some(Err(err));
                }
                // Our own control endpoint, so a stranger on the port does not count.
                request(port, "GET", "/meshwork/calls", None, PROBE_TIMEOUT)
                    .ok()
                    .filter(|reply| reply.status == 200)
                    .map(|_| Ok(()))
            },
        );
        match ready {
            Ok(Ok(())) => Ok(process),
            Ok(Err(err)) => Err(err),
            Err(err) => Err(LabError::CommandFailed {
                command: "meshwork_moto".to_owned(),
                detail: format!("{err}; log:\n{}", process.log_tail()),
            }),
        }
    }

    /// The EC2 endpoint URL, e.g. `http://127.0.0.1:45123`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process ID.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The server's log file.
    pub fn log(&self) -> &Path {
        self.process.log()
    }

    /// The server's temp directory (holds the log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Wipes all moto state, fault rules and call counters (`POST /moto-api/reset`).
    pub fn reset(&self) -> Result<()> {
        self.expect_ok("POST", "/moto-api/reset", None).map(drop)
    }

    /// Adds fault rules, e.g.
    /// `{"rules":[{"action":"AssignPrivateIpAddresses","error":"RequestLimitExceeded","status":503,"count":2}]}`
    /// (or `"delay_ms": N` instead of, or with, `"error"`): the next `count` calls of
    /// `action` are delayed and/or answered with that EC2 error and HTTP status.
    pub fn set_faults(&self, json: &str) -> Result<()> {
        self.expect_ok("POST", "/meshwork/faults", Some(json))
            .map(drop)
    }

    /// Removes every fault rule.
    pub fn clear_faults(&self) -> Result<()> {
        self.expect_ok("DELETE", "/meshwork/faults", None).map(drop)
    }

    /// Per-action call counts since start or the last reset, as raw JSON
    /// (`{"AssignPrivateIpAddresses": 3, ...}`; faulted calls included).
    pub fn calls(&self) -> Result<String> {
        self.expect_ok("GET", "/meshwork/calls", None)
    }

    /// Per-action call counts, parsed.
    pub fn call_counts(&self) -> Result<serde_json::Map<String, serde_json::Value>> {
        let text = self.calls()?;
        serde_json::from_str(&text).map_err(|err| LabError::CommandFailed {
            command: "GET /meshwork/calls".to_owned(),
            detail: format!("unreadable JSON {text:?}: {err}"),
        })
    }

    /// Zeroes the call counters without touching moto's state.
    pub fn clear_calls(&self) -> Result<()> {
        self.expect_ok("DELETE", "/meshwork/calls", None).map(drop)
    }

    /// Sends one HTTP request to the server and returns its reply, whatever the status.
    pub fn request(&self, method: &str, path: &str, body: Option<&str>) -> Result<HttpReply> {
        request(self.port, method, path, body, REQUEST_TIMEOUT)
    }

    fn expect_ok(&self, method: &str, path: &str, body: Option<&str>) -> Result<String> {
        let reply = self.request(method, path, body)?;
        if (200..300).contains(&reply.status) {
            Ok(reply.body)
        } else {
            Err(LabError::CommandFailed {
                command: format!("{method} {path}"),
                detail: format!("HTTP {}: {}", reply.status, reply.body.trim()),
            })
        }
    }
}

/// A minimal HTTP/1.1 request over a fresh connection (`Connection: close`), enough for the
/// control endpoints without an HTTP-client dependency.
fn request(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&str>,
    timeout: Duration,
) -> Result<HttpReply> {
    let what = format!("{method} http://127.0.0.1:{port}{path}");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, timeout.min(PROBE_TIMEOUT))
        .map_err(LabError::io(format!("connecting for {what}")))?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(LabError::io("setting socket timeouts"))?;
    let body = body.unwrap_or("");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(body.as_bytes()))
        .map_err(LabError::io(format!("sending {what}")))?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .map_err(LabError::io(format!("reading the answer to {what}")))?;
    parse_reply(&raw).ok_or_else(|| LabError::CommandFailed {
        command: what,
        detail: format!("malformed HTTP answer: {:?}", String::from_utf8_lossy(&raw)),
    })
}

fn parse_reply(raw: &[u8]) -> Option<HttpReply> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..split]).ok()?;
    let mut body = &raw[split + 4..];
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let length = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())?
    });
    if let Some(n) = length {
        body = &body[..n.min(body.len())];
    }
    Some(HttpReply {
        status,
        body: String::from_utf8_lossy(body).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_reply_with_content_length() {
        let raw =
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
        let reply = parse_reply(raw).expect("parses");
        assert_eq!(reply.status, 200);
        assert_eq!(reply.body, "{}");
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse_reply(b"not http").is_none());
    }
}
