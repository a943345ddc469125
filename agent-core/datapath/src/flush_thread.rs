//! A thread that writes the ipcache map behind the writer: while the kernel inserts one
//! batch (most of a large list's cost is the kernel's LPM insert), the writer does the next
//! batch's bookkeeping on another core. At most one batch is in flight; the writer waits for
//! it before anything that must see the map written (a list-done's acknowledgement, local
//! endpoints, its own end).

use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use super::ipcache_writer::{PendingWrites, WriteOutcome};
use super::maps::IpCacheMap;

type Job = (IpCacheMap, PendingWrites);
type Done = (IpCacheMap, WriteOutcome);

/// Called on the flush thread once a batch is written and its outcome can be collected.
pub type OnFlushed = Arc<dyn Fn() + Send + Sync>;

/// The thread and its two channels. The map travels with each job and comes back with its
/// outcome, so only one side holds it at a time.
pub(crate) struct FlushThread {
    jobs: Option<mpsc::Sender<Job>>,
    done: mpsc::Receiver<Done>,
    thread: Option<JoinHandle<()>>,
}

impl FlushThread {
    /// Starts the thread (`None` when the OS refuses one: the writer then writes itself);
    /// `on_flushed` is called after each batch.
    pub(crate) fn start(on_flushed: Option<OnFlushed>) -> Option<Self> {
        let (jobs, incoming) = mpsc::channel::<Job>();
        let (finished, done) = mpsc::channel::<Done>();
        let thread = std::thread::Builder::new()
            .name("ipcache-flush".into())
            .spawn(move || {
                for (mut map, pending) in incoming {
                    let outcome = pending.write(&mut map);
                    if finished.send((map, outcome)).is_err() {
                        break;
                    }
                    if let Some(on_flushed) = &on_flushed {
                        on_flushed();
                    }
                }
            })
            .inspect_err(|err| tracing::warn!(%err, "no ipcache flush thread; writing in line"))
            .ok()?;
        Some(Self {
            jobs: Some(jobs),
            done,
            thread: Some(thread),
        })
    }

    /// Hands `map` and `pending` to the thread; gives them back if it is gone.
    pub(crate) fn send(&self, map: IpCacheMap, pending: PendingWrites) -> Option<Job> {
        match &self.jobs {
            Some(jobs) => jobs.send((map, pending)).err().map(|err| err.0),
            None => Some((map, pending)),
        }
    }

    /// The map and the outcome of the job in flight if it is written, without waiting.
    pub(crate) fn try_wait(&self) -> Option<Done> {
        self.done.try_recv().ok()
    }

    /// The map and the outcome of the job in flight, once written.
    pub(crate) fn wait(&self) -> Done {
        // The thread answers every job it takes and only ends once the sender is dropped
        // (or it panicked, a bug: the map is lost with it).
        self.done
            .recv()
            .expect("the ipcache flush thread ended with the map")
    }
}

impl Drop for FlushThread {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            drop(thread.join());
        }
    }
}
