//! The physical floor of the benchmarks: reading keys raw from etcd, no decoding.
//!
//! The floor reads through etcd-client's `Range`, as any client of etcd does: every key and
//! value decoded by prost into vectors of their own. The backend's lists read the same
//! responses in place (`meshwork_kvstore::etcd::ListPage`), which is cheaper than this
//! floor; `examples/sync_profile.rs raw --in-place` measures that read too.

use std::time::{Duration, Instant};

use etcd_client::GetOptions;
use meshwork_kvstore::EtcdBackend;
use meshwork_kvstore::etcd::DEFAULT_PAGE_SIZE;
use meshwork_kvstore::keys::prefix_range_end;

/// One page of `prefix` from `from` on, at `revision` (0: the latest), as etcd-client reads
/// it: the pairs, the revision read at, and whether more follow.
pub async fn etcd_client_page(
    backend: &EtcdBackend,
    prefix: &str,
    from: &[u8],
    revision: i64,
    limit: i64,
) -> anyhow::Result<(Vec<etcd_client::KeyValue>, i64, bool)> {
    let mut options = GetOptions::new()
        .with_range(prefix_range_end(prefix.as_bytes()))
        .with_limit(limit)
        .with_serializable();
    if revision > 0 {
        options = options.with_revision(revision);
    }
    // A turn among the connection's calls, as each page of the backend's lists takes.
    let _turn = backend.range_turn().await;
    let mut response = backend
        .client()
        .kv_client()
        .get(from.to_vec(), Some(options))
        .await?;
    let read_at = match revision {
        0 => response.header().map_or(0, |h| h.revision()),
        _ => revision,
    };
    let more = response.more();
    Ok((response.take_kvs(), read_at, more))
}

/// Reads every key under `prefix` page by page at one revision, as the watch store's list
/// does, and returns how many there were.
pub async fn read_prefix(
    backend: &EtcdBackend,
    prefix: &str,
    page_size: i64,
) -> anyhow::Result<usize> {
    let mut from = prefix.as_bytes().to_vec();
    let mut revision = 0;
    let mut count = 0;
    loop {
        let (kvs, read_at, more) =
            etcd_client_page(backend, prefix, &from, revision, page_size).await?;
        revision = read_at;
        count += kvs.len();
        match kvs.last() {
            Some(last) if more => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => return Ok(count),
        }
    }
}

/// Reads every key under `prefix` as [`read_prefix`] does, and keeps the keys and values.
pub async fn list_prefix(
    backend: &EtcdBackend,
    prefix: &str,
    page_size: i64,
) -> anyhow::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut from = prefix.as_bytes().to_vec();
    let mut revision = 0;
    let mut kvs = Vec::new();
    loop {
        let (page, read_at, more) =
            etcd_client_page(backend, prefix, &from, revision, page_size).await?;
        revision = read_at;
        kvs.extend(page.into_iter().map(etcd_client::KeyValue::into_key_value));
        match kvs.last() {
            Some((last, _)) if more => {
                from.clone_from(last);
                from.push(0);
            }
            _ => return Ok(kvs),
        }
    }
}

/// Reads every `(backend, prefix)` of `reads` at once, as [`read_prefix`] does each, and
/// answers how long the slowest took.
pub async fn read_all(reads: Vec<(EtcdBackend, String)>) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let tasks: Vec<_> = reads
        .into_iter()
        .map(|(backend, prefix)| {
            tokio::spawn(async move { read_prefix(&backend, &prefix, DEFAULT_PAGE_SIZE).await })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(started.elapsed())
}
