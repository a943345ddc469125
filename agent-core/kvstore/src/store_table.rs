//! Where a watch store keeps its entries, and how it marks them stale for a re-list.
//!
//! [`ByKey`] keeps each key beside its value and works for any decoder. [`ByValue`] keeps only
//! the values, for decoders whose values name their own key ([`KeyedValue`]): an agent holds
//! every remote cluster's ipcache, and there the keys were half of what the store cost (a
//! boxed key and a 32-byte bucket per entry, against an 8-byte bucket).

use std::hash::BuildHasher as _;
use std::sync::Arc;

use hashbrown::hash_map::EntryRef;
use hashbrown::{HashMap, HashTable};
use meshwork_types::KeyedValue;

/// What an upsert did.
pub enum Upserted<'a, V> {
    /// The key held an equal value: nothing changed.
    Unchanged,
    /// The key held another value; this one replaced it.
    Changed(&'a Arc<V>),
    /// The key was new.
    Created(&'a Arc<V>),
    /// The value names another key: a decoder broke its [`KeyedValue`] promise. Nothing is
    /// stored.
    WrongKey,
}

/// A watch store's entries. Keys are relative to the watched prefix.
pub trait StoreTable<V>: Default + Send {
    /// Entries held.
    fn len(&self) -> usize;
    /// Whether no entry is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The value of `key`.
    fn get(&self, key: &str) -> Option<&Arc<V>>;
    /// Makes room for a list of `expected` keys (the remote's word: capped by the caller).
    fn reserve_for_list(&mut self, expected: usize);
    /// Marks every entry stale (a list starts).
    fn mark_stale(&mut self);
    /// Stores `value` under `key`; the key is no longer stale.
    fn upsert(&mut self, key: &str, value: V) -> Upserted<'_, V>;
    /// The key is no longer stale, its value unchanged (its new value did not decode).
    fn keep(&mut self, key: &str);
    /// Removes `key`, answering its value.
    fn remove(&mut self, key: &str) -> Option<Arc<V>>;
    /// Removes every entry still stale, calling `each` with its key and value.
    fn remove_stale(&mut self, each: impl FnMut(&str, &Arc<V>));
    /// Removes every entry, calling `each` with its key and value.
    fn drain(&mut self, each: impl FnMut(&str, &Arc<V>));
}

// foldhash: SipHash showed in profiles of large lists; foldhash is seeded per table, so keys a
// remote picks still cannot be aimed at one bucket.
type Hasher = foldhash::fast::RandomState;

struct Slot<V> {
    value: Arc<V>,
    stale: bool,
}

/// Keys kept beside their values; a stale flag per entry.
pub struct ByKey<V> {
    // Boxed keys: 8 bytes less each than Strings.
    map: HashMap<Box<str>, Slot<V>, Hasher>,
}

impl<V> Default for ByKey<V> {
    fn default() -> Self {
        Self {
            map: HashMap::default(),
        }
    }
}

impl<V: PartialEq + Send + Sync> StoreTable<V> for ByKey<V> {
    fn len(&self) -> usize {
        self.map.len()
    }

    fn get(&self, key: &str) -> Option<&Arc<V>> {
        self.map.get(key).map(|slot| &slot.value)
    }

    fn reserve_for_list(&mut self, expected: usize) {
        self.map.reserve(expected.saturating_sub(self.map.len()));
    }

    fn mark_stale(&mut self) {
        for slot in self.map.values_mut() {
            slot.stale = true;
        }
    }

    fn upsert(&mut self, key: &str, value: V) -> Upserted<'_, V> {
        // `entry_ref`: one probe, the owned key built only on insert.
        match self.map.entry_ref(key) {
            EntryRef::Occupied(occupied) => {
                let slot = occupied.into_mut();
                slot.stale = false;
                if *slot.value == value {
                    return Upserted::Unchanged;
                }
                slot.value = Arc::new(value);
                Upserted::Changed(&slot.value)
            }
            EntryRef::Vacant(vacant) => {
                let slot = vacant.insert(Slot {
                    value: Arc::new(value),
                    stale: false,
                });
                Upserted::Created(&slot.value)
            }
        }
    }

    fn keep(&mut self, key: &str) {
        if let Some(slot) = self.map.get_mut(key) {
            slot.stale = false;
        }
    }

    fn remove(&mut self, key: &str) -> Option<Arc<V>> {
        self.map.remove(key).map(|slot| slot.value)
    }

    fn remove_stale(&mut self, mut each: impl FnMut(&str, &Arc<V>)) {
        let stale: Vec<Box<str>> = self
            .map
            .iter()
            .filter(|(_, slot)| slot.stale)
            .map(|(key, _)| key.clone())
            .collect();
        for key in stale {
            if let Some(slot) = self.map.remove(&key) {
                each(&key, &slot.value);
            }
        }
    }

    fn drain(&mut self, mut each: impl FnMut(&str, &Arc<V>)) {
        for (key, slot) in self.map.drain() {
            each(&key, &slot.value);
        }
    }
}

