//! The etcd backend: connection, paginated lists, leases; watches in [`watch`].
//!
//! Lists are paginated so that no response exceeds the client's 4 MiB decode limit (100k
//! ipcache keys are about 15 MB): every page after the first reads at the first page's
//! revision, so a list is one consistent snapshot, and the next page is fetched while the
//! caller decodes the current one. A page that still comes back too large is asked for again
//! with half the limit. Pages are read through a codec of our own (see [`range`]): a page is
//! the response as it came, not a vector per key and value.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KvClient, PutOptions, Txn, TxnOp,
    TxnOpResponse,
};
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};

use super::keys::prefix_range_end;
use super::{EtcdConfig, KvstoreError};

mod range;
mod read_batch;
mod watch;

use read_batch::{Read, ReadBatcher};

pub use range::{KeyValueRef, ListPage};
pub(crate) use watch::{WATCH_DECODE_LIMIT, events_of};
pub use watch::{Watch, WatchEvent};

/// Keys per list page unless the caller says otherwise.
pub const DEFAULT_PAGE_SIZE: i64 = 1000;
/// Deadline of unary requests (watches are streams and have none).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// HTTP/2 ping interval and how long an unanswered ping may wait.
const KEEPALIVE: Duration = Duration::from_secs(5);

/// A connection to one etcd cluster. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct EtcdBackend {
    client: Client,
    /// What it was connected with, to open another connection to the same etcd.
    config: Arc<EtcdConfig>,
    /// The channel `client` runs on, for the calls made through our own codecs.
    channel: Channel,
    endpoints: String,
    /// Set by [`EtcdBackend::with_shared_watches`].
    hubs: Arc<[watch::HubSlot]>,
    /// Range calls in flight on this connection (see [`RANGES_IN_FLIGHT`]).
    ranges: Arc<tokio::sync::Semaphore>,
    /// Set by [`EtcdBackend::with_batched_reads`].
    reads: Option<Arc<ReadBatcher>>,
}

/// At most this many `Range` calls wait on one connection at a time: an agent behind
/// kvstoremesh lists a thousand prefixes at once, and every answer in flight is a response
/// buffer held.
pub const RANGES_IN_FLIGHT: usize = 16;

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.endpoints)
            .finish_non_exhaustive()
    }
}

/// What [`EtcdBackend::get_all_and_list`] read, all at one revision.
#[derive(Debug)]
pub struct TxnRead {
    /// Each key's value (`None`: absent), in the order asked.
    pub values: Vec<Option<Vec<u8>>>,
    /// The prefix's keys, when they all fit in the limit (`None` when there are more).
    pub listed: Option<ListPage>,
    /// The revision of the read.
    pub revision: i64,
}

/// One write of [`EtcdBackend::write_batch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyWrite {
    /// Put `value` at `key`, attached to `lease` (0: no lease).
    Put {
        /// The key.
        key: String,
        /// The value.
        value: Vec<u8>,
        /// The lease ID; 0 for none.
        lease: i64,
    },
    /// Delete `key`.
    Delete {
        /// The key.
        key: String,
    },
}

/// What [`EtcdBackend::put_if_mod_revision`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConditionalPut {
    /// The key was at the expected mod revision and now holds the new value.
    Written {
        /// The revision of the write: the key's new mod revision.
        revision: i64,
    },
    /// The key was not at the expected mod revision; nothing was written.
    Conflict {
        /// The key's value and mod revision as the transaction found them; `None` when the
        /// key does not exist.
        current: Option<(Vec<u8>, i64)>,
    },
}

