//! The physical floor of the benchmarks: reading keys raw from etcd, no decoding.

use std::time::{Duration, Instant};

use meshwork_kvstore::EtcdBackend;
use meshwork_kvstore::etcd::DEFAULT_PAGE_SIZE;

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
        let (page, more) = backend
            .list_page(prefix, &from, revision, page_size)
            .await?;
        revision = page.revision;
        count += page.kvs.len();
        match page.kvs.last() {
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
        let (page, more) = backend
            .list_page(prefix, &from, revision, page_size)
            .await?;
        revision = page.revision;
        kvs.extend(
            page.kvs
                .iter()
                .map(|kv| (kv.key().to_vec(), kv.value().to_vec())),
        );
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
