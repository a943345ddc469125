//! The actor that watches the config directory and reports changes.
//!
//! `notify` calls back on its own thread; the callback only pushes the raw event into a tokio
//! unbounded channel whose receiver is a stream of this actor (`ctx.add_stream`). Any relevant
//! event schedules one rescan [`DEFAULT_DEBOUNCE`] later (later events in that window ride
//! along); the rescan reads the whole directory and feeds the [`ConfigDirState`], so a
//! Kubernetes `..data` symlink swap, an editor's rename-over, an in-place write and a lost or
//! overflowed event queue are all handled the same way. The directory is tiny, so the rescan
//! reads it synchronously on the actor's thread.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use actix::{
    Actor, ActorContext, AsyncContext, Context, Handler, Message, Recipient, StreamHandler,
};
use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::scan::{scan_dir, scan_with_link_targets};
use super::{ClusterConfigEvent, ConfigDirError, ConfigDirState};

/// How long the watcher waits after the first event before it rescans.
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(100);

/// Delay before retrying to (re)establish the watch when it could not be set up or the
/// directory became unreadable.
const RETRY: Duration = Duration::from_secs(1);

/// Watches the config directory and sends a [`ClusterConfigEvent`] per change to a recipient.
///
/// Start-up, in this order: [`read_initial`](Self::read_initial) (synchronous, before anything
/// else; its events are the initial set of clusters), then [`new`](Self::new) with the
/// returned state and `.start()`. `started` only sets up the `notify` watch and queues one
/// rescan, which catches anything that changed between the initial read and the watch.
///
/// If the directory becomes unreadable later (deleted, unmounted), the known clusters are kept
/// — nothing is removed on a read error — and the watch is re-established every second until
/// the directory is back.
pub struct ConfigDirWatcher {
    state: ConfigDirState,
    recipient: Recipient<ClusterConfigEvent>,
    debounce: Duration,
    watcher: Option<RecommendedWatcher>,
    /// Symlink targets outside the directory that `watcher` currently watches.
    watched_targets: BTreeSet<PathBuf>,
    rescan_pending: bool,
    rewatch_pending: bool,
    /// The last attempt to watch or read the directory failed (logged once, not per retry).
    failing: bool,
}

impl ConfigDirWatcher {
    /// Reads `dir` once, synchronously: the configured clusters (as events) and the state to
    /// hand to [`new`](Self::new). Fails if the directory does not exist or cannot be listed.
    pub fn read_initial(
        dir: impl Into<PathBuf>,
        local_cluster: impl Into<String>,
    ) -> Result<(ConfigDirState, Vec<ClusterConfigEvent>), ConfigDirError> {
        let mut state = ConfigDirState::new(dir, local_cluster);
        let files = scan_dir(state.dir())?;
        let events = state.apply(&files);
        tracing::info!(
            dir = %state.dir().display(),
            clusters = state.len(),
            invalid = state.invalid_clusters().count(),
            "read clustermesh config directory"
        );
        Ok((state, events))
    }

    /// A watcher that continues from `state` and sends later changes to `recipient`.
    pub fn new(state: ConfigDirState, recipient: Recipient<ClusterConfigEvent>) -> Self {
        Self {
            state,
            recipient,
            debounce: DEFAULT_DEBOUNCE,
            watcher: None,
            watched_targets: BTreeSet::new(),
            rescan_pending: false,
            rewatch_pending: false,
            failing: false,
        }
    }

    /// Sets the debounce window (default [`DEFAULT_DEBOUNCE`]).
    pub fn with_debounce(mut self, debounce: Duration) -> Self {
        self.debounce = debounce;
        self
    }

    fn dir(&self) -> &Path {
        self.state.dir()
    }

