//! The elector's decisions, with time paused and moved by hand.

use k8s_openapi::jiff::Timestamp;
use tokio::time::{Instant, advance};

use super::{MS, timing};
use crate::leader_election::{Elector, Observed, Record, Step, Timing, TimingError};

fn wall(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).expect("a time")
}

fn held_by(holder: &str, version: &str, transitions: i32) -> Observed {
    Observed {
        record: Record {
            holder: holder.to_owned(),
            lease_duration_seconds: 15,
            acquire_time: Some(wall(0)),
            renew_time: Some(wall(0)),
            transitions,
        },
        resource_version: version.to_owned(),
    }
}

/// Runs `step` and, for a write, reports it successful; returns the step.
fn step_and_write(elector: &mut Elector, current: Option<&Observed>, at: Timestamp) -> Step {
    let now = Instant::now();
    let step = elector.step(current, now, at);
    match &step {
        Step::Create(record) | Step::Update { record, .. } => elector.written(record.clone(), now),
        Step::Wait { .. } => {}
    }
    step
}

#[tokio::test(start_paused = true)]
async fn no_lease_is_created_and_leadership_lasts_a_renew_deadline() {
    let mut me = Elector::new("me", timing());
    let Step::Create(record) = step_and_write(&mut me, None, wall(1)) else {
        panic!("no lease: create");
    };
    assert_eq!(record.holder, "me");
    assert_eq!(record.lease_duration_seconds, 15);
    assert_eq!(record.transitions, 0);
    assert_eq!(
        (record.acquire_time, record.renew_time),
        (Some(wall(1)), Some(wall(1)))
    );
    assert!(me.is_leader(Instant::now()));

    advance(timing().renew_deadline - MS).await;
    assert!(me.is_leader(Instant::now()) && !me.lost(Instant::now()));
    advance(MS).await;
    assert!(
        !me.is_leader(Instant::now()),
        "no renewal within the renew deadline"
    );
    assert!(me.lost(Instant::now()));
}

#[tokio::test(start_paused = true)]
async fn a_renewal_keeps_acquire_time_and_transitions_and_extends_leadership() {
    let mut me = Elector::new("me", timing());
    let mine = held_by("me", "7", 3);
    let step = step_and_write(&mut me, Some(&mine), wall(5));
    let Step::Update {
        record,
        resource_version,
    } = step
    else {
        panic!("own lease: renew");
    };
    assert_eq!(
        resource_version, "7",
        "the write is guarded by the version read"
    );
    assert_eq!(record.acquire_time, Some(wall(0)), "acquire time kept");
    assert_eq!(record.renew_time, Some(wall(5)));
    assert_eq!(record.transitions, 3, "a renewal is no transition");

    advance(timing().renew_deadline - MS).await;
    let renewed = Observed {
        record,
        resource_version: "8".to_owned(),
    };
    step_and_write(&mut me, Some(&renewed), wall(15));
    advance(timing().renew_deadline - MS).await;
    assert!(
        me.is_leader(Instant::now()),
        "the renewal extended leadership"
    );
}

#[tokio::test(start_paused = true)]
async fn another_holder_is_waited_out_a_lease_duration_from_when_it_was_seen() {
    let mut me = Elector::new("me", timing());
    let theirs = held_by("other", "1", 4);
    let step = me.step(Some(&theirs), Instant::now(), wall(0));
    assert_eq!(
        step,
        Step::Wait {
            holder: "other".to_owned()
        }
    );

    // Still the same record just before a lease duration has passed: wait.
    advance(timing().lease_duration - MS).await;
    assert!(matches!(
        me.step(Some(&theirs), Instant::now(), wall(14)),
        Step::Wait { .. }
    ));
    // A lease duration after it was first seen unchanged: take it over.
    advance(MS).await;
    let Step::Update {
        record,
        resource_version,
    } = me.step(Some(&theirs), Instant::now(), wall(15))
    else {
        panic!("an expired lease is taken over");
    };
    assert_eq!(
        (record.holder.as_str(), resource_version.as_str()),
        ("me", "1")
    );
    assert_eq!(
        record.transitions, 5,
        "a takeover counts one more transition"
    );
    assert_eq!(
        record.acquire_time,
        Some(wall(15)),
        "a new holder's acquire time"
    );
}

#[tokio::test(start_paused = true)]
async fn a_holder_that_renews_is_never_taken_over() {
    let mut me = Elector::new("me", timing());
    // Renewed every retry period for 40 s, well past a lease duration.
    for version in 1..=20 {
        let mut theirs = held_by("other", &version.to_string(), 0);
        theirs.record.renew_time = Some(wall(version));
        assert!(
            matches!(
                me.step(Some(&theirs), Instant::now(), wall(version)),
                Step::Wait { .. }
            ),
            "renewed {version}"
        );
        advance(timing().retry_period).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_released_lease_is_taken_at_once() {
    let mut me = Elector::new("me", timing());
    let mut released = held_by("", "9", 2);
    released.record.lease_duration_seconds = 1;
    let Step::Update { record, .. } = me.step(Some(&released), Instant::now(), wall(0)) else {
        panic!("a released lease is free");
    };
    assert_eq!((record.holder.as_str(), record.transitions), ("me", 3));
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_sees_another_holder_stops_leading() {
    let mut me = Elector::new("me", timing());
    step_and_write(&mut me, None, wall(0));
    assert!(me.is_leader(Instant::now()));
    advance(timing().retry_period).await;
    let theirs = held_by("other", "4", 1);
    assert!(matches!(
        me.step(Some(&theirs), Instant::now(), wall(2)),
        Step::Wait { .. }
    ));
    assert!(!me.is_leader(Instant::now()), "someone else holds it");
    assert!(
        me.release(Instant::now(), wall(2)).is_none(),
        "nothing of ours to release"
    );
}

#[tokio::test(start_paused = true)]
async fn release_gives_the_lease_up_only_while_leading() {
    let mut me = Elector::new("me", timing());
    assert!(me.release(Instant::now(), wall(0)).is_none(), "never led");
    step_and_write(&mut me, Some(&held_by("me", "3", 6)), wall(1));
    let release = me.release(Instant::now(), wall(2)).expect("leading");
    assert_eq!(release.holder, "", "an empty holder");
    assert_eq!(release.lease_duration_seconds, 1);
    assert_eq!(release.transitions, 6);
    advance(timing().renew_deadline).await;
    assert!(
        me.release(Instant::now(), wall(12)).is_none(),
        "lost: not ours to release"
    );
}

#[test]
fn timings_client_go_refuses_are_refused() {
    timing().validate().expect("Cilium's defaults");
    let secs = std::time::Duration::from_secs;
    let bad = [
        (
            Timing {
                lease_duration: secs(10),
                ..timing()
            },
            "lease = renew",
        ),
        (
            Timing {
                retry_period: secs(9),
                ..timing()
            },
            "renew < 1.2 × retry",
        ),
        (
            Timing {
                retry_period: secs(0),
                ..timing()
            },
            "no retry period",
        ),
    ];
    for (timing, why) in bad {
        assert!(timing.validate().is_err(), "{why}");
    }
    assert_eq!(
        Timing {
            lease_duration: std::time::Duration::from_millis(500),
            ..timing()
        }
        .validate(),
        Err(TimingError::LeaseTooShort(
            std::time::Duration::from_millis(500)
        ))
    );
}
