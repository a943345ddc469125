//! The cross-platform UAPI socket (`/var/run/wireguard/<dev>.sock`), spoken by wireguard-go
//! and boringtun.
//!
//! Hand-written on purpose: the text protocol is a few `key=value` lines, and the crates that
//! speak it did not fit — `wireguard-uapi`'s client has no I/O timeouts (a stuck daemon would
//! hang the agent) and brings neli and syn 1 along; `defguard_wireguard_rs` always builds a
//! whole userspace WireGuard (boringtun) into the binary.

use std::fmt::Write as _;
use std::io::{BufRead as _, BufReader, ErrorKind, Write as _};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::backend::{Backend, BackendError, DeviceState, DeviceUpdate, PeerState};
use super::key::Key;

/// Where userspace implementations put their sockets (shared by all network namespaces).
pub const SOCKET_DIR: &str = "/var/run/wireguard";

/// How long one request may take.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// The UAPI socket of `device`.
pub fn socket_path(device: &str) -> PathBuf {
    Path::new(SOCKET_DIR).join(format!("{device}.sock"))
}

/// A device behind a UAPI socket.
#[derive(Debug, Clone)]
pub struct UapiBackend {
    device: String,
    socket: PathBuf,
}

impl UapiBackend {
    /// The device `device` at its usual socket.
    pub fn new(device: &str) -> Self {
        Self::with_socket(device, socket_path(device))
    }

    /// The device `device` at `socket`.
    pub fn with_socket(device: &str, socket: PathBuf) -> Self {
        Self {
            device: device.to_owned(),
            socket,
        }
    }

    /// Whether something answers on the socket.
    pub fn is_up(&self) -> bool {
        UnixStream::connect(&self.socket).is_ok()
    }

    fn request(&self, request: &str) -> Result<Vec<String>, BackendError> {
        let gone = |detail: String| BackendError::Gone {
            device: self.device.clone(),
            detail,
        };
        let other = |detail: String| BackendError::Other {
            device: self.device.clone(),
            detail,
        };
        let mut stream = UnixStream::connect(&self.socket).map_err(|err| match err.kind() {
            ErrorKind::NotFound | ErrorKind::ConnectionRefused => {
                gone(format!("{}: {err}", self.socket.display()))
            }
            _ => other(format!("connecting to {}: {err}", self.socket.display())),
        })?;
        stream
            .set_read_timeout(Some(IO_TIMEOUT))
            .and_then(|()| stream.set_write_timeout(Some(IO_TIMEOUT)))
            .and_then(|()| stream.write_all(request.as_bytes()))
            .map_err(|err| other(format!("writing the request: {err}")))?;
        let mut lines = Vec::new();
        let mut reader = BufReader::new(stream);
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) => return Err(gone("the socket closed mid-answer".to_owned())),
                Ok(_) if line == "\n" => return Ok(lines),
                Ok(_) => lines.push(line.trim_end().to_owned()),
                Err(err) => return Err(other(format!("reading the answer: {err}"))),
            }
        }
    }

    fn check_errno(&self, lines: &[String]) -> Result<(), BackendError> {
        let errno = lines
            .iter()
            .find_map(|line| line.strip_prefix("errno="))
            .and_then(|errno| errno.parse::<i64>().ok());
        match errno {
            Some(0) => Ok(()),
            Some(errno) => Err(BackendError::Refused {
                device: self.device.clone(),
                errno,
            }),
            None => Err(BackendError::Other {
                device: self.device.clone(),
                detail: format!("answer without errno: {lines:?}"),
            }),
        }
    }
}

impl Backend for UapiBackend {
    fn device(&self) -> &str {
        &self.device
    }

    fn kind(&self) -> &'static str {
        "userspace"
    }

    fn get(&mut self) -> Result<DeviceState, BackendError> {
        let lines = self.request("get=1\n\n")?;
        self.check_errno(&lines)?;
        parse_get(&lines).map_err(|detail| BackendError::Other {
            device: self.device.clone(),
            detail,
        })
    }

    fn set(&mut self, update: &DeviceUpdate) -> Result<(), BackendError> {
        if update.is_empty() {
            return Ok(());
        }
        let lines = self.request(&format_set(update))?;
        self.check_errno(&lines)
    }

    /// A connect, no request: the device is there when its socket accepts.
    fn probe(&mut self) -> Result<(), BackendError> {
        match UnixStream::connect(&self.socket) {
            Ok(_) => Ok(()),
            Err(err) => Err(BackendError::Gone {
                device: self.device.clone(),
                detail: format!("{}: {err}", self.socket.display()),
            }),
        }
    }
}

