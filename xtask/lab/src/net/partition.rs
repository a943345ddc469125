//! Partitions: a link taken down, or an nft table that black-holes a prefix. Both are guards
//! that heal on [`LinkDown::heal`] / [`NftPartition::heal`] or on drop.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use super::cidr::Cidr;
use super::netns::{NETNS_DIR, Netns, command_in, run_bytes};
use crate::{Result, paths, process};

static TABLES: AtomicU32 = AtomicU32::new(0);

/// An interface held down (`ip link set DEV down`; its veth peer sees NO-CARRIER).
///
/// Admin-down makes the kernel delete the IPv4/IPv6 routes through the device, so the guard
/// saves them (`ip route save`) first and restores them after bringing the link back up.
#[derive(Debug)]
#[must_use = "the link comes back up when the guard drops"]
pub struct LinkDown {
    netns: String,
    dev: String,
    saved: Vec<(&'static str, Vec<u8>)>,
    healed: bool,
}

impl LinkDown {
    pub(super) fn new(netns: &Netns, dev: &str) -> Result<Self> {
        let mut saved = Vec::new();
        for family in ["-4", "-6"] {
            let routes = run_bytes(
                ip(netns.name())?.args([family, "route", "save", "table", "all", "dev", dev]),
                None,
            )?;
            saved.push((family, routes));
        }
        netns.ip(&["link", "set", dev, "down"])?;
        tracing::debug!(netns = %netns.name(), dev, "link down");
        Ok(Self {
            netns: netns.name().to_owned(),
            dev: dev.to_owned(),
            saved,
            healed: false,
        })
    }

    /// The interface that is down.
    pub fn dev(&self) -> &str {
        &self.dev
    }

    /// Brings the link back up and restores its routes.
    pub fn heal(mut self) -> Result<()> {
        self.restore()
    }

    fn restore(&mut self) -> Result<()> {
        if self.healed {
            return Ok(());
        }
        self.healed = true;
        process::run(ip(&self.netns)?.args(["link", "set", &self.dev, "up"]))?;
        for (family, routes) in &self.saved {
            // Routes that came back by themselves (connected ones) answer "File exists" on
            // stderr; `ip route restore` goes on with the rest.
            run_bytes(
                ip(&self.netns)?.args([*family, "route", "restore"]),
                Some(routes),
            )?;
        }
        tracing::debug!(netns = %self.netns, dev = %self.dev, "link up again");
        Ok(())
    }
}

impl Drop for LinkDown {
    fn drop(&mut self) {
        if !std::path::Path::new(NETNS_DIR).join(&self.netns).exists() {
            return;
        }
        if let Err(error) = self.restore() {
            tracing::debug!(%error, "healing a link on drop (namespace may be gone)");
        }
    }
}

/// An nft table (`inet mwpart<n>`) in one namespace dropping every packet to or from a prefix
/// on input, output and forward — a black hole with the links up.
#[derive(Debug)]
#[must_use = "the partition heals when the guard drops"]
pub struct NftPartition {
    netns_path: PathBuf,
    table: String,
    prefix: Cidr,
    healed: bool,
}

impl NftPartition {
    pub(super) fn new(netns: &Netns, prefix: &str) -> Result<Self> {
        let prefix = Cidr::parse(prefix)?.network();
        let table = format!("mwpart{}", TABLES.fetch_add(1, Ordering::Relaxed));
        let family = if prefix.is_ipv6() { "ip6" } else { "ip" };
        let script = format!(
            "table inet {table} {{\n\
             \x20 chain input {{ type filter hook input priority -300; policy accept; {family} saddr {prefix} drop; }}\n\
             \x20 chain output {{ type filter hook output priority -300; policy accept; {family} daddr {prefix} drop; }}\n\
             \x20 chain forward {{ type filter hook forward priority -300; policy accept; {family} saddr {prefix} drop; {family} daddr {prefix} drop; }}\n\
             }}\n"
        );
        let nft = paths::find_program("nft")?;
        run_bytes(
            command_in(netns.path(), &nft).args(["-f", "-"]),
            Some(script.as_bytes()),
        )?;
        tracing::debug!(netns = %netns.name(), %prefix, table, "nft partition");
        Ok(Self {
            netns_path: netns.path().to_owned(),
            table,
            prefix,
            healed: false,
        })
    }

    /// The prefix being dropped.
    pub fn prefix(&self) -> Cidr {
        self.prefix
    }

    /// The nft table's name (family `inet`).
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Deletes the table: traffic flows again.
    pub fn heal(mut self) -> Result<()> {
        self.remove()
    }

    fn remove(&mut self) -> Result<()> {
        if self.healed {
            return Ok(());
        }
        self.healed = true;
        let nft = paths::find_program("nft")?;
        process::run(command_in(&self.netns_path, &nft).args([
            "delete",
            "table",
            "inet",
            &self.table,
        ]))
        .map(drop)
    }
}

impl Drop for NftPartition {
    fn drop(&mut self) {
        if !self.netns_path.exists() {
            return;
        }
        if let Err(error) = self.remove() {
            tracing::warn!(%error, "removing an nft partition");
        }
    }
}

fn ip(netns: &str) -> Result<Command> {
    let mut command = Command::new(paths::find_program("ip")?);
    command.args(["-n", netns]);
    Ok(command)
}
