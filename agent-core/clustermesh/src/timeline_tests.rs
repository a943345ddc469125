use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meshwork_types::{Resource, SyncKind};
use tokio::time::Instant;

use super::*;
use crate::barrier::{WaitError, WaitOutcome};

fn connected(cluster: &str) -> Step {
    Step::Connected {
        cluster: Arc::from(cluster),
    }
}

fn offsets(timeline: &Timeline) -> Vec<u64> {
    timeline
        .entries()
        .iter()
        .map(|e| u64::try_from(e.offset.as_millis()).unwrap())
        .collect()
}

#[test]
fn steps_are_kept_in_time_order_from_the_start() {
    let start = Instant::now();
    let mut timeline = Timeline::new(start, SystemTime::UNIX_EPOCH, 16);
    timeline.record(start + Duration::from_millis(20), connected("c2"));
    // Recorded late by its thread, it still lands where it happened.
    timeline.record(start + Duration::from_millis(10), connected("c1"));
    // Equal offsets keep the order they were recorded in.
    let list_done = Step::ListDone {
        cluster: Arc::from("c1"),
        resource: Resource::Nodes,
    };
    timeline.record(start + Duration::from_millis(20), list_done.clone());
    // Before the start (a clock read just before it) counts as the start.
    timeline.record(start - Duration::from_millis(5), connected("c0"));

    assert_eq!(offsets(&timeline), [0, 0, 10, 20, 20]);
    let steps: Vec<&Step> = timeline.entries().iter().map(|e| &e.step).collect();
    assert_eq!(
        steps,
        [
            &Step::Started,
            &connected("c0"),
            &connected("c1"),
            &connected("c2"),
            &list_done
        ]
    );
    assert_eq!(timeline.dropped(), 0);
    assert_eq!(timeline.started_at(), SystemTime::UNIX_EPOCH);
}

#[test]
fn a_full_class_keeps_its_first_steps_and_counts_the_rest_without_crowding_the_other() {
    let start = Instant::now();
    let mut timeline = Timeline::new(start, SystemTime::UNIX_EPOCH, 3);
    let at = |ms| start + Duration::from_millis(ms);
    for (ms, cluster) in (1..).zip(["c1", "c2", "c3", "c4", "c5"]) {
        timeline.record(at(ms), connected(cluster));
    }
    // A reconnect is no step of the start: neither kept nor counted.
    timeline.record(at(6), connected("c1"));
    // The agent's own steps have room of their own (the start is one of them).
    for (ms, endpoint) in (10..).zip(1..=3) {
        let step = Step::EndpointRegenerated {
            endpoint,
            error: None,
        };
        timeline.record(at(ms), step);
    }
    assert_eq!(offsets(&timeline), [0, 1, 2, 3, 10, 11]);
    assert_eq!(timeline.dropped(), 3);
}

#[test]
fn a_wait_outcome_reads_as_its_end() {
    assert_eq!(WaitEnd::of(&Ok(WaitOutcome::Synced)), WaitEnd::Synced);
    assert_eq!(
        WaitEnd::of(&Ok(WaitOutcome::BreakerFired {
            pending: vec!["c2".to_owned()]
        })),
        WaitEnd::Breaker {
            pending: vec!["c2".to_owned()]
        }
    );
    assert_eq!(
        WaitEnd::of(&Err(WaitError::CallerDeadline {
            kind: SyncKind::IpIdentities,
            waited: Duration::ZERO,
        })),
        WaitEnd::Timeout
    );
    assert_eq!(
        WaitEnd::of(&Err(WaitError::Disconnected("c2".to_owned()))),
        WaitEnd::Failed("remote cluster c2 disconnected".to_owned())
    );
}

#[tokio::test(start_paused = true)]
async fn the_recorder_stamps_steps_with_the_time_since_its_start() {
    let recorder = TimelineRecorder::start();
    let shared = recorder.clone();
    tokio::time::advance(Duration::from_millis(250)).await;
    shared.record(connected("c2"));
    tokio::time::advance(Duration::from_millis(750)).await;
    recorder.wait_returned(Waiter::Readiness, SyncKind::Nodes, &Ok(WaitOutcome::Synced));

    let timeline = recorder.snapshot().expect("an enabled recorder");
    assert_eq!(offsets(&timeline), [0, 250, 1000]);
    assert_eq!(
        timeline.entries()[2].step,
        Step::WaitReturned {
            waiter: Waiter::Readiness,
            kind: SyncKind::Nodes,
            end: WaitEnd::Synced,
        }
    );
}

#[test]
fn a_disabled_recorder_records_nothing() {
    let recorder = TimelineRecorder::default();
    recorder.record(connected("c2"));
    assert!(recorder.snapshot().is_none());
}

#[actix_rt::test]
async fn the_barrier_records_a_list_done_once_every_consumer_applied_it() {
    use actix::Actor as _;

    use crate::barrier::{Consumer, SyncBarrier};
    use crate::barrier_actor::{BarrierUpdate, SyncBarrierActor};

    let recorder = TimelineRecorder::start();
    let barrier = SyncBarrier::new(Duration::from_secs(60))
        .with_consumer(Consumer::Datapath)
        .with_consumer(Consumer::WireGuard);
    let actor = SyncBarrierActor::new(barrier)
        .with_timeline(recorder.clone())
        .start();
    let cluster: Arc<str> = Arc::from("c2");
    let applied = |incarnation, consumer| BarrierUpdate::Applied {
        cluster: Arc::clone(&cluster),
        incarnation,
        resource: Resource::Nodes,
        consumer,
    };
    let list_dones = || {
        recorder
            .snapshot()
            .unwrap()
            .entries()
            .iter()
            .filter(|e| matches!(e.step, Step::ListDone { .. }))
            .count()
    };
    let updates = [
        BarrierUpdate::ClusterAdded {
            cluster: Arc::clone(&cluster),
            incarnation: 1,
        },
        BarrierUpdate::Delivered {
            cluster: Arc::clone(&cluster),
            incarnation: 1,
            resource: Resource::Nodes,
        },
        applied(1, Consumer::Datapath),
        // Another incarnation's acknowledgement completes nothing.
        applied(7, Consumer::WireGuard),
    ];
    for update in updates {
        actor.send(update).await.unwrap();
    }
    assert_eq!(list_dones(), 0, "WireGuard has not applied the nodes yet");
    actor.send(applied(1, Consumer::WireGuard)).await.unwrap();
    actor.send(applied(1, Consumer::WireGuard)).await.unwrap();
    let timeline = recorder.snapshot().unwrap();
    assert_eq!(
        timeline.entries().last().unwrap().step,
        Step::ListDone {
            cluster: Arc::clone(&cluster),
            resource: Resource::Nodes,
        }
    );
    assert_eq!(list_dones(), 1, "recorded once: {:?}", timeline.entries());
}
