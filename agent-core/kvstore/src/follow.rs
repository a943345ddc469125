//! Following the keys under a prefix for changes made by anyone: what a writer needs to put
//! back at once a key it owns that someone else changed or deleted (Cilium's cluster config).

use std::time::Duration;

use crate::{EtcdBackend, KvstoreError, WatchEvent};

/// How long a broken watch waits before it is opened again.
const REOPEN_DELAY: Duration = Duration::from_secs(1);

/// Watches `prefix` from now on and calls `touched` with the key of every put or delete
/// under it, until `touched` answers `false`. A broken watch is opened again after a second,
/// from the current revision: what changed meanwhile is for the caller's periodic check.
pub async fn follow_prefix<F, Fut>(backend: EtcdBackend, prefix: String, mut touched: F)
where
    F: FnMut(Vec<u8>) -> Fut,
    Fut: Future<Output = bool>,
{
    loop {
        let followed = async {
            let revision = backend.revision(&prefix).await?;
            let mut watch = backend.watch(&prefix, revision + 1).await?;
            while let Some(events) = watch.next().await? {
                for event in events {
                    let (WatchEvent::Put { key, .. } | WatchEvent::Delete { key, .. }) = event;
                    if !touched(key).await {
                        return Ok(false);
                    }
                }
            }
            Ok::<bool, KvstoreError>(true)
        };
        match followed.await {
            Ok(false) => return,
            Ok(true) => tracing::warn!(%prefix, "the watch was closed; watching again"),
            Err(err) => tracing::warn!(%err, %prefix, "watching failed; watching again"),
        }
        tokio::time::sleep(REOPEN_DELAY).await;
    }
}