impl EtcdBackend {
    /// Connects to the cluster `config` describes and checks that it answers.
    pub async fn connect(config: &EtcdConfig, timeout: Duration) -> Result<Self, KvstoreError> {
        config.validate()?;
        let endpoints = config.endpoints.join(",");
        let channel = channel(config, timeout)?;
        let connect = Client::from_channel(
            etcd_client::Channel::Tonic(channel.clone()),
            Some(ConnectOptions::new()),
        );
        let client = tokio::time::timeout(timeout, connect)
            .await
            .map_err(|_| KvstoreError::Timeout(format!("connect to {endpoints}")))?
            .map_err(|source| KvstoreError::Connect {
                endpoints: endpoints.clone(),
                error: source,
            })?;
        let backend = Self {
            client,
            config: Arc::new(config.clone()),
            channel,
            endpoints,
            hubs: Arc::new([]),
            ranges: Arc::new(tokio::sync::Semaphore::new(RANGES_IN_FLIGHT)),
            reads: None,
        };
        // Status needs no key permissions, so it works for read-only remote users too.
        let mut maintenance = backend.client.maintenance_client();
        tokio::time::timeout(timeout, maintenance.status())
            .await
            .map_err(|_| KvstoreError::Timeout(format!("status of {}", backend.endpoints)))?
            .map_err(|source| KvstoreError::Connect {
                endpoints: backend.endpoints.clone(),
                error: source,
            })?;
        Ok(backend)
    }

    /// A connection of its own to the same etcd, with the same configuration: for work that
    /// runs on another runtime (a connection's tasks run on the runtime that opened it).
    pub async fn reconnect(&self, timeout: Duration) -> Result<Self, KvstoreError> {
        Self::connect(&self.config, timeout).await
    }

    /// The endpoints this backend talks to, comma separated.
    pub fn endpoints(&self) -> &str {
        &self.endpoints
    }

    fn kv(&self) -> KvClient {
        self.client.kv_client()
    }

    /// The underlying client, for what this backend does not wrap (etcd's auth API).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Reads one key: its value and modification revision.
    pub async fn get(&self, key: &str) -> Result<Option<(Vec<u8>, i64)>, KvstoreError> {
        let operation = format!("get {key}");
        let mut response = with_deadline(&operation, self.kv().get(key, None)).await?;
        Ok(response.take_kvs().into_iter().next().map(|kv| {
            let revision = kv.mod_revision();
            (kv.into_key_value().1, revision)
        }))
    }

    /// Reads `keys` in one transaction, so at one revision and in one round trip: each
    /// key's value (`None`: absent), and the revision they were read at.
    pub async fn get_all(
        &self,
        keys: &[&str],
    ) -> Result<(Vec<Option<Vec<u8>>>, i64), KvstoreError> {
        let read = self.read_txn(keys, None).await?;
        Ok((read.values, read.revision))
    }

    /// Reads `keys` and up to `limit` keys under `prefix` in one transaction: one revision,
    /// one round trip, one read transaction on the server.
    pub async fn get_all_and_list(
        &self,
        keys: &[&str],
        prefix: &str,
        limit: i64,
    ) -> Result<TxnRead, KvstoreError> {
        self.read_txn(keys, Some((prefix, limit))).await
    }

    async fn read_txn(
        &self,
        keys: &[&str],
        list: Option<(&str, i64)>,
    ) -> Result<TxnRead, KvstoreError> {
        let read = Read {
            keys: keys.iter().map(|key| (*key).to_owned()).collect(),
            list: list.map(|(prefix, limit)| (prefix.to_owned(), limit)),
        };
        match &self.reads {
            Some(batcher) => batcher.read(&self.kv(), read).await,
            None => read_batch::one_txn(&self.kv(), std::slice::from_ref(&read))
                .await
                .map(|mut reads| reads.remove(0)),
        }
    }

    /// This backend (a clone of its connection) sending the reads of [`Self::get_all`] and
    /// [`Self::get_all_and_list`] that overlap in time together, in few transactions (see
    /// `etcd/read_batch.rs`): for a client whose many users start at once, as the remote
    /// clusters of an agent behind kvstoremesh do.
    #[must_use]
    pub fn with_batched_reads(mut self) -> Self {
        self.reads = Some(Arc::default());
        self
    }

    /// Writes one key.
    pub async fn put(&self, key: &str, value: impl Into<Vec<u8>>) -> Result<i64, KvstoreError> {
        let operation = format!("put {key}");
        let response = with_deadline(&operation, self.kv().put(key, value, None)).await?;
        Ok(response.header().map_or(0, |h| h.revision()))
    }

