//! Shared helpers of the apiserver's tests: a connection to the lab's etcd, and a record of
//! every event a reader of `cilium/` sees.

#![allow(dead_code, reason = "each test binary uses part of the helpers")]

pub mod apiserver;

use std::time::Duration;

use meshwork_kvstore::{EtcdBackend, EtcdConfig, WatchEvent};
use meshwork_lab::etcd::EtcdServer;

/// Written after the operation under test: every event before it is what the operation did.
const SENTINEL: &str = "cilium/zz-sentinel";

pub async fn connect(server: &EtcdServer) -> EtcdBackend {
    EtcdBackend::connect(
        &EtcdConfig::new([server.endpoint()]),
        Duration::from_secs(10),
    )
    .await
    .expect("connect to the lab etcd")
}

/// Every event under `cilium/` from `revision` on, up to a sentinel written now: each key
/// with its mod revision.
pub async fn events_since(backend: &EtcdBackend, revision: i64) -> Vec<(String, i64)> {
    let mut watch = backend.watch("cilium/", revision).await.unwrap();
    backend.put(SENTINEL, "x").await.unwrap();
    let mut events = Vec::new();
    loop {
        let batch = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .expect("the watch reaches the sentinel")
            .unwrap()
            .expect("the watch goes on");
        for event in batch {
            let (key, revision) = match event {
                WatchEvent::Put {
                    key, mod_revision, ..
                }
                | WatchEvent::Delete { key, mod_revision } => {
                    (String::from_utf8(key).unwrap(), mod_revision)
                }
            };
            if key == SENTINEL {
                return events;
            }
            events.push((key, revision));
        }
    }
}
