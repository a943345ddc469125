//! Shared helpers for tests against real etcd servers started by the lab.

#![allow(dead_code, missing_docs)]

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use meshwork_kvstore::store_table::{ByKey, ByValue, StoreTable};
use meshwork_kvstore::{
    DecodeError, Decoder, EtcdBackend, EtcdConfig, Observer, StoreStatus, WatchStore,
    WatchStoreOptions,
};
use meshwork_lab::etcd::EtcdServer;
use meshwork_types::KeyedValue;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long a test waits for an expected event before failing.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "meshwork_kvstore=debug".into()),
        )
        .with_test_writer()
        .try_init();
}

pub async fn connect(server: &EtcdServer) -> EtcdBackend {
    EtcdBackend::connect(
        &EtcdConfig::new([server.endpoint()]),
        Duration::from_secs(10),
    )
    .await
    .expect("connect to the lab etcd")
}

/// What a test observes, in order: store events and callback runs share one channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    Upsert(String, String),
    Delete(String, String),
    Callback(&'static str),
}

pub fn upsert(key: &str, value: &str) -> Seen {
    Seen::Upsert(key.to_owned(), value.to_owned())
}

pub fn delete(key: &str, value: &str) -> Seen {
    Seen::Delete(key.to_owned(), value.to_owned())
}

/// Decodes UTF-8 text; values starting with `bad` are rejected like a failed validation.
#[derive(Debug, Clone, Copy)]
pub struct TextDecoder;

impl Decoder for TextDecoder {
    type Value = String;

    fn decode(&self, _key: &str, value: &[u8]) -> Result<String, DecodeError> {
        let text = std::str::from_utf8(value).map_err(|e| DecodeError::Malformed(e.to_string()))?;
        if text.starts_with("bad") {
            return Err(DecodeError::Invalid(format!("rejected value {text:?}")));
        }
        Ok(text.to_owned())
    }
}

/// Text that names the key it was read under, for stores that keep values by their key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedText {
    key: String,
    text: String,
}

impl KeyedValue for KeyedText {
    fn with_key<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        f(self.key.as_bytes())
    }
}

impl fmt::Display for KeyedText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// [`TextDecoder`], keeping the key in the value.
#[derive(Debug, Clone, Copy)]
pub struct KeyedTextDecoder;

impl Decoder for KeyedTextDecoder {
    type Value = KeyedText;

    fn decode(&self, key: &str, value: &[u8]) -> Result<KeyedText, DecodeError> {
        Ok(KeyedText {
            key: key.to_owned(),
            text: TextDecoder.decode(key, value)?,
        })
    }
}

/// Forwards every event into a channel.
pub struct Recorder {
    pub tx: mpsc::UnboundedSender<Seen>,
}

impl<V: fmt::Display + Send + Sync> Observer<V> for Recorder {
    fn on_upsert(&mut self, key: &str, value: &Arc<V>) {
        let _ = self
            .tx
            .send(Seen::Upsert(key.to_owned(), value.to_string()));
    }

    fn on_delete(&mut self, key: &str, value: &Arc<V>) {
        let _ = self
            .tx
            .send(Seen::Delete(key.to_owned(), value.to_string()));
    }
}

/// Which table a text store keeps its entries in: the store tests run on both.
pub trait Kind: 'static {
    type Decoder: Decoder<Value: fmt::Display>;
    type Table: StoreTable<<Self::Decoder as Decoder>::Value> + 'static;

    fn store<O: Observer<<Self::Decoder as Decoder>::Value>>(
        observer: O,
        options: WatchStoreOptions,
    ) -> WatchStore<Self::Decoder, O, Self::Table>;
}

/// Keys beside values ([`WatchStore::new`]).
pub struct TextByKey;

impl Kind for TextByKey {
    type Decoder = TextDecoder;
    type Table = ByKey<String>;

    fn store<O: Observer<String>>(observer: O, options: WatchStoreOptions) -> TextStore<O> {
        WatchStore::new(TextDecoder, observer, options)
    }
}

/// Values that name their keys ([`WatchStore::keyed_by_value`]).
pub struct TextByValue;

impl Kind for TextByValue {
    type Decoder = KeyedTextDecoder;
    type Table = ByValue<KeyedText>;

    fn store<O: Observer<KeyedText>>(
        observer: O,
        options: WatchStoreOptions,
    ) -> WatchStore<KeyedTextDecoder, O, ByValue<KeyedText>> {
        WatchStore::keyed_by_value(KeyedTextDecoder, observer, options)
    }
}

