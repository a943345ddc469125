//! The writer of keys under leases (cilium-semantics §8), shared by the apiserver and
//! kvstoremesh: every key under a lease of at most [`MAX_KEYS_PER_LEASE`] keys; a value equal
//! to the one written is not written again; only keys this writer (or the process before it)
//! wrote are deleted; a key whose lease vanished is written again under a new one.
//!
//! A restarted writer [adopts](Writer::adopt) what the one before it wrote: the keys, their
//! values and their leases (which it keeps alive from then on), so writing the same state
//! again writes nothing and a remote reader sees no event at all.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt as _;
use futures::stream::FuturesUnordered;

use crate::{EtcdBackend, KeyWrite, KvstoreError};

// foldhash, not SipHash: a kvstoremesh start hashes every cached key several times, and
// SipHash was a tenth of its CPU (perf); foldhash is seeded per map, so keys a remote picks
// still cannot be aimed at one bucket.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A key and its new value, or `None` for a delete.
pub type KeyChange = (String, Option<Vec<u8>>);

/// etcd's put-with-lease cost grows with the keys on the lease (etcd-io/etcd#15993).
pub const MAX_KEYS_PER_LEASE: usize = 1000;
/// Operations per transaction (etcd's `--max-txn-ops` default is 128).
const OPS_PER_TXN: usize = 128;
/// Write requests (transactions, puts, deletes) in flight at once.
const REQUESTS_IN_FLIGHT: usize = 4;
/// Keys per page when adopting.
const PAGE_SIZE: i64 = 1000;

#[derive(Debug, Clone)]
struct Written {
    value: Vec<u8>,
    lease: i64,
}

/// The writer; see the module docs.
#[derive(Debug)]
pub struct Writer {
    backend: EtcdBackend,
    ttl: Duration,
    written: HashMap<String, Written>,
    /// Keys on each live lease.
    leases: BTreeMap<i64, usize>,
}

impl Writer {
    /// A writer that has written nothing, with leases of `ttl`.
    pub fn new(backend: EtcdBackend, ttl: Duration) -> Self {
        Self {
            backend,
            ttl,
            written: HashMap::default(),
            leases: BTreeMap::new(),
        }
    }

    /// A writer that takes over what is under `prefixes` and at `keys` (see
    /// [`Self::take_over`]). Returns the keys and values found.
    pub async fn adopt(
        backend: EtcdBackend,
        prefixes: &[String],
        keys: &[String],
        ttl: Duration,
    ) -> Result<(Self, BTreeMap<String, Vec<u8>>), KvstoreError> {
        let mut writer = Self::new(backend, ttl);
        let found = writer.take_over(prefixes, keys).await?;
        Ok((writer, found))
    }

    /// Takes over what is under `prefixes` and at `keys`: every key counts as written by this
    /// writer, and the leases holding them are kept alive from now on. Returns the keys and
    /// values found. A key whose lease is already gone is written again on the first
    /// [`Self::keep_alive`].
    pub async fn take_over(
        &mut self,
        prefixes: &[String],
        keys: &[String],
    ) -> Result<BTreeMap<String, Vec<u8>>, KvstoreError> {
        let mut found = BTreeMap::new();
        // A single key is listed as a prefix and kept only on an exact match.
        let ranges = prefixes.iter().map(|p| (p.clone(), false));
        for (prefix, exact) in ranges.chain(keys.iter().map(|k| (k.clone(), true))) {
            let mut pages = self.backend.list(&prefix, PAGE_SIZE);
            while let Some(page) = pages.recv().await {
                for kv in page?.kvs() {
                    if exact && kv.key() != prefix.as_bytes() {
                        continue;
                    }
                    let lease = kv.lease();
                    let (key, value) = (kv.key(), kv.value().to_vec());
                    let key = String::from_utf8_lossy(key).into_owned();
                    if self.written.contains_key(&key) {
                        continue;
                    }
                    *self.leases.entry(lease).or_default() += 1;
                    self.written.insert(
                        key.clone(),
                        Written {
                            value: value.clone(),
                            lease,
                        },
                    );
                    found.insert(key, value);
                }
            }
        }
        Ok(found)
    }

