//! One etcd watch for many: the watches a backend opens under a root prefix
//! (`cilium/cache/`) are served from a single etcd watch, split here by prefix and start
//! revision.
//!
//! etcd opens a read transaction for every watch it creates, and the 3.4 server copies its
//! whole read buffer into each; an agent reading 250 remotes through kvstoremesh asks for
//! 1,500 watches (six per remote) where three do. Go's clientv3 shares one gRPC stream
//! between watchers but still creates one server watcher each.
//!
//! A subscription from revision `s` is taken only while the hub has not passed it: every
//! event the hub has handed out is older than `s`. Otherwise the caller opens a watch of its
//! own, so no event is ever missed. When the etcd watch fails every subscriber gets the
//! error (its store lists again) and the next subscription starts a new hub.

use std::collections::{BTreeMap, HashMap};

use etcd_client::{Client, WatchOptions};
use tokio::sync::{mpsc, oneshot};

use super::etcd::{WATCH_DECODE_LIMIT, events_of};
use super::keys::prefix_range_end;
use super::{KvstoreError, WatchEvent};

/// What a subscriber receives: a batch of its events, or why the shared watch ended.
pub(crate) type HubItem = Result<Vec<WatchEvent>, HubError>;

/// Why the shared watch ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HubError {
    /// The start revision was compacted; the oldest one left.
    Compacted(i64),
    /// The stream failed or etcd cancelled the watch.
    Failed(String),
}

struct Subscriber {
    start_revision: i64,
    events: mpsc::UnboundedSender<HubItem>,
}

/// The subscribers of one shared watch and what it has handed out; no IO.
pub(crate) struct HubState {
    /// The newest revision whose events were handed out (or skipped, being before every
    /// subscription): a subscription must start after it.
    dispatched: i64,
    subscribers: HashMap<Vec<u8>, Vec<Subscriber>>,
    /// How many subscribed prefixes have each length: an event key is looked up once per
    /// length, not compared with every prefix.
    lengths: BTreeMap<usize, usize>,
}

impl HubState {
    /// A hub whose etcd watch starts at `start_revision`.
    pub(crate) fn new(start_revision: i64) -> Self {
        Self {
            dispatched: start_revision - 1,
            subscribers: HashMap::new(),
            lengths: BTreeMap::new(),
        }
    }

    /// Subscribes to every event under `prefix` from `start_revision` on; `None` when the
    /// hub has already handed out events of that revision or later.
    pub(crate) fn subscribe(
        &mut self,
        prefix: &[u8],
        start_revision: i64,
    ) -> Option<mpsc::UnboundedReceiver<HubItem>> {
        if start_revision <= self.dispatched {
            return None;
        }
        let (events, receiver) = mpsc::unbounded_channel();
        let subscribers = self.subscribers.entry(prefix.to_vec()).or_insert_with(|| {
            *self.lengths.entry(prefix.len()).or_default() += 1;
            Vec::new()
        });
        subscribers.retain(|s| !s.events.is_closed());
        subscribers.push(Subscriber {
            start_revision,
            events,
        });
        Some(receiver)
    }

    /// Hands each subscriber its share of one batch, in order. Returns whether anyone still
    /// listens.
    pub(crate) fn dispatch(&mut self, events: &[WatchEvent]) -> bool {
        // Per subscribed prefix, the positions of its events: each event is copied once per
        // share it goes to, and only then.
        let mut batches: HashMap<&[u8], Vec<usize>> = HashMap::new();
        for (position, event) in events.iter().enumerate() {
            self.dispatched = self.dispatched.max(event.mod_revision());
            for &length in self.lengths.keys() {
                if let Some(prefix) = event.key().get(..length)
                    && self.subscribers.contains_key(prefix)
                {
                    batches.entry(prefix).or_default().push(position);
                }
            }
        }
        for (prefix, positions) in batches {
            for subscriber in self.subscribers.get(prefix).into_iter().flatten() {
                let share: Vec<_> = positions
                    .iter()
                    .map(|&position| &events[position])
                    .filter(|e| e.mod_revision() >= subscriber.start_revision)
                    .cloned()
                    .collect();
                if !share.is_empty() {
                    // A failed send is a share that left; the sweep below drops it.
                    let _ = subscriber.events.send(Ok(share));
                }
            }
        }
        // Shares dropped since the last batch leave now, whether or not this one was theirs.
        self.subscribers.retain(|_, subscribers| {
            subscribers.retain(|s| !s.events.is_closed());
            !subscribers.is_empty()
        });
        self.lengths.clear();
        for prefix in self.subscribers.keys() {
            *self.lengths.entry(prefix.len()).or_default() += 1;
        }
        !self.subscribers.is_empty()
    }

