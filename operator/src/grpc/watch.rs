//! `WatchNode`: a node's published snapshots as a server stream, from the node's `watch`
//! channel in the node manager ([`Published`]): the newest one at once, then each newer
//! generation. The channel keeps only the newest value, so a client that reads slowly skips
//! to the newest generation rather than falling behind; every snapshot it gets is still one
//! stored generation. The stream ends with NOT_FOUND when the node stops being driven, and
//! with UNAVAILABLE when the operator shuts down (the server could not stop otherwise: a
//! watch never ends by itself).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::Stream;
use meshwork_proto::ipam::v1::NodeSnapshot;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::convert;
use crate::manager::Published;

/// The stream `WatchNode` answers with.
pub type SnapshotStream = Pin<Box<dyn Stream<Item = Result<NodeSnapshot, Status>> + Send>>;

/// The test hook behind `--test-hook-inconsistent-snapshot NODE`: the first watcher of
/// `NODE` to get a snapshot with a non-empty pool gets, once in the operator's life, a
/// broken copy of it first ([`convert::inconsistent`]: a pool IP names an ENI the snapshot
/// lacks, as Cilium's ordering bug produced), then the real one. Only for testing that an
/// agent waits such a snapshot out.
#[derive(Debug)]
pub struct InconsistentSnapshotHook {
    node: String,
    fired: AtomicBool,
}

impl InconsistentSnapshotHook {
    /// Armed for `node`.
    pub fn new(node: impl Into<String>) -> Self {
        Self {
            node: node.into(),
            fired: AtomicBool::new(false),
        }
    }

    /// The broken snapshot to send before `snapshot`, the first time one can be made.
    pub fn fire(&self, snapshot: &NodeSnapshot) -> Option<NodeSnapshot> {
        if snapshot.node != self.node || self.fired.load(Ordering::Acquire) {
            return None;
        }
        let broken = convert::inconsistent(snapshot)?;
        // Two watchers racing: only one sends it.
        if self.fired.swap(true, Ordering::AcqRel) {
            return None;
        }
        tracing::warn!(node = %self.node, generation = %broken.generation,
            "test hook: sending an inconsistent snapshot before the real one");
        Some(broken)
    }
}

/// One watcher's position in its node's channel.
struct Follow {
    node: String,
    receiver: watch::Receiver<Published>,
    stop: CancellationToken,
    hook: Option<Arc<InconsistentSnapshotHook>>,
    /// The real snapshot, due after the hook's broken one.
    queued: Option<NodeSnapshot>,
    /// The generation sent last.
    last: Option<String>,
    /// The value held at subscription is still to be looked at.
    first: bool,
    done: bool,
}

impl Follow {
    /// The next item of the stream, `None` once it ended.
    async fn next(&mut self) -> Option<Result<NodeSnapshot, Status>> {
        if self.done {
            return None;
        }
        if let Some(real) = self.queued.take() {
            return Some(Ok(real));
        }
        loop {
            if self.stop.is_cancelled() {
                return self.end(shutting_down());
            }
            if !std::mem::take(&mut self.first) {
                tokio::select! {
                    () = self.stop.cancelled() => return self.end(shutting_down()),
                    changed = self.receiver.changed() => if changed.is_err() {
                        return self.end(Status::unavailable(
                            "the operator's node manager stopped; reconnect",
                        ));
                    },
                }
            }
            let published = self.receiver.borrow_and_update().clone();
            let object = match published {
                Published::Pending => continue,
                Published::Gone => {
                    return self.end(Status::not_found(format!(
                        "node {:?} is no longer driven (its CiliumNode was deleted or lost \
                         spec.eni.instance-id)",
                        self.node
                    )));
                }
                Published::Node(object) => object,
            };
            let snapshot = convert::snapshot(&object);
            if self.last.as_deref() == Some(snapshot.generation.as_str()) {
                continue;
            }
            self.last = Some(snapshot.generation.clone());
            if let Some(broken) = self.hook.as_ref().and_then(|hook| hook.fire(&snapshot)) {
                self.queued = Some(snapshot);
                return Some(Ok(broken));
            }
            return Some(Ok(snapshot));
        }
    }

    fn end(&mut self, status: Status) -> Option<Result<NodeSnapshot, Status>> {
        self.done = true;
        Some(Err(status))
    }
}

fn shutting_down() -> Status {
    Status::unavailable("the operator is shutting down; reconnect")
}

/// The stream of `node`'s snapshots from `receiver`, ended by `stop`.
pub fn follow(
    node: String,
    receiver: watch::Receiver<Published>,
    stop: CancellationToken,
    hook: Option<Arc<InconsistentSnapshotHook>>,
) -> SnapshotStream {
    let follow = Follow {
        node,
        receiver,
        stop,
        hook,
        queued: None,
        last: None,
        first: true,
        done: false,
    };
    Box::pin(futures::stream::unfold(follow, |mut follow| async move {
        let item = follow.next().await?;
        Some((item, follow))
    }))
}

#[cfg(test)]
mod tests;