    /// Writes one key attached to `lease`: it vanishes when the lease expires.
    pub async fn put_with_lease(
        &self,
        key: &str,
        value: impl Into<Vec<u8>>,
        lease: i64,
    ) -> Result<(), KvstoreError> {
        let operation = format!("put {key} (lease {lease:x})");
        let options = PutOptions::new().with_lease(lease);
        with_deadline(&operation, self.kv().put(key, value, Some(options))).await?;
        Ok(())
    }

    /// Writes many keys in transactions of at most `ops_per_txn` puts (etcd's
    /// `--max-txn-ops` defaults to 128).
    pub async fn put_many(
        &self,
        pairs: impl IntoIterator<Item = (String, Vec<u8>)>,
        ops_per_txn: usize,
    ) -> Result<i64, KvstoreError> {
        let mut revision = 0;
        let mut ops = Vec::with_capacity(ops_per_txn);
        let mut pairs = pairs.into_iter().peekable();
        while pairs.peek().is_some() {
            ops.clear();
            ops.extend(
                pairs
                    .by_ref()
                    .take(ops_per_txn.max(1))
                    .map(|(k, v)| TxnOp::put(k, v, None)),
            );
            let txn = Txn::new().and_then(std::mem::take(&mut ops));
            let response = with_deadline("put txn", self.kv().txn(txn)).await?;
            revision = response.header().map_or(revision, |h| h.revision());
        }
        Ok(revision)
    }

