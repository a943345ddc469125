//! Which etcd servers a process holds connections to: its socket descriptors matched against
//! its network namespace's TCP table (procfs), so the demo can show what kvstoremesh saves.

use std::collections::BTreeSet;

use anyhow::Context as _;
use procfs::net::TcpState;
use procfs::process::{FDTarget, Process};

/// A process's established TCP connections to a set of servers.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// The servers' ports it is connected to.
    pub servers: BTreeSet<u16>,
    /// Its connections to them.
    pub connections: usize,
}

/// The established TCP connections of process `pid` to 127.0.0.1 on any of `ports`.
pub fn connections_to(pid: u32, ports: &[u16]) -> anyhow::Result<Held> {
    let process = Process::new(i32::try_from(pid).context("a PID fits an i32")?)
        .with_context(|| format!("process {pid}"))?;
    let sockets: BTreeSet<u64> = process
        .fd()
        .with_context(|| format!("listing the descriptors of process {pid}"))?
        .filter_map(|fd| match fd.ok()?.target {
            FDTarget::Socket(inode) => Some(inode),
            _ => None,
        })
        .collect();
    let table = process
        .tcp()
        .with_context(|| format!("reading the TCP table of process {pid}'s namespace"))?;
    let mut held = Held::default();
    for entry in table {
        let remote = entry.remote_address;
        if entry.state == TcpState::Established
            && sockets.contains(&entry.inode)
            && remote.ip().is_loopback()
            && ports.contains(&remote.port())
        {
            held.servers.insert(remote.port());
            held.connections += 1;
        }
    }
    Ok(held)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_this_process_connection_and_not_another_port() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let other_port = other.local_addr().unwrap().port();
        let _client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (_server, _) = listener.accept().unwrap();
        let held = connections_to(std::process::id(), &[port]).unwrap();
        assert_eq!(held.servers, BTreeSet::from([port]));
        assert_eq!(
            held.connections, 1,
            "the accepted side has the client's port as remote"
        );
        let none = connections_to(std::process::id(), &[other_port]).unwrap();
        assert_eq!(none, Held::default());
    }
}