    /// Writes `changes` (a value, or `None` for a delete). Unchanged values and deletes of
    /// keys never written are skipped. On an error nothing is recorded, so the same changes
    /// can be applied again. Returns the operations sent.
    pub async fn apply(&mut self, changes: &[KeyChange]) -> Result<usize, KvstoreError> {
        // The last change of each key.
        let mut last: HashMap<&String, usize> =
            HashMap::with_capacity_and_hasher(changes.len(), Default::default());
        for (i, (key, _)) in changes.iter().enumerate() {
            last.insert(key, i);
        }
        let mut writes = Vec::new();
        let mut puts = 0;
        for (i, (key, value)) in changes.iter().enumerate() {
            if last.get(key) != Some(&i) {
                continue;
            }
            match (value, self.written.get(key)) {
                (Some(value), Some(written)) if written.value == *value && written.lease != 0 => {}
                (Some(value), _) => {
                    puts += 1;
                    writes.push((key, Some(value)));
                }
                (None, Some(_)) => writes.push((key, None)),
                (None, None) => {}
            }
        }
        if writes.is_empty() {
            return Ok(0);
        }
        let mut leases = self.leases_for(puts).await?.into_iter();
        let batch: Vec<KeyWrite> = writes
            .iter()
            .map(|(key, value)| match value {
                Some(value) => KeyWrite::Put {
                    key: (*key).clone(),
                    value: (*value).clone(),
                    lease: leases.next().expect("one lease per put"),
                },
                None => KeyWrite::Delete {
                    key: (*key).clone(),
                },
            })
            .collect();
        // Requests in flight together: etcd commits concurrent proposals in one raft batch.
        // Each key is in one request only (`changes` may name a key twice: the last value
        // wins), so their order does not matter. A few writes go as single puts and deletes,
        // whose latency tail etcd keeps shorter than a transaction's.
        let part = if batch.len() <= REQUESTS_IN_FLIGHT {
            1
        } else {
            OPS_PER_TXN
        };
        // After a failure nothing more is sent, but what is in flight is waited for: a
        // request dropped on the way could still land after the retry's.
        let parts = batch.len().div_ceil(part);
        let mut landed: Vec<Option<bool>> = vec![None; parts];
        let mut failure = None;
        let mut next = 0;
        let mut in_flight = FuturesUnordered::new();
        loop {
            while failure.is_none() && in_flight.len() < REQUESTS_IN_FLIGHT && next < parts {
                let end = ((next + 1) * part).min(batch.len());
                in_flight.push(write_part(&self.backend, next, &batch[next * part..end]));
                next += 1;
            }
            match in_flight.next().await {
                Some((i, Ok(()))) => landed[i] = Some(true),
                Some((i, Err(err))) => {
                    landed[i] = Some(false);
                    failure.get_or_insert(err);
                }
                None => break,
            }
        }
        drop(in_flight);
        self.written.reserve(puts);
        for (i, write) in batch.into_iter().enumerate() {
            match landed[i / part] {
                Some(true) => self.record(write),
                // It may or may not have landed: the next write of the key goes to etcd.
                Some(false) => self.mark_unknown(write),
                None => {}
            }
        }
        if let Some(err) = failure {
            return Err(err);
        }
        Ok(writes.len())
    }

    /// Refreshes every lease; the keys of a lease that no longer exists are written again
    /// under new ones. Returns how many keys were written again.
    pub async fn keep_alive(&mut self) -> Result<usize, KvstoreError> {
        let mut lost = Vec::new();
        for &lease in self.leases.keys() {
            // Lease 0 holds the keys adopted without a lease: written again, under one.
            if lease == 0 || !self.backend.lease_keep_alive_once(lease).await? {
                lost.push(lease);
            }
        }
        if lost.is_empty() {
            return Ok(0);
        }
        let rewrite: Vec<KeyChange> = self
            .written
            .iter()
            .filter(|(_, w)| lost.contains(&w.lease))
            .map(|(key, w)| (key.clone(), Some(w.value.clone())))
            .collect();
        for lease in &lost {
            tracing::warn!(
                lease = format!("{lease:x}"),
                "a lease vanished; writing its keys again"
            );
            self.leases.remove(lease);
        }
        // Counted under lease 0 until rewritten, so a failed rewrite is tried again on the
        // next keep-alive.
        for (key, _) in &rewrite {
            if let Some(written) = self.written.get_mut(key) {
                written.lease = 0;
                *self.leases.entry(0).or_default() += 1;
            }
        }
        self.apply(&rewrite).await
    }

    /// The etcd connection (for the keys written without a lease).
    pub fn backend(&self) -> &EtcdBackend {
        &self.backend
    }

    /// Writes through `backend` from now on: another connection to the same etcd.
    pub fn set_backend(&mut self, backend: EtcdBackend) {
        self.backend = backend;
    }