/// The `set=1` request for `update`, ending with the empty line.
pub fn format_set(update: &DeviceUpdate) -> String {
    let mut out = String::with_capacity(64 + update.peers.len() * 160);
    out.push_str("set=1\n");
    if let Some(key) = &update.private_key {
        let _ = writeln!(out, "private_key={}", key.to_hex());
    }
    if let Some(port) = update.listen_port {
        let _ = writeln!(out, "listen_port={port}");
    }
    for peer in &update.peers {
        let _ = writeln!(out, "public_key={}", peer.key.to_hex());
        if peer.remove {
            out.push_str("remove=true\n");
            continue;
        }
        if let Some(endpoint) = peer.endpoint {
            let _ = writeln!(out, "endpoint={endpoint}");
        }
        if peer.replace_allowed_ips {
            out.push_str("replace_allowed_ips=true\n");
        }
        for prefix in &peer.allowed_ips {
            let _ = writeln!(out, "allowed_ip={prefix}");
        }
    }
    out.push('\n');
    out
}

/// Reads the lines of a `get=1` answer (without the final empty line).
pub fn parse_get(lines: &[String]) -> Result<DeviceState, String> {
    let mut device = DeviceState::default();
    let mut handshake_sec = 0u64;
    for line in lines {
        let Some((key, value)) = line.split_once('=') else {
            return Err(format!("unreadable line {line:?}"));
        };
        let bad = || format!("bad {key} {value:?}");
        if key == "public_key" {
            device.peers.push(PeerState {
                key: Key::from_hex(value).map_err(|_| bad())?,
                endpoint: None,
                allowed_ips: Vec::new(),
                last_handshake: None,
                rx_bytes: 0,
                tx_bytes: 0,
            });
            continue;
        }
        let Some(peer) = device.peers.last_mut() else {
            match key {
                "listen_port" => device.listen_port = value.parse().map_err(|_| bad())?,
                "private_key" => device.has_private_key = true,
                _ => {}
            }
            continue;
        };
        match key {
            "endpoint" => peer.endpoint = Some(value.parse::<SocketAddr>().map_err(|_| bad())?),
            "allowed_ip" => peer.allowed_ips.push(value.parse().map_err(|_| bad())?),
            "rx_bytes" => peer.rx_bytes = value.parse().map_err(|_| bad())?,
            "tx_bytes" => peer.tx_bytes = value.parse().map_err(|_| bad())?,
            "last_handshake_time_sec" => handshake_sec = value.parse().map_err(|_| bad())?,
            "last_handshake_time_nsec" => {
                let nsec: u32 = value.parse().map_err(|_| bad())?;
                peer.last_handshake = (handshake_sec != 0 || nsec != 0).then(|| {
                    SystemTime::UNIX_EPOCH + Duration::new(handshake_sec, nsec.min(999_999_999))
                });
            }
            _ => {}
        }
    }
    Ok(device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::PeerUpdate;

    #[test]
    fn set_request_lists_device_then_peers_in_order() {
        let update = DeviceUpdate {
            private_key: Some(Key([1; 32])),
            listen_port: Some(51871),
            peers: vec![
                PeerUpdate {
                    key: Key([2; 32]),
                    remove: false,
                    endpoint: Some("10.213.0.2:51871".parse().unwrap()),
                    replace_allowed_ips: true,
                    allowed_ips: vec!["10.214.2.0/24".parse().unwrap()],
                },
                PeerUpdate::remove(Key([3; 32])),
            ],
        };
        let text = format_set(&update);
        let expected = format!(
            "set=1\nprivate_key={}\nlisten_port=51871\npublic_key={}\nendpoint=10.213.0.2:51871\n\
             replace_allowed_ips=true\nallowed_ip=10.214.2.0/24\npublic_key={}\nremove=true\n\n",
            "01".repeat(32),
            "02".repeat(32),
            "03".repeat(32)
        );
        assert_eq!(text, expected);
    }

    #[test]
    fn get_answer_is_parsed_per_peer() {
        let answer = format!(
            "private_key={}\nlisten_port=51871\npublic_key={}\nprotocol_version=1\n\
             endpoint=[fd6d:77::2]:51871\nlast_handshake_time_sec=5\nlast_handshake_time_nsec=7\n\
             tx_bytes=10\nrx_bytes=20\npersistent_keepalive_interval=0\nallowed_ip=10.214.2.0/24\n\
             allowed_ip=10.214.9.9/32\npublic_key={}\nlast_handshake_time_sec=0\n\
             last_handshake_time_nsec=0\nerrno=0",
            "01".repeat(32),
            "02".repeat(32),
            "03".repeat(32)
        );
        let lines: Vec<String> = answer.lines().map(str::to_owned).collect();
        let device = parse_get(&lines).unwrap();
        assert_eq!(device.listen_port, 51871);
        assert!(device.has_private_key);
        assert_eq!(device.peers.len(), 2);
        let first = &device.peers[0];
        assert_eq!(first.key, Key([2; 32]));
        assert_eq!(first.endpoint, Some("[fd6d:77::2]:51871".parse().unwrap()));
        assert_eq!(first.allowed_ips.len(), 2);
        assert_eq!((first.rx_bytes, first.tx_bytes), (20, 10));
        assert_eq!(
            first.last_handshake,
            Some(SystemTime::UNIX_EPOCH + Duration::new(5, 7))
        );
        assert_eq!(device.peers[1].last_handshake, None);
        assert!(parse_get(&["public_key=zz".to_owned()]).is_err());
    }
}
