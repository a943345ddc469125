//! The driver with two candidates sharing one in-memory lease, in paused time: one leads at
//! a time, a leader cut off from the lease stops before the other takes over, and a leader
//! that stops hands over at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::timing;
use crate::leader_election::{Elector, Ended, LeaseApi, LeaseError, Observed, Record, Role, run};

/// The lease both candidates see: a record and its version.
type Shared = Arc<Mutex<Option<(Record, u64)>>>;

/// One candidate's access to the shared lease; `cut` makes every call hang (a partition).
struct MemoryLease {
    lease: Shared,
    cut: Arc<AtomicBool>,
}

impl MemoryLease {
    async fn reachable(&self) {
        if self.cut.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Option<(Record, u64)>) -> T) -> T {
        f(&mut self.lease.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl LeaseApi for MemoryLease {
    async fn get(&self) -> Result<Option<Observed>, LeaseError> {
        self.reachable().await;
        Ok(self.with(|lease| {
            lease.as_ref().map(|(record, version)| Observed {
                record: record.clone(),
                resource_version: version.to_string(),
            })
        }))
    }

    async fn create(&self, record: &Record) -> Result<(), LeaseError> {
        self.reachable().await;
        self.with(|lease| {
            if lease.is_some() {
                return Err(LeaseError::Conflict);
            }
            *lease = Some((record.clone(), 1));
            Ok(())
        })
    }

    async fn update(&self, record: &Record, resource_version: &str) -> Result<(), LeaseError> {
        self.reachable().await;
        self.with(|lease| match lease {
            Some((stored, version)) if version.to_string() == resource_version => {
                *stored = record.clone();
                *version += 1;
                Ok(())
            }
            _ => Err(LeaseError::Conflict),
        })
    }
}

/// A running candidate and the instants its role changed.
struct Candidate {
    cut: Arc<AtomicBool>,
    stop: CancellationToken,
    task: JoinHandle<Ended>,
    changes: Arc<Mutex<Vec<(Instant, Role)>>>,
    role: watch::Receiver<Role>,
}

impl Candidate {
    fn start(name: &str, lease: &Shared) -> Self {
        let cut = Arc::new(AtomicBool::new(false));
        let api = MemoryLease {
            lease: Arc::clone(lease),
            cut: Arc::clone(&cut),
        };
        let (sender, role) = watch::channel(Role::Candidate { holder: None });
        let changes = Arc::new(Mutex::new(Vec::new()));
        let mut watcher = role.clone();
        let log = Arc::clone(&changes);
        tokio::spawn(async move {
            while watcher.changed().await.is_ok() {
                let role = watcher.borrow_and_update().clone();
                log.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((Instant::now(), role));
            }
        });
        let stop = CancellationToken::new();
        let token = stop.clone();
        let mut elector = Elector::new(name, timing());
        let task = tokio::spawn(async move { run(&api, &mut elector, &token, &sender).await });
        Self {
            cut,
            stop,
            task,
            changes,
            role,
        }
    }

    async fn until(&mut self, wanted: &Role) -> Instant {
        self.role
            .wait_for(|role| role == wanted)
            .await
            .expect("running");
        Instant::now()
    }

    /// The roles this candidate went through, with when.
    fn log(&self) -> Arc<Mutex<Vec<(Instant, Role)>>> {
        Arc::clone(&self.changes)
    }
}

fn holder(lease: &Shared) -> String {
    let lease = lease.lock().unwrap_or_else(PoisonError::into_inner);
    lease
        .as_ref()
        .map(|(record, _)| record.holder.clone())
        .unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn a_cut_off_leader_stops_before_the_other_takes_over() {
    let lease: Shared = Arc::default();
    let mut a = Candidate::start("a", &lease);
    a.until(&Role::Leader).await;
    let mut b = Candidate::start("b", &lease);
    // B sees A renew every retry period and never takes over.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(holder(&lease), "a");
    assert_eq!(
        *b.role.borrow(),
        Role::Candidate {
            holder: Some("a".to_owned())
        }
    );

    let cut_at = Instant::now();
    a.cut.store(true, Ordering::SeqCst);
    let lost_at = a.until(&Role::Lost).await;
    assert_eq!(a.task.await.expect("task"), Ended::Lost);
    let led_at = b.until(&Role::Leader).await;
    assert_eq!(holder(&lease), "b");
    assert!(
        lost_at < led_at,
        "A stopped ({lost_at:?}) before B led ({led_at:?})"
    );
    // A's last renewal was within a retry period before the cut: it lost a renew deadline
    // after it, B took over a lease duration after seeing it.
    let after_cut = |at: Instant| at.duration_since(cut_at);
    assert!(
        after_cut(lost_at) <= timing().renew_deadline,
        "{:?}",
        after_cut(lost_at)
    );
    assert!(
        after_cut(led_at) >= timing().lease_duration - timing().retry_period,
        "{:?}",
        after_cut(led_at)
    );
    assert!(
        after_cut(led_at) <= timing().lease_duration + 2 * timing().retry_period,
        "{:?}",
        after_cut(led_at)
    );
    b.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_stops_hands_over_within_a_retry_period() {
    let lease: Shared = Arc::default();
    let mut a = Candidate::start("a", &lease);
    a.until(&Role::Leader).await;
    let mut b = Candidate::start("b", &lease);
    tokio::time::sleep(Duration::from_secs(30)).await;

    let stopped_at = Instant::now();
    let a_log = a.log();
    a.stop.cancel();
    assert_eq!(a.task.await.expect("task"), Ended::Stopped);
    let after_stop = holder(&lease);
    assert!(
        after_stop.is_empty() || after_stop == "b",
        "released, or B took it: {after_stop:?}"
    );
    let led_at = b.until(&Role::Leader).await;
    assert!(
        led_at.duration_since(stopped_at) <= timing().retry_period,
        "took {:?}",
        led_at.duration_since(stopped_at)
    );
    let transitions = lease
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
        .map(|(r, _)| r.transitions);
    assert_eq!(transitions, Some(1), "one hand-over");
    let a_roles: Vec<Role> = a_log
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .map(|(_, role)| role.clone())
        .collect();
    assert!(
        !a_roles.contains(&Role::Lost),
        "a stop is no loss: {a_roles:?}"
    );
    assert!(a_roles.contains(&Role::Leader), "{a_roles:?}");
    b.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn never_two_leaders_at_once() {
    let lease: Shared = Arc::default();
    let mut a = Candidate::start("a", &lease);
    let mut b = Candidate::start("b", &lease);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let leaders = [&a, &b]
        .iter()
        .filter(|c| *c.role.borrow() == Role::Leader)
        .count();
    assert_eq!(leaders, 1, "exactly one of two leads");
    let (leader, other) = if *a.role.borrow() == Role::Leader {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    leader.cut.store(true, Ordering::SeqCst);
    let lost_at = leader.until(&Role::Lost).await;
    let led_at = other.until(&Role::Leader).await;
    assert!(lost_at < led_at);
    other.stop.cancel();
}