/// Values only, found by the key each names. A list moves the entries it sees from the
/// stale table to the current one, so no entry carries a stale flag (8 bytes a bucket, not
/// 16); what is left in the stale table when the list ends is what the remote deleted.
pub struct ByValue<V> {
    current: HashTable<Arc<V>>,
    stale: HashTable<Arc<V>>,
    hasher: Hasher,
}

impl<V> Default for ByValue<V> {
    fn default() -> Self {
        Self {
            current: HashTable::new(),
            stale: HashTable::new(),
            hasher: Hasher::default(),
        }
    }
}

impl<V: KeyedValue> ByValue<V> {
    // Keys are hashed as bytes, the form values render them in.
    fn hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key.as_bytes())
    }

    /// The hash of a stored value's key, for moves and growth.
    fn rehash(hasher: &Hasher) -> impl Fn(&Arc<V>) -> u64 + '_ {
        |value| value.with_key(|key| hasher.hash_one(key))
    }
}

/// Calls `each` with a removed value's key as text.
fn with_text_key<V: KeyedValue>(value: &Arc<V>, each: &mut impl FnMut(&str, &Arc<V>)) {
    value.with_key(|key| match std::str::from_utf8(key) {
        Ok(key) => each(key, value),
        // Keys come from UTF-8 text; this only keeps a broken value from vanishing unseen.
        Err(_) => each(&String::from_utf8_lossy(key), value),
    });
}

/// Takes `key`'s entry out of `table`.
fn take<V: KeyedValue>(table: &mut HashTable<Arc<V>>, hash: u64, key: &str) -> Option<Arc<V>> {
    if table.is_empty() {
        return None;
    }
    let found = table.find_entry(hash, |v| names(v, key)).ok()?;
    Some(found.remove().0)
}

fn names<V: KeyedValue>(value: &Arc<V>, key: &str) -> bool {
    names_key(&**value, key)
}

fn names_key<V: KeyedValue>(value: &V, key: &str) -> bool {
    value.with_key(|own| own == key.as_bytes())
}

impl<V: KeyedValue + PartialEq + Send + Sync> StoreTable<V> for ByValue<V> {
    fn len(&self) -> usize {
        self.current.len() + self.stale.len()
    }

    fn get(&self, key: &str) -> Option<&Arc<V>> {
        let hash = self.hash(key);
        self.current
            .find(hash, |v| names(v, key))
            .or_else(|| self.stale.find(hash, |v| names(v, key)))
    }

    fn reserve_for_list(&mut self, expected: usize) {
        let additional = expected.saturating_sub(self.current.len());
        self.current.reserve(additional, Self::rehash(&self.hasher));
    }

    fn mark_stale(&mut self) {
        if self.stale.is_empty() {
            std::mem::swap(&mut self.current, &mut self.stale);
            return;
        }
        // A list that failed half way: what it had seen is stale again.
        let rehash = Self::rehash(&self.hasher);
        for value in self.current.drain() {
            self.stale.insert_unique(rehash(&value), value, &rehash);
        }
    }

    fn upsert(&mut self, key: &str, value: V) -> Upserted<'_, V> {
        if !V::KEY_CHECKED_BY_DECODER && !names_key(&value, key) {
            return Upserted::WrongKey;
        }
        let hash = self.hash(key);
        let rehash = Self::rehash(&self.hasher);
        let table = match self.current.find_entry(hash, |v| names(v, key)) {
            Ok(found) => {
                let stored = found.into_mut();
                if **stored == value {
                    return Upserted::Unchanged;
                }
                *stored = Arc::new(value);
                return Upserted::Changed(stored);
            }
            Err(absent) => absent.into_table(),
        };
        match take(&mut self.stale, hash, key) {
            Some(old) if *old == value => {
                table.insert_unique(hash, old, rehash);
                Upserted::Unchanged
            }
            old => {
                let slot = table.insert_unique(hash, Arc::new(value), rehash);
                let slot = slot.into_mut();
                if old.is_some() {
                    Upserted::Changed(slot)
                } else {
                    Upserted::Created(slot)
                }
            }
        }
    }

    fn keep(&mut self, key: &str) {
        let hash = self.hash(key);
        if let Some(value) = take(&mut self.stale, hash, key) {
            let rehash = Self::rehash(&self.hasher);
            self.current.insert_unique(hash, value, rehash);
        }
    }

    fn remove(&mut self, key: &str) -> Option<Arc<V>> {
        let hash = self.hash(key);
        match self.current.find_entry(hash, |v| names(v, key)) {
            Ok(found) => Some(found.remove().0),
            Err(_) => take(&mut self.stale, hash, key),
        }
    }

    fn remove_stale(&mut self, mut each: impl FnMut(&str, &Arc<V>)) {
        // Replaced, not drained: the table a re-list emptied gives its memory back.
        for value in std::mem::take(&mut self.stale) {
            with_text_key(&value, &mut each);
        }
    }

    fn drain(&mut self, mut each: impl FnMut(&str, &Arc<V>)) {
        let current = std::mem::take(&mut self.current);
        let stale = std::mem::take(&mut self.stale);
        for value in current.into_iter().chain(stale) {
            with_text_key(&value, &mut each);
        }
    }
}

#[cfg(test)]
#[path = "store_table_tests.rs"]
mod tests;
