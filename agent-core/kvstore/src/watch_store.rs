//! The restartable watch store: Cilium's `restartableWatchStore`.
//!
//! A store mirrors one prefix of one cluster into an [`Observer`]. [`WatchStore::watch`] may
//! run many times, one after another (a reconnect to the same cluster runs it again with a
//! new backend). Each run marks every known key stale, lists the prefix and then follows it
//! from the list's revision + 1; at the end of the list, keys still stale get a delete. The
//! first completed list of the store's life also tells the observer, in-band after the
//! list's events ([`Observer::on_list_done`]), marks the store listed and runs the on-sync
//! callbacks in registration order, before any later event; neither happens again.
//!
//! Within a run, a compaction or a broken watch triggers a fresh list (stale marking and
//! deletes as above) without announcing a second list-done. An entry that fails to decode or
//! validate is logged, counted and dropped; the key keeps its previous value.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use meshwork_types::KeyedValue;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::etcd::{DEFAULT_PAGE_SIZE, EtcdBackend, ListPage, WatchEvent};
use super::keys::{scope_of, with_trailing_slash};
use super::metrics::{KvstoreMetrics, PrefixLabels, SyncLabels};
use super::store_table::{ByKey, ByValue, StoreTable, Upserted};
use super::{Decoder, KvstoreError};

/// Receives the store's events, synchronously and in order.
pub trait Observer<V>: Send {
    /// A key's value changed (or, unless [`Observer::on_create`] is overridden, was created).
    fn on_upsert(&mut self, key: &str, value: &Arc<V>);
    /// A key the store did not hold appeared. Defaults to [`Observer::on_upsert`].
    fn on_create(&mut self, key: &str, value: &Arc<V>) {
        self.on_upsert(key, value);
    }
    /// A key was deleted (or found stale); `value` is its last value.
    fn on_delete(&mut self, key: &str, value: &Arc<V>);
    /// The store's first list is complete: called once in the store's life, after that
    /// list's last event and its stale deletes and before any later event; a flush follows.
    fn on_list_done(&mut self) {}
    /// The end of a batch (a list page, a watch response, the stale deletes, a drain): an
    /// observer that buffers hands on what it holds. Always called before on-sync callbacks.
    fn flush(&mut self) {}
}

/// A callback run once, when the store completes its first list.
pub type OnSync = Box<dyn FnOnce() + Send>;

