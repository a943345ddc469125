//! What the ipcache map should hold, and writing the difference in batches. A plain state
//! machine: the actor feeds it events and flushes it after each batch.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use hashbrown::hash_map::Entry;

use super::bpf_sys::BatchError;
use super::ipcache_map::{self, EntryError, IpCacheKey, IpCacheValue};
use super::maps::IpCacheMap;
use meshwork_types::Change;
use meshwork_types::IpCacheEntry;

/// Who put an entry in the map; only the owner deletes it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Owner {
    /// A local endpoint, by ID.
    Endpoint(u64),
    /// A remote cluster, by name.
    Cluster(Arc<str>),
}

/// Outcome counters of the writer, read by metrics and status.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct WriterStats {
    /// Entries rejected, by [`EntryError::reason`].
    pub rejected: HashMap<&'static str, u64>,
    /// Writes refused because the map is full.
    pub map_full: u64,
    /// Other write failures.
    pub write_errors: u64,
    /// Entries written (upserts) since start.
    pub written: u64,
    /// Entries deleted since start.
    pub deleted: u64,
}

// foldhash, not SipHash: hashing showed as a fifth of the writer's own time in profiles of
// large lists (`bench datapath`); it is seeded per table, so keys a remote picks still cannot
// be aimed at one bucket.
type FastMap<K, V> = hashbrown::HashMap<K, V, foldhash::fast::RandomState>;

/// An [`Owner`] as the desired table holds it: a cluster by its index in the writer's
/// `clusters`. Storing a cluster's name instead took a locked reference-count increment per
/// entry, which waited for the table's cache misses: an eighth of the writer's time on a
/// large list (`bench datapath`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OwnerSlot {
    Endpoint(u64),
    Cluster(u32),
}

/// Desired ipcache content and the writes not yet flushed.
pub struct IpCacheWriter {
    local_node: Option<IpAddr>,
    desired: FastMap<IpCacheKey, (OwnerSlot, IpCacheValue)>,
    /// Every cluster that has owned an entry, indexed by [`OwnerSlot::Cluster`]; never
    /// shrinks (a cluster's name costs a few bytes).
    clusters: Vec<Arc<str>>,
    /// Keys each local endpoint has set (a superset: a key another owner took since is
    /// skipped on removal), so replacing an endpoint does not walk every remote entry.
    endpoint_keys: FastMap<u64, Vec<IpCacheKey>>,
    /// Writes not yet flushed, in the order they were made (`None`: a delete). Replayed in
    /// that order, so a key written twice ends as it was last written without a lookup.
    pending: Vec<(IpCacheKey, Option<IpCacheValue>)>,
    batch_supported: bool,
    stats: WriterStats,
}

impl IpCacheWriter {
    /// A writer for a node whose own IP is `local_node` (its entries get tunnel endpoint 0).
    pub fn new(local_node: Option<IpAddr>) -> Self {
        Self {
            local_node,
            desired: FastMap::default(),
            clusters: Vec::new(),
            endpoint_keys: FastMap::default(),
            pending: Vec::new(),
            batch_supported: true,
            stats: WriterStats::default(),
        }
    }

    /// Upserts `entry` for `owner`; a rejected entry is counted and never written.
    pub fn upsert(&mut self, owner: &Owner, entry: &IpCacheEntry) -> Result<(), EntryError> {
        let (key, value) = self.encode(entry)?;
        let slot = self.intern(owner);
        self.set_slot(slot, key, value);
        Ok(())
    }

    /// The entry's key and value; a rejection is counted.
    fn encode(&mut self, entry: &IpCacheEntry) -> Result<(IpCacheKey, IpCacheValue), EntryError> {
        ipcache_map::encode(entry, self.local_node).inspect_err(|err| {
            *self.stats.rejected.entry(err.reason()).or_default() += 1;
        })
    }

    fn intern_cluster(&mut self, name: &Arc<str>) -> OwnerSlot {
        let index = self.cluster_index(name).unwrap_or_else(|| {
            self.clusters.push(Arc::clone(name));
            self.clusters.len() - 1
        });
        OwnerSlot::Cluster(index as u32)
    }

    /// The slot of `owner`, added if it is a cluster not seen before.
    fn intern(&mut self, owner: &Owner) -> OwnerSlot {
        match owner {
            Owner::Endpoint(id) => OwnerSlot::Endpoint(*id),
            Owner::Cluster(name) => self.intern_cluster(name),
        }
    }

    /// The slot of `owner` if it may own entries.
    fn slot(&self, owner: &Owner) -> Option<OwnerSlot> {
        match owner {
            Owner::Endpoint(id) => Some(OwnerSlot::Endpoint(*id)),
            Owner::Cluster(name) => self
                .cluster_index(name)
                .map(|index| OwnerSlot::Cluster(index as u32)),
        }
    }

