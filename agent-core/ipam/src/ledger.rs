//! The allocations of one pool, by owner and by IP, and their checkpoint: every change is
//! written before it is applied, so what the pool answers is always what a restart restores.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use crate::allocation::{Allocation, Mode};
use crate::checkpoint::{Checkpoint, CheckpointError};

/// The allocations and the file they are kept in.
#[derive(Debug)]
pub(crate) struct Ledger {
    mode: Mode,
    checkpoint: Checkpoint,
    by_owner: BTreeMap<String, Allocation>,
    by_ip: BTreeMap<Ipv4Addr, String>,
}

impl Ledger {
    /// The allocations `checkpoint` holds (none when it does not exist).
    pub(crate) fn restore(checkpoint: Checkpoint, mode: Mode) -> Result<Self, CheckpointError> {
        let restored = checkpoint.load(mode)?;
        let mut ledger = Self {
            mode,
            checkpoint,
            by_owner: BTreeMap::new(),
            by_ip: BTreeMap::new(),
        };
        // `load` refused duplicates: each insert is new.
        for allocation in restored {
            ledger.record(allocation);
        }
        Ok(ledger)
    }

    /// The checkpoint.
    pub(crate) fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }

    /// `owner`'s allocation.
    pub(crate) fn get(&self, owner: &str) -> Option<&Allocation> {
        self.by_owner.get(owner)
    }

    /// Whether `ip` is handed out.
    pub(crate) fn holds(&self, ip: Ipv4Addr) -> bool {
        self.by_ip.contains_key(&ip)
    }

    /// Who holds `ip`.
    pub(crate) fn holder(&self, ip: Ipv4Addr) -> Option<&str> {
        self.by_ip.get(&ip).map(String::as_str)
    }

    /// Every allocation, by IP.
    pub(crate) fn by_ip(&self) -> impl Iterator<Item = &Allocation> {
        self.by_ip.values().map(|owner| &self.by_owner[owner])
    }

    /// How many IPs are handed out.
    pub(crate) fn len(&self) -> usize {
        self.by_owner.len()
    }

    /// Records `allocation` (of a new owner, on a free IP) once the checkpoint holds it.
    pub(crate) fn insert(&mut self, allocation: Allocation) -> Result<(), CheckpointError> {
        debug_assert!(!self.by_owner.contains_key(&allocation.owner));
        debug_assert!(!self.by_ip.contains_key(&allocation.ip));
        self.checkpoint.save(
            self.mode,
            self.by_owner.values().chain(std::iter::once(&allocation)),
        )?;
        self.record(allocation);
        Ok(())
    }

    /// Removes `owner`'s allocation once the checkpoint no longer holds it; `None` (and
    /// nothing written) when it had none.
    pub(crate) fn remove(&mut self, owner: &str) -> Result<Option<Allocation>, CheckpointError> {
        if !self.by_owner.contains_key(owner) {
            return Ok(None);
        }
        self.checkpoint.save(
            self.mode,
            self.by_owner.values().filter(|a| a.owner != owner),
        )?;
        let allocation = self.by_owner.remove(owner);
        if let Some(allocation) = &allocation {
            self.by_ip.remove(&allocation.ip);
        }
        Ok(allocation)
    }

    fn record(&mut self, allocation: Allocation) {
        self.by_ip.insert(allocation.ip, allocation.owner.clone());
        self.by_owner.insert(allocation.owner.clone(), allocation);
    }
}