/// Live status of a store, readable while it watches.
#[derive(Debug, Default)]
pub struct StoreStatus {
    listed: AtomicBool,
    entries: AtomicU64,
    decode_errors: AtomicU64,
    relists: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl StoreStatus {
    /// Whether the store has listed its prefix in the current run and is watching it.
    pub fn listed(&self) -> bool {
        self.listed.load(Ordering::Acquire)
    }

    /// Number of entries the store holds.
    pub fn entries(&self) -> u64 {
        self.entries.load(Ordering::Relaxed)
    }

    /// Entries dropped because they failed to decode or validate.
    pub fn decode_errors(&self) -> u64 {
        self.decode_errors.load(Ordering::Relaxed)
    }

    /// Lists done after the first one of a run (compactions, broken watches).
    pub fn relists(&self) -> u64 {
        self.relists.load(Ordering::Relaxed)
    }

    /// The last etcd error the store hit, if any.
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set_error(&self, error: Option<String>) {
        *self
            .last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = error;
    }
}

/// Tuning of a watch store.
#[derive(Debug, Clone)]
pub struct WatchStoreOptions {
    /// The cluster the data comes from (logs and metric labels).
    pub source: String,
    /// Keys per list page.
    pub page_size: i64,
    /// First delay before retrying after an etcd error.
    pub min_retry_delay: Duration,
    /// Longest delay between retries.
    pub max_retry_delay: Duration,
    /// Metric handles.
    pub metrics: KvstoreMetrics,
}

impl WatchStoreOptions {
    /// Defaults for data coming from `source`.
    pub fn new(source: impl Into<String>) -> Self {
        Self {
            source: source.into(),
            page_size: DEFAULT_PAGE_SIZE,
            min_retry_delay: Duration::from_millis(100),
            max_retry_delay: Duration::from_secs(10),
            metrics: KvstoreMetrics::default(),
        }
    }
}

/// Most entries a list may pre-size a store for.
const MAX_PRESIZE: usize = 4 << 20;

/// A restartable watch store of one prefix; see the module docs. `T` is where it keeps its
/// entries: [`ByKey`] for any decoder ([`WatchStore::new`]), [`ByValue`] for values that name
/// their own key ([`WatchStore::keyed_by_value`]).
pub struct WatchStore<D: Decoder, O: Observer<D::Value>, T = ByKey<<D as Decoder>::Value>> {
    decoder: D,
    observer: O,
    state: T,
    on_sync: Vec<OnSync>,
    /// The observer has been told of the first list-done.
    announced: bool,
    /// A snapshot of the prefix read along with something else (see [`Self::list_ahead`]).
    listed_ahead: Option<ListPage>,
    status: Arc<StoreStatus>,
    options: WatchStoreOptions,
}

enum RunEnd {
    Cancelled,
    Failed(KvstoreError),
}

impl<D: Decoder, O: Observer<D::Value>> WatchStore<D, O> {
    /// A store that decodes with `decoder` and reports to `observer`.
    pub fn new(decoder: D, observer: O, options: WatchStoreOptions) -> Self {
        Self::with_table(decoder, observer, options)
    }
}

impl<D, O> WatchStore<D, O, ByValue<D::Value>>
where
    D: Decoder<Value: KeyedValue>,
    O: Observer<D::Value>,
{
    /// A store like [`WatchStore::new`] that keeps values without their keys, for a decoder
    /// whose values name the key they were accepted under (the ipcache's).
    pub fn keyed_by_value(decoder: D, observer: O, options: WatchStoreOptions) -> Self {
        Self::with_table(decoder, observer, options)
    }
}

impl<D: Decoder, O: Observer<D::Value>, T: StoreTable<D::Value>> WatchStore<D, O, T> {
    fn with_table(decoder: D, observer: O, options: WatchStoreOptions) -> Self {
        Self {
            decoder,
            observer,
            state: T::default(),
            on_sync: Vec::new(),
            announced: false,
            listed_ahead: None,
            status: Arc::default(),
            options,
        }
    }

    /// Makes the next list `page` instead of a read from etcd: the whole prefix, read in
    /// the same transaction as something else (a remote's canaries with its cluster config),
    /// so the server opens one read transaction for both. The watch follows from the page's
    /// revision; a re-list after an error reads etcd.
    pub fn list_ahead(&mut self, page: ListPage) {
        self.listed_ahead = Some(page);
    }

    /// Registers a callback for the end of the first list. Callbacks run in registration
    /// order, before any event that follows the list.
    pub fn on_sync(&mut self, callback: impl FnOnce() + Send + 'static) {
        self.on_sync.push(Box::new(callback));
    }

    /// The store's live status.
    pub fn status(&self) -> Arc<StoreStatus> {
        Arc::clone(&self.status)
    }

    /// The observer (to inspect it in tests and tools).
    pub fn observer(&self) -> &O {
        &self.observer
    }

    /// The current value of `key` (relative to the prefix).
    pub fn get(&self, key: &str) -> Option<&Arc<D::Value>> {
        self.state.get(key)
    }

    /// Number of entries held.
    pub fn len(&self) -> usize {
        self.state.len()
    }

    /// Whether the store holds no entry.
    pub fn is_empty(&self) -> bool {
        self.state.is_empty()
    }