    // Few clusters (at most 511), and the same `Arc` arrives batch after batch: the pointer
    // comparison answers first.
    fn cluster_index(&self, name: &Arc<str>) -> Option<usize> {
        self.clusters
            .iter()
            .position(|known| Arc::ptr_eq(known, name))
            .or_else(|| self.clusters.iter().position(|known| known == name))
    }

    fn owner_of(&self, slot: OwnerSlot) -> Owner {
        match slot {
            OwnerSlot::Endpoint(id) => Owner::Endpoint(id),
            OwnerSlot::Cluster(index) => Owner::Cluster(Arc::clone(&self.clusters[index as usize])),
        }
    }

    /// Applies one remote cluster's change; a rejected upsert is counted and never written.
    pub fn apply_remote(
        &mut self,
        cluster: &Arc<str>,
        change: &Change<IpCacheEntry>,
    ) -> Result<(), EntryError> {
        match change {
            Change::Upsert(entry) => {
                let (key, value) = self.encode(entry)?;
                let owner = self.intern_cluster(cluster);
                self.set_slot(owner, key, value);
                Ok(())
            }
            Change::Delete(entry) => {
                if let Some(index) = self.cluster_index(cluster)
                    && let Ok(key) =
                        IpCacheKey::new(entry.prefix.addr(), entry.prefix.prefix_len(), 0)
                {
                    self.remove_slot_key(OwnerSlot::Cluster(index as u32), key);
                }
                Ok(())
            }
        }
    }

    /// Replaces local endpoint `id`'s entries: each IP a host entry of `identity` on this node
    /// (tunnel 0). Answers the IPs refused (identity 0).
    pub fn set_local(&mut self, id: u64, ips: &[IpAddr], identity: u32) -> Vec<IpAddr> {
        let owner = Owner::Endpoint(id);
        self.remove_owner(&owner);
        let mut refused = Vec::new();
        for &ip in ips {
            let len = if ip.is_ipv4() { 32 } else { 128 };
            match IpCacheKey::new(ip, len, 0) {
                Ok(key) if identity != 0 => {
                    self.set(&owner, key, IpCacheValue::new(identity, None, 0));
                }
                _ => refused.push(ip),
            }
        }
        refused
    }

    /// Makes room for `additional` more entries (a batch about to be applied), so a large
    /// list grows the tables once per batch rather than rehashing inside it.
    pub fn reserve(&mut self, additional: usize) {
        self.desired.reserve(additional);
        self.pending.reserve(additional);
    }

    /// Upserts an already encoded entry.
    pub fn set(&mut self, owner: &Owner, key: IpCacheKey, value: IpCacheValue) {
        let slot = self.intern(owner);
        self.set_slot(slot, key, value);
    }