    /// Forgets what was written at `key`, so the next write of it goes to etcd even when
    /// the value is the same (someone else changed or deleted the key).
    pub fn forget(&mut self, key: &str) {
        if let Some(old) = self.written.remove(key) {
            self.forget_lease_key(old.lease);
        }
    }

    /// Keys written now.
    pub fn len(&self) -> usize {
        self.written.len()
    }

    /// Nothing is written.
    pub fn is_empty(&self) -> bool {
        self.written.is_empty()
    }

    /// Live leases and the keys on each.
    pub fn lease_usage(&self) -> Vec<(i64, usize)> {
        self.leases.iter().map(|(l, n)| (*l, *n)).collect()
    }

    /// The value written at `key`.
    pub fn written(&self, key: &str) -> Option<&[u8]> {
        self.written.get(key).map(|w| w.value.as_slice())
    }

    /// A lease for each of `puts` new keys: the existing ones with room first, then new ones.
    async fn leases_for(&mut self, puts: usize) -> Result<Vec<i64>, KvstoreError> {
        let mut out = Vec::with_capacity(puts);
        let mut room: Vec<(i64, usize)> = self
            .leases
            .iter()
            .filter(|(lease, n)| **lease != 0 && **n < MAX_KEYS_PER_LEASE)
            .map(|(lease, n)| (*lease, MAX_KEYS_PER_LEASE - n))
            .collect();
        // The leases still needed, granted together: one round trip, not one each (a
        // kvstoremesh start needs one per thousand keys, and waited for each in turn).
        let free: usize = room.iter().map(|(_, free)| free).sum();
        let missing = puts.saturating_sub(free).div_ceil(MAX_KEYS_PER_LEASE);
        let ttl = i64::try_from(self.ttl.as_secs()).unwrap_or(i64::MAX);
        let granted =
            futures::future::try_join_all((0..missing).map(|_| self.backend.lease_grant(ttl)))
                .await?;
        for &lease in &granted {
            self.leases.entry(lease).or_default();
        }
        // Leases with room first (taken from the end), then the new ones, as before.
        let mut fresh: Vec<(i64, usize)> = granted
            .into_iter()
            .rev()
            .map(|lease| (lease, MAX_KEYS_PER_LEASE))
            .collect();
        fresh.append(&mut room);
        let mut room = fresh;
        while out.len() < puts {
            let (lease, free) = room.pop().expect("leases granted for every put");
            let take = free.min(puts - out.len());
            out.extend(std::iter::repeat_n(lease, take));
        }
        Ok(out)
    }

    fn record(&mut self, write: KeyWrite) {
        match write {
            KeyWrite::Put { key, value, lease } => {
                *self.leases.entry(lease).or_default() += 1;
                if let Some(old) = self.written.insert(key, Written { value, lease }) {
                    self.forget_lease_key(old.lease);
                }
            }
            KeyWrite::Delete { key } => {
                if let Some(old) = self.written.remove(&key) {
                    self.forget_lease_key(old.lease);
                }
            }
        }
    }

    /// A write whose request failed: the key is kept as written under no lease, so a later
    /// put is sent even with the same value, and a later delete is sent too.
    fn mark_unknown(&mut self, write: KeyWrite) {
        match write {
            KeyWrite::Put { key, value, .. } => {
                // Under lease 0, the next keep-alive writes it again if nothing else has.
                *self.leases.entry(0).or_default() += 1;
                if let Some(old) = self.written.insert(key, Written { value, lease: 0 }) {
                    self.forget_lease_key(old.lease);
                }
            }
            KeyWrite::Delete { key } => {
                let old = self
                    .written
                    .get_mut(&key)
                    .map(|w| std::mem::replace(&mut w.lease, 0));
                if let Some(old) = old {
                    self.forget_lease_key(old);
                }
            }
        }
    }

    fn forget_lease_key(&mut self, lease: i64) {
        if let Some(n) = self.leases.get_mut(&lease) {
            *n = n.saturating_sub(1);
        }
    }
}

/// Writes part `i`: one key as a plain put or delete, more in transactions.
async fn write_part(
    backend: &EtcdBackend,
    i: usize,
    part: &[KeyWrite],
) -> (usize, Result<(), KvstoreError>) {
    let written = match part {
        [KeyWrite::Put { key, value, lease }] if *lease != 0 => {
            backend.put_with_lease(key, value.clone(), *lease).await
        }
        [KeyWrite::Delete { key }] => backend.delete(key).await.map(drop),
        _ => backend.write_batch(part, OPS_PER_TXN).await.map(drop),
    };
    (i, written)
}