    /// Lists and follows `prefix` through `backend` until `cancel` fires. etcd errors are
    /// retried with backoff (each retry lists again); they never end the run.
    pub async fn watch(&mut self, backend: &EtcdBackend, prefix: &str, cancel: &CancellationToken) {
        let prefix = with_trailing_slash(prefix);
        let sync_gauge = self
            .options
            .metrics
            .initial_sync_completed
            .get_or_create(&SyncLabels {
                scope: scope_of(&prefix),
                source: self.options.source.clone(),
                action: "read".to_owned(),
            })
            .clone();
        sync_gauge.set(0);
        tracing::info!(source = %self.options.source, %prefix, "starting watch store");
        let mut backoff = self.backoff();
        let mut listed_in_run = false;
        loop {
            match self
                .run_once(backend, &prefix, cancel, &mut listed_in_run)
                .await
            {
                RunEnd::Cancelled => break,
                RunEnd::Failed(err) => {
                    tracing::warn!(source = %self.options.source, %prefix, %err,
                        "watch store lost its list or watch; listing again");
                    self.status.set_error(Some(err.to_string()));
                    if listed_in_run {
                        self.status.relists.fetch_add(1, Ordering::Relaxed);
                    }
                    let delay = backoff.next().unwrap_or(self.options.max_retry_delay);
                    tokio::select! {
                        () = cancel.cancelled() => break,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
        self.status.listed.store(false, Ordering::Release);
        sync_gauge.set(0);
        tracing::info!(source = %self.options.source, %prefix, "stopped watch store");
    }

    fn backoff(&self) -> impl Iterator<Item = Duration> + use<D, O, T> {
        ExponentialBuilder::default()
            .with_min_delay(self.options.min_retry_delay)
            .with_max_delay(self.options.max_retry_delay)
            .with_jitter()
            .without_max_times()
            .build()
    }

    /// One list followed by a watch; returns when cancelled or on the first etcd error.
    async fn run_once(
        &mut self,
        backend: &EtcdBackend,
        prefix: &str,
        cancel: &CancellationToken,
        listed_in_run: &mut bool,
    ) -> RunEnd {
        self.state.mark_stale();
        let revision = match self.list(backend, prefix, cancel).await {
            Ok(Some(revision)) => revision,
            Ok(None) => return RunEnd::Cancelled,
            Err(err) => return RunEnd::Failed(err),
        };
        self.delete_stale();
        if !*listed_in_run {
            *listed_in_run = true;
            self.list_done(prefix);
        }
        self.status.set_error(None);
        match self.follow(backend, prefix, revision + 1, cancel).await {
            Ok(()) => RunEnd::Cancelled,
            Err(err) => RunEnd::Failed(err),
        }
    }

    /// Lists the prefix into the state; `Ok(None)` when cancelled.
    async fn list(
        &mut self,
        backend: &EtcdBackend,
        prefix: &str,
        cancel: &CancellationToken,
    ) -> Result<Option<i64>, KvstoreError> {
        let mut pages = match self.listed_ahead.take() {
            Some(page) => {
                let (tx, rx) = mpsc::channel(1);
                let _ = tx.try_send(Ok(page));
                rx
            }
            None => backend.list(prefix, self.options.page_size),
        };
        let mut revision = 0;
        let mut first = true;
        loop {
            let page = tokio::select! {
                () = cancel.cancelled() => return Ok(None),
                page = pages.recv() => page,
            };
            let Some(page) = page else {
                return Ok(Some(revision));
            };
            let page = page?;
            revision = page.revision;
            if std::mem::take(&mut first) {
                // Grown once to the list's size rather than rehashed as it doubles; capped,
                // since the count is the remote's word.
                let expected = usize::try_from(page.remaining)
                    .unwrap_or(0)
                    .min(MAX_PRESIZE);
                self.state.reserve_for_list(expected);
            }
            for kv in page.kvs() {
                self.upsert(prefix, kv.key(), kv.value(), kv.mod_revision());
            }
            self.observer.flush();
        }
    }

    /// Applies watch events until cancelled or the watch breaks.
    async fn follow(
        &mut self,
        backend: &EtcdBackend,
        prefix: &str,
        from_revision: i64,
        cancel: &CancellationToken,
    ) -> Result<(), KvstoreError> {
        let mut watch = tokio::select! {
            () = cancel.cancelled() => return Ok(()),
            watch = backend.watch(prefix, from_revision) => watch?,
        };
        loop {
            let batch = tokio::select! {
                () = cancel.cancelled() => return Ok(()),
                batch = watch.next() => batch?,
            };
            let Some(events) = batch else {
                return Err(KvstoreError::WatchClosed(prefix.to_owned()));
            };
            for event in events {
                match event {
                    WatchEvent::Put {
                        key,
                        value,
                        mod_revision,
                    } => self.upsert(prefix, &key, &value, mod_revision),
                    WatchEvent::Delete { key, .. } => {
                        if let Some(key) = relative_key(prefix, &key) {
                            self.delete(key);
                        }
                    }
                }
            }
            self.observer.flush();
        }
    }

    fn list_done(&mut self, prefix: &str) {
        self.status.listed.store(true, Ordering::Release);
        self.options
            .metrics
            .initial_sync_completed
            .get_or_create(&SyncLabels {
                scope: scope_of(prefix),
                source: self.options.source.clone(),
                action: "read".to_owned(),
            })
            .set(1);
        tracing::debug!(source = %self.options.source, prefix, entries = self.state.len(),
            "initial list done");
        if !std::mem::replace(&mut self.announced, true) {
            self.observer.on_list_done();
            self.observer.flush();
        }
        for callback in self.on_sync.drain(..) {
            callback();
        }
    }

    fn upsert(&mut self, prefix: &str, key: &[u8], value: &[u8], mod_revision: i64) {
        let Some(key) = relative_key(prefix, key) else {
            self.reject(prefix, &String::from_utf8_lossy(key), "key is not UTF-8");
            return;
        };
        let held = self.state.len() as u64;
        match self.decoder.decode_at(key, value, mod_revision) {
            Ok(decoded) => match self.state.upsert(key, decoded) {
                Upserted::Unchanged => {}
                Upserted::Changed(value) => self.observer.on_upsert(key, value),
                Upserted::Created(value) => {
                    // Count before notifying, so an observer never sees a stale count.
                    self.status.entries.store(held + 1, Ordering::Relaxed);
                    self.observer.on_create(key, value);
                }
                Upserted::WrongKey => {
                    self.state.keep(key);
                    self.reject(prefix, key, "the value names another key");
                }
            },
            Err(err) => {
                // The key still exists in etcd: keep its old value, and do not let the
                // end of a list delete it.
                self.state.keep(key);
                self.reject(prefix, key, &err.to_string());
            }
        }
    }

    fn reject(&self, prefix: &str, key: &str, reason: &str) {
        tracing::warn!(source = %self.options.source, prefix, key, reason,
            "dropping kvstore entry that failed to decode or validate");
        self.status.decode_errors.fetch_add(1, Ordering::Relaxed);
        self.options
            .metrics
            .decode_errors
            .get_or_create(&PrefixLabels {
                prefix: prefix.to_owned(),
            })
            .inc();
    }

    fn delete(&mut self, key: &str) {
        match self.state.remove(key) {
            Some(value) => {
                self.count_entries();
                self.observer.on_delete(key, &value);
            }
            None => tracing::debug!(source = %self.options.source, key,
                "delete of an unknown key ignored"),
        }
    }

    fn delete_stale(&mut self) {
        let (status, observer) = (&self.status, &mut self.observer);
        self.state.remove_stale(|key, value| {
            // Counted before notifying, as every delete is.
            status.entries.fetch_sub(1, Ordering::Relaxed);
            observer.on_delete(key, value);
        });
        self.observer.flush();
    }

    /// Emits a delete for every known key and forgets them all. Used when a cluster is
    /// removed; `&mut self` guarantees no watch is running meanwhile.
    pub fn drain(&mut self) {
        tracing::info!(source = %self.options.source, entries = self.state.len(),
            "draining watch store");
        self.status.entries.store(0, Ordering::Relaxed);
        let observer = &mut self.observer;
        self.state
            .drain(|key, value| observer.on_delete(key, value));
        self.observer.flush();
    }

    fn count_entries(&self) {
        self.status
            .entries
            .store(self.state.len() as u64, Ordering::Relaxed);
    }
}

// The whole key is checked: checking the short rest alone measured slower (the standard
// check takes a long key a word at a time, a short one a byte at a time).
fn relative_key<'k>(prefix: &str, key: &'k [u8]) -> Option<&'k str> {
    std::str::from_utf8(key).ok()?.strip_prefix(prefix)
}