pub type TextStore<O = Recorder> = WatchStore<TextDecoder, O>;
pub type KindStore<K, O = Recorder> = WatchStore<<K as Kind>::Decoder, O, <K as Kind>::Table>;

/// Retries quickly, so tests that break etcd do not wait.
pub fn fast_retry(source: &str) -> WatchStoreOptions {
    let mut options = WatchStoreOptions::new(source);
    options.min_retry_delay = Duration::from_millis(20);
    options.max_retry_delay = Duration::from_millis(200);
    options
}

pub fn text_store(source: &str) -> (TextStore, mpsc::UnboundedReceiver<Seen>) {
    kind_store::<TextByKey>(source)
}

/// A store of kind `K` whose events go into the returned channel.
pub fn kind_store<K: Kind>(source: &str) -> (KindStore<K>, mpsc::UnboundedReceiver<Seen>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (K::store(Recorder { tx }, fast_retry(source)), rx)
}

/// A store watching in a task; `stop` cancels it and hands the store back.
pub struct Running<D: Decoder, O: Observer<D::Value> + 'static, T = ByKey<<D as Decoder>::Value>> {
    cancel: CancellationToken,
    task: JoinHandle<WatchStore<D, O, T>>,
}

impl<D, O, T> Running<D, O, T>
where
    D: Decoder,
    O: Observer<D::Value> + 'static,
    T: StoreTable<D::Value> + 'static,
{
    pub fn start(mut store: WatchStore<D, O, T>, backend: &EtcdBackend, prefix: &str) -> Self {
        let cancel = CancellationToken::new();
        let token = cancel.clone();
        let backend = backend.clone();
        let prefix = prefix.to_owned();
        let task = tokio::spawn(async move {
            store.watch(&backend, &prefix, &token).await;
            store
        });
        Self { cancel, task }
    }

    pub async fn stop(self) -> WatchStore<D, O, T> {
        self.cancel.cancel();
        tokio::time::timeout(EVENT_TIMEOUT, self.task)
            .await
            .expect("the watch store stops promptly when cancelled")
            .expect("the watch task does not panic")
    }
}

pub async fn next(rx: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
    tokio::time::timeout(EVENT_TIMEOUT, rx.recv())
        .await
        .expect("an event arrives before the deadline")
        .expect("the channel is open")
}

/// Collects `n` events and returns them sorted (for lists that come out of a map).
pub async fn next_n_sorted(rx: &mut mpsc::UnboundedReceiver<Seen>, n: usize) -> Vec<Seen> {
    let mut seen = Vec::with_capacity(n);
    for _ in 0..n {
        seen.push(next(rx).await);
    }
    seen.sort_by_key(|s| format!("{s:?}"));
    seen
}

/// Waits until the store's live status satisfies `done`; fails showing the status last seen.
pub async fn status_until(
    what: &str,
    status: &Arc<StoreStatus>,
    done: impl Fn(&StoreStatus) -> bool,
) {
    meshwork_lab::wait::eventually_async(
        what,
        || std::future::ready(Arc::clone(status)),
        |s| done(s),
    )
    .await;
}

/// Asserts that nothing more is queued right now (used after a marker event that follows
/// everything that could have come before it).
pub fn assert_drained(rx: &mut mpsc::UnboundedReceiver<Seen>) {
    if let Ok(extra) = rx.try_recv() {
        panic!("unexpected extra event {extra:?}");
    }
}

/// A TLS etcd server (etcd auth by client-certificate CN).
pub fn tls_etcd() -> EtcdServer {
    EtcdServer::start_with(meshwork_lab::etcd::EtcdOptions {
        tls: true,
        ..meshwork_lab::etcd::EtcdOptions::default()
    })
    .expect("start a TLS etcd")
}

/// A connection to TLS `etcd` as a new user `name` with `access` to `prefix`.
pub async fn connect_as(
    etcd: &EtcdServer,
    name: &str,
    prefix: &str,
    access: meshwork_lab::etcd::Access,
) -> EtcdBackend {
    let tls = etcd.tls().expect("a TLS etcd").clone();
    let user = etcd.add_user(name, prefix, access).expect("add the user");
    let config = EtcdConfig {
        endpoints: vec![etcd.endpoint()],
        trusted_ca_file: Some(tls.ca_file),
        cert_file: Some(user.cert_file),
        key_file: Some(user.key_file),
    };
    EtcdBackend::connect(&config, Duration::from_secs(10))
        .await
        .expect("connect as the user")
}