    /// Ends every subscription with `error`.
    pub(crate) fn fail(&mut self, error: &HubError) {
        for (_, subscribers) in self.subscribers.drain() {
            for subscriber in subscribers {
                let _ = subscriber.events.send(Err(error.clone()));
            }
        }
        self.lengths.clear();
    }
}

struct Subscribe {
    prefix: Vec<u8>,
    start_revision: i64,
    reply: oneshot::Sender<Option<mpsc::UnboundedReceiver<HubItem>>>,
}

/// Why [`WatchHub::start`] failed.
#[derive(Debug)]
pub(crate) enum StartError {
    /// etcd refused the watch (a user allowed only part of the root): watch alone.
    Refused(String),
    /// etcd failed.
    Kvstore(KvstoreError),
}

impl From<KvstoreError> for StartError {
    fn from(error: KvstoreError) -> Self {
        Self::Kvstore(error)
    }
}

/// The hub has ended (its watch failed or everyone left): start a new one.
#[derive(Debug)]
pub(crate) struct HubGone;

/// A running shared watch: the handle of the task that reads it.
pub(crate) struct WatchHub {
    commands: mpsc::UnboundedSender<Subscribe>,
}

impl WatchHub {
    /// Opens the etcd watch on `root` from `start_revision` and waits until etcd has created
    /// it: a refusal (a user without read access to all of `root`) is an error here, not a
    /// failure of every subscriber later.
    pub(crate) async fn start(
        client: &Client,
        root: &str,
        start_revision: i64,
    ) -> Result<Self, StartError> {
        let operation = format!("watch {root} (shared)");
        let options = WatchOptions::new().with_start_revision(start_revision);
        // A root without a trailing `/` is a single key (see `HubSlot::covers`): a user
        // granted that key alone may watch it, not a range.
        let options = if root.ends_with('/') {
            options.with_range(prefix_range_end(root.as_bytes()))
        } else {
            options
        };
        let mut watch_client = client
            .watch_client()
            .max_decoding_message_size(WATCH_DECODE_LIMIT);
        let mut stream =
            super::etcd::with_deadline(&operation, watch_client.watch(root, Some(options))).await?;
        let created = super::etcd::with_deadline(&operation, stream.message()).await?;
        match created {
            Some(response) if response.canceled() => {
                return Err(StartError::Refused(response.cancel_reason().to_owned()));
            }
            Some(_) => {}
            None => return Err(KvstoreError::WatchClosed(root.to_owned()).into()),
        }
        let (commands, receiver) = mpsc::unbounded_channel();
        tokio::spawn(run(stream, HubState::new(start_revision), receiver));
        Ok(Self { commands })
    }

    /// Subscribes to `prefix` from `start_revision`; `Ok(None)` when the hub has passed it.
    pub(crate) async fn subscribe(
        &self,
        prefix: &str,
        start_revision: i64,
    ) -> Result<Option<mpsc::UnboundedReceiver<HubItem>>, HubGone> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Subscribe {
                prefix: prefix.as_bytes().to_vec(),
                start_revision,
                reply,
            })
            .map_err(|_| HubGone)?;
        answer.await.map_err(|_| HubGone)
    }
}