    fn set_slot(&mut self, owner: OwnerSlot, key: IpCacheKey, value: IpCacheValue) {
        let endpoint = match owner {
            OwnerSlot::Endpoint(id) => Some(id),
            OwnerSlot::Cluster(_) => None,
        };
        // One probe: the entry is compared and replaced in place.
        match self.desired.entry(key) {
            Entry::Occupied(mut current) => {
                if current.get().0 == owner && current.get().1 == value {
                    return;
                }
                current.insert((owner, value));
            }
            Entry::Vacant(slot) => {
                slot.insert((owner, value));
            }
        }
        if let Some(id) = endpoint {
            let keys = self.endpoint_keys.entry(id).or_default();
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        self.pending.push((key, Some(value)));
    }

    /// Deletes the entry of `prefix` if `owner` put it there.
    pub fn delete(&mut self, owner: &Owner, entry: &IpCacheEntry) {
        let Ok(key) = IpCacheKey::new(entry.prefix.addr(), entry.prefix.prefix_len(), 0) else {
            return;
        };
        self.remove_key(owner, key);
    }

    /// Deletes `key` if `owner` put it there.
    pub fn remove_key(&mut self, owner: &Owner, key: IpCacheKey) {
        if let Some(owner) = self.slot(owner) {
            self.remove_slot_key(owner, key);
        }
    }

    fn remove_slot_key(&mut self, owner: OwnerSlot, key: IpCacheKey) {
        if let Entry::Occupied(current) = self.desired.entry(key)
            && current.get().0 == owner
        {
            current.remove();
            self.pending.push((key, None));
        }
    }

    /// Deletes everything `owner` contributed (a removed cluster, a deleted endpoint). An
    /// endpoint's keys come from its index; a cluster (removed rarely) takes a walk.
    pub fn remove_owner(&mut self, owner: &Owner) {
        let Some(owner) = self.slot(owner) else {
            return;
        };
        let keys: Vec<_> = match owner {
            OwnerSlot::Endpoint(id) => self.endpoint_keys.remove(&id).unwrap_or_default(),
            OwnerSlot::Cluster(_) => self
                .desired
                .iter()
                .filter(|(_, (o, _))| *o == owner)
                .map(|(k, _)| *k)
                .collect(),
        };
        for key in keys {
            self.remove_slot_key(owner, key);
        }
    }

    /// Writes the pending changes to `map` and takes in the outcome ([`PendingWrites::write`],
    /// then [`Self::finish`]).
    pub fn flush(&mut self, map: &mut IpCacheMap) -> Result<(), FlushError> {
        match self.take_pending() {
            Some(pending) => {
                let outcome = pending.write(map);
                self.finish(outcome)
            }
            None => Ok(()),
        }
    }

    /// The writes made since the last flush, to be written elsewhere (another thread may hold
    /// the map); `None` when there are none.
    pub fn take_pending(&mut self) -> Option<PendingWrites> {
        if self.pending.is_empty() {
            return None;
        }
        Some(PendingWrites {
            writes: std::mem::take(&mut self.pending),
            batch_supported: self.batch_supported,
        })
    }

    /// Takes in what writing [`Self::take_pending`]'s writes did: the counters, whether the
    /// kernel batches, and the upserts a full map refused — no longer desired (unless set
    /// again since), so a later flush does not re-send them forever.
    pub fn finish(&mut self, outcome: WriteOutcome) -> Result<(), FlushError> {
        let WriteOutcome {
            mut writes,
            written,
            deleted,
            write_errors,
            batch_unsupported,
            not_written,
            error,
        } = outcome;
        self.stats.written += written;
        self.stats.deleted += deleted;
        self.stats.write_errors += write_errors;
        self.stats.map_full += not_written.len() as u64;
        if batch_unsupported {
            self.batch_supported = false;
        }
        for (key, value) in not_written {
            if let Entry::Occupied(current) = self.desired.entry(key)
                && current.get().1 == value
            {
                current.remove();
            }
        }
        if self.pending.is_empty() {
            // The buffer is kept for the next batch.
            writes.clear();
            self.pending = writes;
        }
        error.map_or(Ok(()), Err)
    }

    /// Bytes the desired state's tables hold (allocations, not their use): what the writer
    /// costs per entry beside the map itself.
    pub fn table_bytes(&self) -> usize {
        self.desired.allocation_size()
            + self.endpoint_keys.allocation_size()
            + self.pending.capacity() * size_of::<(IpCacheKey, Option<IpCacheValue>)>()
    }

    /// Entries the map should hold now.
    pub fn len(&self) -> usize {
        self.desired.len()
    }

    /// True when the map should be empty.
    pub fn is_empty(&self) -> bool {
        self.desired.is_empty()
    }

    /// Whether `key` is desired, and by whom.
    pub fn owner(&self, key: &IpCacheKey) -> Option<Owner> {
        self.desired.get(key).map(|(o, _)| self.owner_of(*o))
    }

    /// The counters.
    pub fn stats(&self) -> &WriterStats {
        &self.stats
    }
}

/// Writes taken from an [`IpCacheWriter`], in the order they were made (`None`: a delete).
/// Replayed in that order, so a key written twice ends as it was last written.
pub struct PendingWrites {
    writes: Vec<(IpCacheKey, Option<IpCacheValue>)>,
    batch_supported: bool,
}

/// What [`PendingWrites::write`] did, for [`IpCacheWriter::finish`].
#[derive(Debug)]
pub struct WriteOutcome {
    /// The writes' buffer, given back for reuse.
    writes: Vec<(IpCacheKey, Option<IpCacheValue>)>,
    written: u64,
    deleted: u64,
    write_errors: u64,
    batch_unsupported: bool,
    /// Upserts a full map refused.
    not_written: Vec<(IpCacheKey, IpCacheValue)>,
    error: Option<FlushError>,
}

impl PendingWrites {
    /// Writes them to `map`: each run of upserts in one batched call where the kernel batches
    /// this map, each delete on its own (deletes are rare: a removed entry or owner).
    pub fn write(self, map: &mut IpCacheMap) -> WriteOutcome {
        let mut outcome = WriteOutcome {
            writes: Vec::new(),
            written: 0,
            deleted: 0,
            write_errors: 0,
            batch_unsupported: !self.batch_supported,
            not_written: Vec::new(),
            error: None,
        };
        let mut keys = Vec::with_capacity(self.writes.len());
        let mut values = Vec::with_capacity(self.writes.len());
        for (key, value) in &self.writes {
            match value {
                Some(value) => {
                    keys.push(*key);
                    values.push(*value);
                }
                None => {
                    // The upserts before it first: the order is what makes the last write win.
                    outcome.upserts(map, &mut keys, &mut values);
                    match map.remove(key) {
                        Ok(()) => outcome.deleted += 1,
                        Err(err) => outcome.failed(FlushError::Write(syscall_error(err)), 1),
                    }
                }
            }
        }
        outcome.upserts(map, &mut keys, &mut values);
        outcome.writes = self.writes;
        outcome
    }
}

impl WriteOutcome {
    /// Writes one run of upserts, leaving `keys` and `values` empty.
    fn upserts(
        &mut self,
        map: &mut IpCacheMap,
        keys: &mut Vec<IpCacheKey>,
        values: &mut Vec<IpCacheValue>,
    ) {
        if keys.is_empty() {
            return;
        }
        let (written, error) = self.write_run(map, keys, values);
        self.written += written as u64;
        if let Some(err) = error {
            let failed = keys.len() - written;
            if err.raw_os_error() == Some(libc::ENOSPC) || err.raw_os_error() == Some(libc::E2BIG) {
                self.not_written.extend(
                    keys[written..]
                        .iter()
                        .copied()
                        .zip(values[written..].iter().copied()),
                );
                let failed = self.not_written.len();
                self.error = Some(FlushError::MapFull { failed });
            } else {
                self.failed(FlushError::Write(err), failed as u64);
            }
        }
        keys.clear();
        values.clear();
    }