    fn start_watching(&mut self, ctx: &mut Context<Self>) {
        self.rewatch_pending = false;
        // Dropping the old watcher ends its stream; `finished` below keeps the actor alive.
        self.watcher = None;
        self.watched_targets.clear();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let watch = notify::recommended_watcher(move |event| {
            // A closed channel means the actor is gone; nothing left to tell.
            let _ = tx.send(event);
        })
        .and_then(|mut watcher| {
            watcher.watch(self.state.dir(), RecursiveMode::NonRecursive)?;
            Ok(watcher)
        });
        match watch {
            Ok(watcher) => {
                self.watcher = Some(watcher);
                ctx.add_stream(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)));
                tracing::debug!(dir = %self.dir().display(), "watching clustermesh config directory");
                self.schedule_rescan(ctx);
            }
            Err(err) => {
                if !std::mem::replace(&mut self.failing, true) {
                    tracing::error!(dir = %self.dir().display(), %err, "cannot watch clustermesh config directory; retrying every second");
                }
                self.schedule_rewatch(ctx);
            }
        }
    }

    fn schedule_rescan(&mut self, ctx: &mut Context<Self>) {
        if !self.rescan_pending {
            self.rescan_pending = true;
            ctx.run_later(self.debounce, |this, ctx| this.rescan(ctx));
        }
    }

    fn schedule_rewatch(&mut self, ctx: &mut Context<Self>) {
        if !self.rewatch_pending {
            self.rewatch_pending = true;
            ctx.run_later(RETRY, |this, ctx| this.start_watching(ctx));
        }
    }

    fn rescan(&mut self, ctx: &mut Context<Self>) {
        self.rescan_pending = false;
        let (files, targets) = match scan_with_link_targets(self.state.dir()) {
            Ok(scan) => scan,
            Err(err) => {
                if !std::mem::replace(&mut self.failing, true) {
                    tracing::warn!(%err, "cannot read clustermesh config directory; keeping the known clusters");
                }
                self.schedule_rewatch(ctx);
                return;
            }
        };
        if std::mem::take(&mut self.failing) {
            tracing::info!(dir = %self.dir().display(), "clustermesh config directory is readable again");
        }
        self.watch_targets(targets);
        for event in self.state.apply(&files) {
            self.recipient.do_send(event);
        }
        if !self.recipient.connected() {
            tracing::debug!(
                "cluster config recipient is gone; stopping the config directory watcher"
            );
            ctx.stop();
        }
    }

    /// Watches the symlink targets outside the directory: edits there produce no event in the
    /// directory itself.
    fn watch_targets(&mut self, targets: BTreeSet<PathBuf>) {
        let Some(watcher) = self.watcher.as_mut() else {
            return;
        };
        for gone in self.watched_targets.difference(&targets) {
            // Fails when the target was deleted, which already dropped the watch.
            let _ = watcher.unwatch(gone);
        }
        let mut watched = BTreeSet::new();
        for target in targets {
            let ok = self.watched_targets.contains(&target)
                || match watcher.watch(&target, RecursiveMode::NonRecursive) {
                    Ok(()) => true,
                    Err(err) => {
                        tracing::warn!(target = %target.display(), %err, "cannot watch cluster config symlink target");
                        false
                    }
                };
            if ok {
                watched.insert(target);
            }
        }
        self.watched_targets = watched;
    }
}

/// Events caused by reading files (our own rescans included) change nothing.
fn is_read_only(kind: &EventKind) -> bool {
    matches!(kind, EventKind::Access(access) if *access != AccessKind::Close(AccessMode::Write))
}

impl Actor for ConfigDirWatcher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.start_watching(ctx);
    }
}

impl StreamHandler<notify::Result<notify::Event>> for ConfigDirWatcher {
    fn handle(&mut self, item: notify::Result<notify::Event>, ctx: &mut Self::Context) {
        match item {
            Ok(event) if is_read_only(&event.kind) => {}
            Ok(event) => {
                tracing::trace!(?event, "clustermesh config directory event");
                self.schedule_rescan(ctx);
            }
            Err(err) => {
                tracing::warn!(%err, "error watching clustermesh config directory; rescanning");
                self.schedule_rescan(ctx);
            }
        }
    }

    /// A stream ends when its watcher is replaced; the actor goes on.
    fn finished(&mut self, _ctx: &mut Self::Context) {}
}

/// Stops watching: no event is sent after this is answered.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct StopWatching;

impl Handler<StopWatching> for ConfigDirWatcher {
    type Result = ();

    fn handle(&mut self, _: StopWatching, ctx: &mut Self::Context) {
        self.watcher = None;
        ctx.stop();
    }
}

#[cfg(test)]
mod tests {
    use notify::event::{AccessKind, AccessMode, CreateKind, ModifyKind};

    use super::*;

    #[test]
    fn own_reads_do_not_trigger_rescans() {
        assert!(is_read_only(&EventKind::Access(AccessKind::Open(
            AccessMode::Any
        ))));
        assert!(is_read_only(&EventKind::Access(AccessKind::Read)));
        assert!(!is_read_only(&EventKind::Access(AccessKind::Close(
            AccessMode::Write
        ))));
        assert!(!is_read_only(&EventKind::Modify(ModifyKind::Any)));
        assert!(!is_read_only(&EventKind::Create(CreateKind::Any)));
        assert!(!is_read_only(&EventKind::Any));
    }
}