async fn run(
    mut stream: etcd_client::WatchStream,
    mut state: HubState,
    mut commands: mpsc::UnboundedReceiver<Subscribe>,
) {
    loop {
        tokio::select! {
            command = commands.recv() => {
                // Every handle dropped: the backend is gone.
                let Some(command) = command else { return };
                let _ = command
                    .reply
                    .send(state.subscribe(&command.prefix, command.start_revision));
            }
            message = stream.message() => {
                let error = match message {
                    Ok(Some(response)) if response.compact_revision() > 0 => {
                        HubError::Compacted(response.compact_revision())
                    }
                    Ok(Some(response)) if response.canceled() => HubError::Failed(format!(
                        "canceled by the server: {}",
                        response.cancel_reason()
                    )),
                    Ok(Some(response)) => {
                        let events = events_of(&response);
                        if !events.is_empty() && !state.dispatch(&events) {
                            tracing::debug!("every subscriber of the shared watch left");
                            return;
                        }
                        continue;
                    }
                    Ok(None) => HubError::Failed("etcd closed the shared watch".to_owned()),
                    Err(err) => HubError::Failed(err.to_string()),
                };
                tracing::debug!(?error, "shared watch ended");
                state.fail(&error);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, revision: i64) -> WatchEvent {
        WatchEvent::Put {
            key: key.as_bytes().to_vec(),
            value: b"v".to_vec(),
            mod_revision: revision,
        }
    }

    fn keys(batch: &[WatchEvent]) -> Vec<(String, i64)> {
        batch
            .iter()
            .map(|e| {
                (
                    String::from_utf8_lossy(e.key()).into_owned(),
                    e.mod_revision(),
                )
            })
            .collect()
    }

    #[test]
    fn each_subscriber_gets_its_prefix_from_its_start_revision_on() {
        let mut hub = HubState::new(10);
        let mut c1 = hub.subscribe(b"cilium/cache/ip/v1/c1/", 10).unwrap();
        let mut c10 = hub.subscribe(b"cilium/cache/ip/v1/c10/", 12).unwrap();
        let mut config = hub.subscribe(b"cilium/cluster-config/c1", 10).unwrap();
        assert!(hub.dispatch(&[
            put("cilium/cache/ip/v1/c1/a", 10),
            put("cilium/cache/ip/v1/c10/a", 11),
            put("cilium/cluster-config/c10", 11),
            put("cilium/cache/ip/v1/c10/b", 12),
            put("cilium/state/nodes/v1/local/n", 12),
        ]));
        assert_eq!(
            keys(&c1.try_recv().unwrap().unwrap()),
            [("cilium/cache/ip/v1/c1/a".to_owned(), 10)]
        );
        // Its start revision hides revision 11.
        assert_eq!(
            keys(&c10.try_recv().unwrap().unwrap()),
            [("cilium/cache/ip/v1/c10/b".to_owned(), 12)]
        );
        // A watch on a key is a watch on a prefix, as etcd's: `c1` covers `c10`.
        assert_eq!(
            keys(&config.try_recv().unwrap().unwrap()),
            [("cilium/cluster-config/c10".to_owned(), 11)]
        );
        assert!(c1.try_recv().is_err() && c10.try_recv().is_err());
    }

    #[test]
    fn a_subscription_the_hub_has_passed_is_refused() {
        let mut hub = HubState::new(5);
        assert!(hub.subscribe(b"p/", 4).is_none(), "before the hub's start");
        let _p = hub.subscribe(b"p/", 5).unwrap();
        hub.dispatch(&[put("p/a", 7)]);
        assert!(
            hub.subscribe(b"q/", 7).is_none(),
            "revision 7 was handed out"
        );
        assert!(hub.subscribe(b"q/", 8).is_some());
    }

    #[test]
    fn a_failure_reaches_every_subscriber_and_leavers_are_dropped() {
        let mut hub = HubState::new(1);
        let left = hub.subscribe(b"a/", 1).unwrap();
        let mut stays = hub.subscribe(b"b/", 1).unwrap();
        drop(left);
        assert!(hub.dispatch(&[put("a/x", 2)]), "b/ still listens");
        assert_eq!(hub.subscribers.len(), 1);
        hub.fail(&HubError::Compacted(3));
        assert_eq!(stays.try_recv().unwrap(), Err(HubError::Compacted(3)));
        assert!(hub.subscribers.is_empty() && hub.lengths.is_empty());
    }

    #[test]
    fn the_last_leaver_ends_the_hub() {
        let mut hub = HubState::new(1);
        drop(hub.subscribe(b"a/", 1).unwrap());
        assert!(!hub.dispatch(&[put("a/x", 2)]));
    }
}