    /// Counts `count` failed writes; a full map stays the error reported.
    fn failed(&mut self, error: FlushError, count: u64) {
        self.write_errors += count;
        if !matches!(self.error, Some(FlushError::MapFull { .. })) {
            self.error = Some(error);
        }
    }

    fn write_run(
        &mut self,
        map: &mut IpCacheMap,
        keys: &[IpCacheKey],
        values: &[IpCacheValue],
    ) -> (usize, Option<std::io::Error>) {
        if !self.batch_unsupported {
            match map.update_batch(keys, values) {
                Ok(()) => return (keys.len(), None),
                Err(BatchError::Unsupported(_)) => self.batch_unsupported = true,
                Err(BatchError::Failed { done, error }) => return (done, Some(error)),
            }
        }
        for (done, (key, value)) in keys.iter().zip(values).enumerate() {
            if let Err(error) = map.insert(key, value) {
                return (done, Some(syscall_error(error)));
            }
        }
        (keys.len(), None)
    }
}

/// The OS error behind a failed map call (map-full is told apart by its errno).
fn syscall_error(error: aya::maps::MapError) -> std::io::Error {
    match error {
        aya::maps::MapError::SyscallError(err) => err.io_error,
        other => std::io::Error::other(other),
    }
}

/// Why a flush did not write everything.
#[derive(Debug, thiserror::Error)]
pub enum FlushError {
    /// The map is full; `failed` entries were not written.
    #[error("the ipcache map is full: {failed} entries not written")]
    MapFull {
        /// Entries not written.
        failed: usize,
    },
    /// A write failed.
    #[error("writing the ipcache map: {0}")]
    Write(std::io::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ip: &str) -> IpCacheKey {
        IpCacheKey::new(ip.parse().unwrap(), 32, 0).unwrap()
    }

    #[test]
    fn replacing_an_endpoint_removes_only_what_it_still_owns() {
        let mut writer = IpCacheWriter::new(None);
        let cluster = Owner::Cluster(Arc::from("b"));
        for i in 0..100 {
            let k = key(&format!("10.214.0.{i}"));
            writer.set(&cluster, k, IpCacheValue::new(70_000, None, 0));
        }
        let ips: Vec<IpAddr> = vec!["10.1.0.1".parse().unwrap(), "10.1.0.2".parse().unwrap()];
        assert!(writer.set_local(7, &ips, 1000).is_empty());
        // Another owner takes one of the endpoint's keys.
        writer.set(
            &cluster,
            key("10.1.0.2"),
            IpCacheValue::new(70_001, None, 0),
        );

        assert!(writer.set_local(7, &ips[..0], 1000).is_empty());
        assert_eq!(writer.owner(&key("10.1.0.1")), None);
        assert_eq!(writer.owner(&key("10.1.0.2")), Some(cluster.clone()));
        assert_eq!(writer.len(), 101);

        writer.remove_owner(&Owner::Endpoint(7));
        writer.remove_owner(&cluster);
        assert!(writer.is_empty());
    }
}
