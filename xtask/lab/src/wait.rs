//! Waiting on conditions with deadlines (never a bare sleep as synchronisation).

use std::time::{Duration, Instant};

use crate::{LabError, Result};

/// Polls `check` every `interval` until it returns `Some`, or fails after `timeout`.
pub fn until<T>(
    what: &str,
    timeout: Duration,
    interval: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> Result<T> {
    let start = Instant::now();
    loop {
        if let Some(value) = check() {
            return Ok(value);
        }
        if start.elapsed() >= timeout {
            return Err(LabError::Timeout {
                what: what.to_owned(),
                waited: start.elapsed(),
            });
        }
        std::thread::sleep(interval);
    }
}

/// Picks a TCP port on 127.0.0.1 that is free right now.
pub fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))
        .map_err(LabError::io("binding 127.0.0.1:0 to pick a free port"))?;
    let port = listener
        .local_addr()
        .map_err(LabError::io("reading the picked port"))?
        .port();
    Ok(port)
}

/// True when something accepts TCP connections on 127.0.0.1:`port`.
pub fn port_open(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    )
    .is_ok()
}
