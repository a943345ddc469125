//! Keeping a pinned hash map equal to a desired content, with the previous agent's entries
//! ("restored") deleted only once the matching sync wait has completed (§5: before it, only
//! adds and overwrites, never deletes of restored state).

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::path::Path;

use aya::Pod;
use aya::maps::{HashMap as BpfHashMap, Map, MapData, MapError};

use super::maps::MapsError;

/// Counters of one map.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SyncStats {
    /// Entries written.
    pub written: u64,
    /// Entries deleted.
    pub deleted: u64,
    /// Restored entries not desired, kept until the wait completes.
    pub restored_pending: u64,
    /// Failed writes or deletes.
    pub errors: u64,
    /// Entries the map holds (this agent's and the restored ones not pruned yet).
    pub entries: u64,
}

/// A pinned map and what this agent knows it holds.
pub struct PinnedSync<K, V> {
    name: &'static str,
    map: BpfHashMap<MapData, K, V>,
    written: HashMap<K, V>,
    restored: HashSet<K>,
    stats: SyncStats,
}

impl<K: Pod + Hash + Eq, V: Pod + PartialEq> PinnedSync<K, V> {
    /// Opens the map pinned at `path`; its current content is the restored state.
    pub fn open(path: &Path, name: &'static str) -> Result<Self, MapsError> {
        let err = |source| MapsError::Map {
            name,
            error: source,
        };
        let data = MapData::from_pin(path).map_err(err)?;
        let map = Map::from_map_data(data).map_err(err)?;
        let hash: BpfHashMap<MapData, K, V> = BpfHashMap::try_from(map).map_err(err)?;
        let mut written = HashMap::new();
        for item in hash.iter() {
            let (k, v) = item.map_err(err)?;
            written.insert(k, v);
        }
        let restored = written.keys().copied().collect();
        Ok(Self {
            name,
            map: hash,
            written,
            restored,
            stats: SyncStats::default(),
        })
    }

    /// The restored entries (what the previous agent left).
    pub fn restored(&self) -> impl Iterator<Item = (&K, &V)> {
        self.written
            .iter()
            .filter(|(k, _)| self.restored.contains(*k))
    }

    /// Writes what differs from `desired`; deletes entries not desired, except restored ones
    /// until `prune_restored`. Deletes run last so nothing points at a missing entry meanwhile.
    pub fn apply(&mut self, desired: &HashMap<K, V>, prune_restored: bool) {
        self.write(desired);
        self.delete_stale(desired, prune_restored);
    }

    /// Writes what differs from `desired`, deleting nothing.
    pub fn write(&mut self, desired: &HashMap<K, V>) {
        for (key, value) in desired {
            if self.written.get(key) == Some(value) {
                self.restored.remove(key);
                continue;
            }
            match self.map.insert(key, value, 0) {
                Ok(()) => {
                    self.written.insert(*key, *value);
                    self.restored.remove(key);
                    self.stats.written += 1;
                }
                Err(err) => {
                    self.stats.errors += 1;
                    tracing::error!(map = self.name, %err, "map write failed");
                }
            }
        }
    }

    /// Deletes entries not in `desired`; restored ones only when `prune_restored`.
    pub fn delete_stale(&mut self, desired: &HashMap<K, V>, prune_restored: bool) {
        self.delete_stale_in_order(desired, |_, _| prune_restored, |_| 0);
    }

    /// Deletes entries not in `desired`, lowest `rank` first (a frontend's master before its
    /// slots, so no reader finds a master counting a deleted slot); a restored entry only
    /// when `prune_restored` says it may go.
    pub fn delete_stale_in_order(
        &mut self,
        desired: &HashMap<K, V>,
        prune_restored: impl Fn(&K, &V) -> bool,
        rank: impl Fn(&K) -> u8,
    ) {
        let mut stale: Vec<(K, V)> = self
            .written
            .iter()
            .filter(|(k, _)| !desired.contains_key(*k))
            .map(|(k, v)| (*k, *v))
            .collect();
        stale.sort_by_key(|(k, _)| rank(k));
        let mut pending = 0;
        for (key, value) in stale {
            if self.restored.contains(&key) && !prune_restored(&key, &value) {
                pending += 1;
                continue;
            }
            match remove(&mut self.map, &key) {
                Ok(()) => {
                    self.written.remove(&key);
                    self.restored.remove(&key);
                    self.stats.deleted += 1;
                }
                Err(err) => {
                    self.stats.errors += 1;
                    tracing::error!(map = self.name, %err, "map delete failed");
                }
            }
        }
        self.stats.restored_pending = pending;
    }

    /// Every entry the map holds (this agent's and the restored ones not pruned yet).
    pub fn entries(&self) -> impl Iterator<Item = (&K, &V)> {
        self.written.iter()
    }

    /// Counters.
    pub fn stats(&self) -> SyncStats {
        SyncStats {
            entries: self.written.len() as u64,
            ..self.stats
        }
    }

    /// Entries the map holds.
    pub fn len(&self) -> usize {
        self.written.len()
    }

    /// True when the map is empty.
    pub fn is_empty(&self) -> bool {
        self.written.is_empty()
    }
}

/// Deletes `key`; a missing key is not an error.
fn remove<K: Pod, V: Pod>(map: &mut BpfHashMap<MapData, K, V>, key: &K) -> Result<(), MapError> {
    match map.remove(key) {
        Err(MapError::SyscallError(err)) if err.io_error.kind() == std::io::ErrorKind::NotFound => {
            Ok(())
        }
        other => other,
    }
}