    /// Applies `writes` in transactions of at most `ops_per_txn` operations, in order: each a
    /// put under its lease (0: none) or a delete. Returns the last revision.
    pub async fn write_batch(
        &self,
        writes: &[KeyWrite],
        ops_per_txn: usize,
    ) -> Result<i64, KvstoreError> {
        let mut revision = 0;
        for chunk in writes.chunks(ops_per_txn.max(1)) {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|write| match write {
                    KeyWrite::Put { key, value, lease } => {
                        let options = (*lease != 0).then(|| PutOptions::new().with_lease(*lease));
                        TxnOp::put(key.as_str(), value.clone(), options)
                    }
                    KeyWrite::Delete { key } => TxnOp::delete(key.as_str(), None),
                })
                .collect();
            let response =
                with_deadline("write txn", self.kv().txn(Txn::new().and_then(ops))).await?;
            revision = response.header().map_or(revision, |h| h.revision());
        }
        Ok(revision)
    }

    /// Creates `key` only if it does not exist; returns whether it was created.
    pub async fn create_if_absent(
        &self,
        key: &str,
        value: impl Into<Vec<u8>>,
    ) -> Result<bool, KvstoreError> {
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, value, None)]);
        let response = with_deadline(&format!("create {key}"), self.kv().txn(txn)).await?;
        Ok(response.succeeded())
    }

    /// Writes `key` only if its mod revision is still `mod_revision` (0: only if the key
    /// does not exist): optimistic concurrency for read-modify-write cycles. One
    /// transaction, which on a mismatch reads the key instead, so the caller can redo its
    /// change on the current value without another round trip.
    pub async fn put_if_mod_revision(
        &self,
        key: &str,
        value: impl Into<Vec<u8>>,
        mod_revision: i64,
    ) -> Result<ConditionalPut, KvstoreError> {
        // etcd compares a missing key's revisions as 0, so 0 means "absent".
        let txn = Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, mod_revision)])
            .and_then([TxnOp::put(key, value, None)])
            .or_else([TxnOp::get(key, None)]);
        let operation = format!("put {key} at mod revision {mod_revision}");
        let response = with_deadline(&operation, self.kv().txn(txn)).await?;
        if response.succeeded() {
            let revision = response.header().map_or(0, |h| h.revision());
            return Ok(ConditionalPut::Written { revision });
        }
        let current = response
            .op_responses()
            .into_iter()
            .find_map(|op| match op {
                TxnOpResponse::Get(mut get) => get.take_kvs().into_iter().next(),
                _ => None,
            })
            .map(|kv| {
                let revision = kv.mod_revision();
                (kv.into_key_value().1, revision)
            });
        Ok(ConditionalPut::Conflict { current })
    }

    /// Deletes one key; returns whether it existed.
    pub async fn delete(&self, key: &str) -> Result<bool, KvstoreError> {
        let operation = format!("delete {key}");
        let response = with_deadline(&operation, self.kv().delete(key, None)).await?;
        Ok(response.deleted() > 0)
    }

    /// Deletes every key under `prefix`; returns how many.
    pub async fn delete_prefix(&self, prefix: &str) -> Result<i64, KvstoreError> {
        let operation = format!("delete prefix {prefix}");
        let options = etcd_client::DeleteOptions::new().with_prefix();
        let response = with_deadline(&operation, self.kv().delete(prefix, Some(options))).await?;
        Ok(response.deleted())
    }

    /// Compacts the history up to `revision` (watches from older revisions then fail).
    pub async fn compact(&self, revision: i64) -> Result<(), KvstoreError> {
        let operation = format!("compact {revision}");
        with_deadline(&operation, self.kv().compact(revision, None)).await?;
        Ok(())
    }

    /// The current revision of the cluster, read through `key` (any key the user may read:
    /// a read-only remote user may only read its own prefix).
    pub async fn revision(&self, key: &str) -> Result<i64, KvstoreError> {
        let options = GetOptions::new().with_count_only();
        let response = with_deadline("revision", self.kv().get(key, Some(options))).await?;
        Ok(response.header().map_or(0, |h| h.revision()))
    }

    /// Grants a lease of `ttl` seconds; returns its ID.
    pub async fn lease_grant(&self, ttl: i64) -> Result<i64, KvstoreError> {
        let mut lease = self.client.lease_client();
        let response = with_deadline("lease grant", lease.grant(ttl, None)).await?;
        Ok(response.id())
    }

    /// Refreshes `lease` once; `false` when the lease no longer exists (expired or revoked).
    pub async fn lease_keep_alive_once(&self, lease: i64) -> Result<bool, KvstoreError> {
        let mut client = self.client.lease_client();
        let operation = format!("lease keep-alive {lease:x}");
        // The client sends one keep-alive when it opens the stream and checks the answer.
        match with_deadline(&operation, client.keep_alive(lease)).await {
            Ok(_) => Ok(true),
            Err(KvstoreError::Request {
                error: etcd_client::Error::LeaseKeepAliveError(message),
                ..
            }) if message.contains("not found") => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// Revokes `lease`: every key attached to it is deleted.
    pub async fn lease_revoke(&self, lease: i64) -> Result<(), KvstoreError> {
        let mut client = self.client.lease_client();
        let operation = format!("lease revoke {lease:x}");
        with_deadline(&operation, client.revoke(lease)).await?;
        Ok(())
    }

    /// The remaining TTL of `lease` in seconds (-1 when it does not exist).
    pub async fn lease_ttl(&self, lease: i64) -> Result<i64, KvstoreError> {
        let mut client = self.client.lease_client();
        let operation = format!("lease ttl {lease:x}");
        let response = with_deadline(&operation, client.time_to_live(lease, None)).await?;
        Ok(response.ttl())
    }

    /// Reads one page of keys under `prefix` starting at `from` (inclusive), at `revision`
    /// (0 = latest). Halves `limit` and retries while the response is too large.
    pub async fn list_page(
        &self,
        prefix: &str,
        from: &[u8],
        revision: i64,
        limit: i64,
    ) -> Result<(ListPage, bool), KvstoreError> {
        let range_end = prefix_range_end(prefix.as_bytes());
        let mut limit = limit.max(1);
        loop {
            // Serializable, as Cilium's paginated list: later pages read at the first page's
            // revision, so a quorum round per page would buy nothing.
            let request = range::RangeRequest {
                key: from.to_vec(),
                range_end: range_end.clone(),
                limit,
                revision: revision.max(0),
                serializable: true,
            };
            let operation = format!("range {prefix}");
            // Waiting for a turn is not the call's time: the deadline starts once it is sent.
            let _turn = self.range_turn().await;
            match with_deadline(&operation, self.range(request, limit)).await {
                Ok(range::RangeResponse { mut page, more }) => {
                    if revision > 0 {
                        page.revision = revision;
                    }
                    return Ok((page, more));
                }
                Err(err) if err.is_message_too_large() && limit > 1 => {
                    limit /= 2;
                    tracing::debug!(prefix, limit, "list page too large; halving the page size");
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// A turn among this connection's `Range` calls: at most [`RANGES_IN_FLIGHT`] are in
    /// flight at once. Each page of a list takes one; a raw reader on the same connection
    /// takes one per call to read as the lists do.
    pub async fn range_turn(&self) -> tokio::sync::SemaphorePermit<'_> {
        self.ranges
            .acquire()
            .await
            .expect("the semaphore is never closed")
    }

    /// One `Range` call through the in-place codec, on the client's channel (the size limit
    /// of a response is tonic's default, 4 MiB, as etcd-client's).
    async fn range(
        &self,
        request: range::RangeRequest,
        limit: i64,
    ) -> Result<range::RangeResponse, etcd_client::Error> {
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        grpc.ready().await.map_err(|err| {
            etcd_client::Error::GRpcStatus(tonic::Status::unavailable(err.to_string()))
        })?;
        let path = http::uri::PathAndQuery::from_static(range::RANGE_PATH);
        let codec = range::RangeCodec {
            limit: usize::try_from(limit).unwrap_or(0),
        };
        let response = grpc
            .unary(tonic::Request::new(request), path, codec)
            .await?;
        Ok(response.into_inner())
    }

    /// Lists every key under `prefix` as one consistent snapshot, `page_size` keys per page.
    /// Pages arrive on the returned channel; the next page is fetched while the receiver
    /// works on the current one. An error ends the list.
    pub fn list(
        &self,
        prefix: &str,
        page_size: i64,
    ) -> mpsc::Receiver<Result<ListPage, KvstoreError>> {
        let (tx, rx) = mpsc::channel(2);
        let backend = self.clone();
        let prefix = prefix.to_owned();
        tokio::spawn(async move {
            let mut from = prefix.as_bytes().to_vec();
            let mut revision = 0;
            loop {
                let result = backend.list_page(&prefix, &from, revision, page_size).await;
                let (page, more) = match result {
                    Ok(ok) => ok,
                    Err(err) => {
                        let _ = tx.send(Err(err)).await;
                        return;
                    }
                };
                revision = page.revision;
                if let Some(last) = page.last() {
                    from = last.key().to_vec();
                    // The smallest key after `last`.
                    from.push(0);
                }
                let done = !more || page.is_empty();
                if tx.send(Ok(page)).await.is_err() || done {
                    return;
                }
            }
        });
        rx
    }
}

/// A channel to `config`'s endpoints, balanced over them, as etcd-client builds its own: TLS
/// for `https://` URLs (and bare ones when TLS files are given), keepalives that notice a
/// silently dead peer (a partition) on long-lived watches.
fn channel(config: &EtcdConfig, connect_timeout: Duration) -> Result<Channel, KvstoreError> {
    let tls = config.tls_options()?;
    let endpoints = config
        .endpoints
        .iter()
        .map(|url| {
            let (url, secure) = if url.starts_with("http://") {
                (url.clone(), false)
            } else if url.starts_with("https://") {
                (url.clone(), true)
            } else if tls.is_some() {
                (format!("https://{url}"), true)
            } else {
                (format!("http://{url}"), false)
            };
            let bad = |error: &dyn std::fmt::Display| {
                KvstoreError::Config(format!("endpoint {url}: {error}"))
            };
            let mut endpoint = Endpoint::from_shared(url.clone()).map_err(|e| bad(&e))?;
            if secure {
                endpoint = endpoint
                    .tls_config(tls.clone().unwrap_or_default())
                    .map_err(|e| bad(&e))?;
            } else if tls.is_some() {
                return Err(bad(&"TLS files are given for a plain http:// endpoint"));
            }
            Ok(endpoint
                .keep_alive_while_idle(true)
                .http2_keep_alive_interval(KEEPALIVE)
                .keep_alive_timeout(KEEPALIVE)
                .connect_timeout(connect_timeout))
        })
        .collect::<Result<Vec<_>, KvstoreError>>()?;
    Ok(Channel::balance_list(endpoints.into_iter()))
}

pub(crate) async fn with_deadline<T>(
    operation: &str,
    future: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, KvstoreError> {
    tokio::time::timeout(REQUEST_TIMEOUT, future)
        .await
        .map_err(|_| KvstoreError::Timeout(operation.to_owned()))?
        .map_err(KvstoreError::request(operation))
}
