//! Watches: each its own etcd watch, or a share of the backend's shared one.

use etcd_client::{EventType, WatchOptions, WatchResponse, WatchResponseStream};
use tokio::sync::mpsc;

use super::{EtcdBackend, KvstoreError, prefix_range_end, with_deadline};
use crate::watch_hub::{HubError, HubItem, StartError, WatchHub};

/// Largest watch response accepted: one revision can carry many events (a big transaction).
pub(crate) const WATCH_DECODE_LIMIT: usize = 64 * 1024 * 1024;

/// The shared watch of a backend, started by the first watch under `root`.
pub(crate) struct HubSlot {
    root: String,
    current: tokio::sync::Mutex<HubSlotState>,
}

impl HubSlot {
    /// Whether the shared watch carries every event of `target` (a prefix, or a single key
    /// when `exact`). A root without a trailing `/` is a single key: only a watch of that
    /// key is its share.
    fn covers(&self, target: &str, exact: bool) -> bool {
        if self.root.ends_with('/') {
            target.starts_with(&self.root)
        } else {
            exact && target == self.root
        }
    }
}

/// What a watch covers.
#[derive(Clone, Copy)]
enum Range {
    /// Every key under a prefix.
    Prefix,
    /// One key: all that a user granted that key alone may watch.
    Key,
}

enum HubSlotState {
    Idle,
    Running(WatchHub),
    /// etcd refused the watch on the root (a user allowed only part of it): every watch is
    /// its own.
    Refused,
}

/// One change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// A key was created or modified.
    Put {
        /// The full key.
        key: Vec<u8>,
        /// The new value.
        value: Vec<u8>,
        /// The key's new mod revision.
        mod_revision: i64,
    },
    /// A key was deleted.
    Delete {
        /// The full key.
        key: Vec<u8>,
        /// The revision of the delete.
        mod_revision: i64,
    },
}

impl WatchEvent {
    /// The full key.
    pub fn key(&self) -> &[u8] {
        match self {
            Self::Put { key, .. } | Self::Delete { key, .. } => key,
        }
    }

    /// The revision of the change.
    pub fn mod_revision(&self) -> i64 {
        match self {
            Self::Put { mod_revision, .. } | Self::Delete { mod_revision, .. } => *mod_revision,
        }
    }
}

/// An open watch on a prefix.
pub struct Watch {
    source: WatchSource,
    prefix: String,
    start_revision: i64,
}

enum WatchSource {
    /// A watch of its own.
    Own {
        stream: Box<WatchResponseStream>,
        // Dropping the request sender cancels the watch server-side.
        _requests: etcd_client::WatchRequestSender,
    },
    /// A share of the backend's shared watch; dropping the receiver leaves it.
    Shared(mpsc::UnboundedReceiver<HubItem>),
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl EtcdBackend {
    /// This backend (a clone of its connection) serving the watches under each of `roots`
    /// that start at a known revision from one etcd watch per root (see
    /// [`crate::watch_hub`]): for a client that watches many prefixes of one etcd, as an
    /// agent behind kvstoremesh does. Roots should not nest.
    #[must_use]
    pub fn with_shared_watches(mut self, roots: &[&str]) -> Self {
        self.hubs = roots
            .iter()
            .map(|root| HubSlot {
                root: (*root).to_owned(),
                current: tokio::sync::Mutex::new(HubSlotState::Idle),
            })
            .collect();
        self
    }

    /// Watches every key under `prefix` from `start_revision` on (0: from now).
    pub async fn watch(&self, prefix: &str, start_revision: i64) -> Result<Watch, KvstoreError> {
        self.watch_range(prefix, Range::Prefix, start_revision)
            .await
    }

    /// Watches the single key `key` from `start_revision` on (0: from now). etcd refuses a
    /// prefix watch, even of a key's own name, to a user granted only that key, as Cilium's
    /// roles grant `cilium/.heartbeat` and `cilium/cluster-config/<cluster>`.
    pub async fn watch_key(&self, key: &str, start_revision: i64) -> Result<Watch, KvstoreError> {
        self.watch_range(key, Range::Key, start_revision).await
    }

    async fn watch_range(
        &self,
        prefix: &str,
        range: Range,
        start_revision: i64,
    ) -> Result<Watch, KvstoreError> {
        let exact = matches!(range, Range::Key);
        let slot = self.hubs.iter().find(|slot| slot.covers(prefix, exact));
        let shared = match slot {
            Some(slot) if start_revision > 0 => {
                self.subscribe(slot, prefix, start_revision).await?
            }
            _ => None,
        };
        let source = match shared {
            Some(events) => WatchSource::Shared(events),
            None => self.own_watch(prefix, range, start_revision).await?,
        };
        Ok(Watch {
            source,
            prefix: prefix.to_owned(),
            start_revision,
        })
    }

    /// A share of the shared watch, started here if none runs; `None` when the running one
    /// has passed `start_revision` or etcd refuses it.
    async fn subscribe(
        &self,
        slot: &HubSlot,
        prefix: &str,
        start_revision: i64,
    ) -> Result<Option<mpsc::UnboundedReceiver<HubItem>>, KvstoreError> {
        let mut current = slot.current.lock().await;
        match &*current {
            HubSlotState::Refused => return Ok(None),
            HubSlotState::Running(hub) => {
                if let Ok(answer) = hub.subscribe(prefix, start_revision).await {
                    return Ok(answer);
                }
            }
            HubSlotState::Idle => {}
        }
        let hub = match WatchHub::start(&self.client, &slot.root, start_revision).await {
            Ok(hub) => hub,
            Err(StartError::Refused(reason)) => {
                tracing::info!(endpoints = %self.endpoints, root = slot.root, reason,
                    "etcd refused one watch for all; watching each prefix on its own");
                *current = HubSlotState::Refused;
                return Ok(None);
            }
            Err(StartError::Kvstore(err)) => return Err(err),
        };
        let answer = hub.subscribe(prefix, start_revision).await.ok().flatten();
        *current = HubSlotState::Running(hub);
        Ok(answer)
    }

    async fn own_watch(
        &self,
        prefix: &str,
        range: Range,
        start_revision: i64,
    ) -> Result<WatchSource, KvstoreError> {
        let mut client = self
            .client
            .watch_client()
            .max_decoding_message_size(WATCH_DECODE_LIMIT);
        let options = WatchOptions::new().with_start_revision(start_revision);
        let options = match range {
            Range::Prefix => options.with_range(prefix_range_end(prefix.as_bytes())),
            Range::Key => options,
        };
        let operation = format!("watch {prefix}");
        let stream = with_deadline(&operation, client.watch(prefix, Some(options))).await?;
        let (requests, stream) = stream.split();
        Ok(WatchSource::Own {
            stream: Box::new(stream),
            _requests: requests,
        })
    }
}

/// The events of one watch response, in order.
pub(crate) fn events_of(response: &WatchResponse) -> Vec<WatchEvent> {
    response
        .events()
        .iter()
        .filter_map(|event| {
            let kv = event.kv()?;
            let mod_revision = kv.mod_revision();
            Some(match event.event_type() {
                EventType::Put => WatchEvent::Put {
                    key: kv.key().to_vec(),
                    value: kv.value().to_vec(),
                    mod_revision,
                },
                EventType::Delete => WatchEvent::Delete {
                    key: kv.key().to_vec(),
                    mod_revision,
                },
            })
        })
        .collect()
}

impl Watch {
    /// The next batch of events. `Ok(None)` means the server closed the watch; a compacted
    /// start revision is [`KvstoreError::Compacted`].
    pub async fn next(&mut self) -> Result<Option<Vec<WatchEvent>>, KvstoreError> {
        let Self {
            source,
            prefix,
            start_revision,
        } = self;
        let compacted = |compact_revision| KvstoreError::Compacted {
            revision: *start_revision,
            compact_revision,
        };
        let stream = match source {
            WatchSource::Own { stream, .. } => stream,
            WatchSource::Shared(events) => {
                return match events.recv().await {
                    Some(Ok(batch)) => Ok(Some(batch)),
                    Some(Err(HubError::Compacted(revision))) => Err(compacted(revision)),
                    Some(Err(HubError::Failed(reason))) => Err(watch_failed(prefix, reason)),
                    None => Ok(None),
                };
            }
        };
        loop {
            let message = stream
                .message()
                .await
                .map_err(KvstoreError::request(format!("watch {prefix}")))?;
            let Some(response) = message else {
                return Ok(None);
            };
            if response.compact_revision() > 0 {
                return Err(compacted(response.compact_revision()));
            }
            if response.canceled() {
                let reason = format!("canceled by the server: {}", response.cancel_reason());
                return Err(watch_failed(prefix, reason));
            }
            if response.created() && response.events().is_empty() {
                continue;
            }
            return Ok(Some(events_of(&response)));
        }
    }

    /// Whether this watch is a share of the backend's shared watch.
    pub fn is_shared(&self) -> bool {
        matches!(self.source, WatchSource::Shared(_))
    }
}

fn watch_failed(prefix: &str, reason: String) -> KvstoreError {
    KvstoreError::Request {
        operation: format!("watch {prefix}"),
        error: etcd_client::Error::WatchError(reason),
    }
}
