//! The ENI allocator's edges: consistency, the handshake, readiness, restarts.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::*;
use crate::snapshot::{Eni, ReleaseState, Watermarks};

fn ip(text: &str) -> Ipv4Addr {
    text.parse().unwrap()
}

fn eni(id: &str, number: i64, subnet: &str) -> Eni {
    Eni {
        id: id.to_owned(),
        mac: format!("02:00:00:00:00:{number:02x}"),
        number,
        subnet: subnet.parse().unwrap(),
        vpc_cidrs: vec!["10.0.0.0/16".parse().unwrap()],
    }
}

/// A snapshot of `generation` with ENIs eni-1 (10.0.1.0/24, device 1) and eni-2
/// (10.0.2.0/24, device 2), the pool `pool` (IP → ENI) and pre-allocate `pre`.
fn snapshot(generation: &str, pool: &[(&str, &str)], pre: u32) -> Snapshot {
    Snapshot {
        generation: generation.to_owned(),
        enis: BTreeMap::from([
            ("eni-1".to_owned(), eni("eni-1", 1, "10.0.1.0/24")),
            ("eni-2".to_owned(), eni("eni-2", 2, "10.0.2.0/24")),
        ]),
        pool: pool
            .iter()
            .map(|(address, eni)| (ip(address), (*eni).to_owned()))
            .collect(),
        watermarks: Watermarks {
            pre_allocate: pre,
            ..Watermarks::default()
        },
        ..Snapshot::default()
    }
}

fn with_release(mut snapshot: Snapshot, states: &[(&str, &str)]) -> Snapshot {
    for (address, state) in states {
        snapshot
            .release
            .insert(ip(address), ReleaseState::from_wire(state));
    }
    snapshot
}

fn pool(dir: &tempfile::TempDir) -> EniPool {
    EniPool::restore(Checkpoint::in_dir(dir.path())).unwrap()
}

fn accepted(offer: &Offer) -> bool {
    matches!(offer, Offer::Accepted { .. })
}

#[test]
fn allocate_takes_a_free_ip_outside_the_handshake_with_its_eni_from_the_same_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let mut pool = pool(&dir);
    let snapshot = with_release(
        snapshot(
            "g1",
            &[
                ("10.0.1.10", "eni-1"),
                ("10.0.1.11", "eni-1"),
                ("10.0.1.12", "eni-1"),
                ("10.0.1.13", "eni-1"),
                ("10.0.2.10", "eni-2"),
            ],
            0,
        ),
        &[
            ("10.0.1.10", "marked-for-release"),
            ("10.0.1.11", "ready-for-release"),
            ("10.0.1.12", "released"),
            // Ends the handshake: the address may be handed out.
            ("10.0.1.13", "do-not-release"),
        ],
    );
    assert!(accepted(&pool.offer(snapshot, Instant::now())));
    let first = pool.allocate("c1/eth0", "default/a").unwrap();
    assert!(!first.existing);
    assert_eq!(
        first.allocation,
        Allocation {
            owner: "c1/eth0".into(),
            pod: "default/a".into(),
            ip: ip("10.0.1.13"),
            prefix_len: 32,
            gateway: ip("10.0.1.1"),
            eni: Some(EniAttachment {
                id: "eni-1".into(),
                mac: "02:00:00:00:00:01".into(),
                number: 1,
                vpc_cidrs: vec!["10.0.0.0/16".parse().unwrap()],
            }),
            generation: "g1".into(),
        }
    );
    let second = pool.allocate("c2/eth0", "").unwrap().allocation;
    assert_eq!(
        (second.ip, second.gateway, second.eni.unwrap().number),
        (ip("10.0.2.10"), ip("10.0.2.1"), 2)
    );
    // Everything else is in a handshake.
    let err = pool.allocate("c3/eth0", "").unwrap_err();
    assert!(
        matches!(
            err,
            AllocateError::Exhausted {
                pool: 5,
                in_use: 2,
                in_handshake: 3
            }
        ),
        "{err}"
    );
    assert_eq!(err.reason(), "exhausted");
}

#[test]
fn an_owner_gets_its_ip_back_and_a_release_frees_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut pool = pool(&dir);
    pool.offer(snapshot("g1", &[("10.0.1.10", "eni-1")], 0), Instant::now());
    let first = pool.allocate("c1/eth0", "default/a").unwrap();
    let again = pool.allocate("c1/eth0", "default/other").unwrap();
    assert!(again.existing);
    assert_eq!(again.allocation, first.allocation);
    assert!(matches!(
        pool.allocate("c2/eth0", ""),
        Err(AllocateError::Exhausted { .. })
    ));
    let released = pool.release("c1/eth0").unwrap().unwrap();
    assert_eq!(released.ip, ip("10.0.1.10"));
    assert_eq!(pool.release("c1/eth0").unwrap(), None);
    assert_eq!(
        pool.allocate("c2/eth0", "").unwrap().allocation.ip,
        ip("10.0.1.10")
    );
    assert!(matches!(
        pool.allocate("", ""),
        Err(AllocateError::InvalidOwner)
    ));
    assert!(matches!(pool.release(""), Err(ReleaseError::InvalidOwner)));
}

#[test]
fn an_inconsistent_snapshot_is_never_used_counted_once_and_the_next_generation_taken() {
    let dir = tempfile::tempdir().unwrap();
    let mut pool = pool(&dir);
    let now = Instant::now();
    // The very first snapshot is bad: nothing to allocate from.
    let bad = snapshot("g1", &[("10.0.3.10", "eni-3")], 0);
    let Offer::Inconsistent {
        generation,
        why,
        counted,
    } = pool.offer(bad.clone(), now)
    else {
        panic!("accepted an inconsistent snapshot");
    };
    assert_eq!((generation.as_str(), counted), ("g1", true));
    assert_eq!(
        why.missing,
        BTreeMap::from([(ip("10.0.3.10"), "eni-3".to_owned())])
    );
    assert!(matches!(
        pool.allocate("a", ""),
        Err(AllocateError::NoSnapshot)
    ));
    // Resent after a reconnect: not counted again.
    assert!(matches!(
        pool.offer(bad, now),
        Offer::Inconsistent { counted: false, .. }
    ));
    assert_eq!(pool.status(now).inconsistent_snapshots, 1);

    assert!(accepted(
        &pool.offer(snapshot("g2", &[("10.0.1.10", "eni-1")], 0), now)
    ));
    assert_eq!(pool.allocate("a", "").unwrap().allocation.generation, "g2");

    // A bad g3 (its new IP names a missing ENI): g2 stays held, and its IPs only are used.
    let mut g3 = snapshot("g3", &[("10.0.1.10", "eni-1"), ("10.0.1.11", "eni-1")], 0);
    g3.pool.insert(ip("10.0.3.10"), "eni-3".into());
    g3.enis.remove("eni-2");
    assert!(matches!(
        pool.offer(g3, now),
        Offer::Inconsistent { counted: true, .. }
    ));
    assert_eq!(pool.snapshot().unwrap().generation, "g2");
    assert!(matches!(
        pool.allocate("b", ""),
        Err(AllocateError::Exhausted { .. })
    ));
    let status = pool.status(now);
    assert_eq!(
        (
            status.inconsistent_snapshots,
            status.awaiting_after.as_deref()
        ),
        (2, Some("g3"))
    );
    // A snapshot the conversion could not fully read is refused too.
    let mut unreadable = snapshot("g4", &[("10.0.1.10", "eni-1")], 0);
    unreadable
        .malformed
        .push("pool IP \"10.0.1.x\" is not an IPv4 address".into());
    assert!(matches!(
        pool.offer(unreadable, now),
        Offer::Inconsistent { .. }
    ));

    assert!(accepted(&pool.offer(
        snapshot("g5", &[("10.0.1.10", "eni-1"), ("10.0.1.11", "eni-1")], 0),
        now
    )));
    let b = pool.allocate("b", "").unwrap().allocation;
    assert_eq!((b.ip, b.generation.as_str()), (ip("10.0.1.11"), "g5"));
    let status = pool.status(now);
    assert_eq!(
        (status.inconsistent_snapshots, status.awaiting_after),
        (3, None)
    );
}

#[test]
fn release_answers_follow_use() {
    // (handed out?, state → answer): only marked IPs are answered.
    for (handed_out, state, answer) in [
        (
            false,
            "marked-for-release",
            Some(ReleaseAnswer::ReadyForRelease),
        ),
        (
            true,
            "marked-for-release",
            Some(ReleaseAnswer::DoNotRelease),
        ),
        (false, "ready-for-release", None),
        (false, "released", None),
        (true, "do-not-release", None),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut pool = pool(&dir);
        let now = Instant::now();
        pool.offer(snapshot("g1", &[("10.0.1.10", "eni-1")], 0), now);
        if handed_out {
            // Allocated before the mark reached the agent.
            pool.allocate("a", "").unwrap();
        }
        let marked = with_release(
            snapshot("g2", &[("10.0.1.10", "eni-1")], 0),
            &[("10.0.1.10", state)],
        );
        assert!(accepted(&pool.offer(marked, now)));
        let answers = pool.release_answers();
        assert_eq!(
            answers.get(&ip("10.0.1.10")).copied(),
            answer,
            "handed out {handed_out}, {state}"
        );
    }
}

#[test]
fn a_snapshot_with_marked_ips_asks_for_a_report_that_answers_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut pool = pool(&dir);
    let now = Instant::now();
    pool.offer(
        snapshot("g1", &[("10.0.1.10", "eni-1"), ("10.0.1.11", "eni-1")], 0),
        now,
    );
    assert!(!pool.report_due() && pool.take_report().is_none());
    pool.allocate("c1/eth0", "default/a").unwrap();
    pool.allocate(ROUTER_OWNER, "").unwrap();
    let report = pool.take_report().unwrap();
    assert_eq!(report.generation, "g1");
    assert_eq!(
        report.used,
        [
            UsedIp {
                ip: ip("10.0.1.10"),
                owner: "default/a".into(),
                resource: "eni-1".into()
            },
            UsedIp {
                ip: ip("10.0.1.11"),
                owner: "router".into(),
                resource: "eni-1".into()
            },
        ]
    );
    assert!(report.answers.is_empty());
    assert!(pool.take_report().is_none(), "taking clears the due flag");

    pool.release("c1/eth0").unwrap();
    let marked = with_release(
        snapshot("g2", &[("10.0.1.10", "eni-1"), ("10.0.1.11", "eni-1")], 0),
        &[("10.0.1.10", "marked-for-release")],
    );
    pool.take_report();
    pool.offer(marked, now);
    let report = pool.take_report().unwrap();
    assert_eq!(report.generation, "g2");
    assert_eq!(
        report.answers,
        BTreeMap::from([(ip("10.0.1.10"), ReleaseAnswer::ReadyForRelease)])
    );
    // From the mark on, the IP is never handed out.
    assert!(matches!(
        pool.allocate("c2/eth0", ""),
        Err(AllocateError::Exhausted { .. })
    ));
    pool.mark_report_due();
    assert!(pool.take_report().is_some());

    // Released and gone from the pool: a report of that generation ends the handshake.
    let released = with_release(
        snapshot("g3", &[("10.0.1.11", "eni-1")], 0),
        &[("10.0.1.10", "released")],
    );
    pool.offer(released, now);
    let report = pool.take_report().expect("a report for the released IP");
    assert_eq!(report.generation, "g3");
    // Released but still in the pool (the operator has not republished yet): no report.
    let pending = with_release(
        snapshot("g4", &[("10.0.1.10", "eni-1"), ("10.0.1.11", "eni-1")], 0),
        &[("10.0.1.10", "released")],
    );
    pool.offer(pending, now);
    assert!(pool.take_report().is_none());
}

#[test]
fn ready_latches_once_the_pool_held_required_ips_it_may_hand_out() {
    // (pre, min, pool size, of them in a handshake, handed out before → ready)
    for (pre, min, size, handshake, used, ready) in [
        (0, 0, 0, 0, 0, false),
        (0, 0, 1, 0, 0, true),
        (8, 0, 7, 0, 0, false),
        (8, 0, 8, 0, 0, true),
        (8, 16, 8, 0, 0, false),
        (8, 16, 16, 0, 0, true),
        (8, 0, 8, 1, 0, false),
        // Handed-out IPs count: a restarted agent's full pool is ready.
        (2, 0, 2, 0, 2, true),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut pool = pool(&dir);
        let now = Instant::now();
        let addresses: Vec<String> = (0..size).map(|i| format!("10.0.1.{}", 10 + i)).collect();
        let entries: Vec<(&str, &str)> = addresses.iter().map(|a| (a.as_str(), "eni-1")).collect();
        let mut first = snapshot("g0", &entries, pre);
        first.watermarks.min_allocate = min;
        // A first snapshot without watermarks to hand the `used` IPs out from.
        let mut warm = first.clone();
        warm.generation = "warm".into();
        warm.watermarks = Watermarks {
            min_allocate: 1000,
            ..Watermarks::default()
        };
        pool.offer(warm, now);
        for i in 0..used {
            pool.allocate(&format!("pod-{i}"), "").unwrap();
        }
        let marked: Vec<(&str, &str)> = addresses
            .iter()
            .take(handshake)
            .map(|a| (a.as_str(), "marked-for-release"))
            .collect();
        let offer = pool.offer(with_release(first, &marked), now);
        assert_eq!(
            pool.is_ready(),
            ready,
            "pre {pre} min {min} size {size} handshake {handshake} used {used}"
        );
        assert!(matches!(offer, Offer::Accepted { became_ready, .. } if became_ready == ready));
    }

    // Latched: a smaller pool later does not undo it.
    let dir = tempfile::tempdir().unwrap();
    let mut pool = pool(&dir);
    let now = Instant::now();
    pool.offer(
        snapshot("g1", &[("10.0.1.10", "eni-1"), ("10.0.1.11", "eni-1")], 2),
        now,
    );
    assert!(pool.is_ready());
    pool.offer(snapshot("g2", &[("10.0.1.10", "eni-1")], 2), now);
    assert!(pool.is_ready());
    assert_eq!(pool.required(), Some(2));
}

#[test]
fn a_restart_gives_each_owner_its_ip_and_hands_out_no_ip_twice() {
    let dir = tempfile::tempdir().unwrap();
    let entries = [
        ("10.0.1.10", "eni-1"),
        ("10.0.1.11", "eni-1"),
        ("10.0.2.10", "eni-2"),
    ];
    let before = {
        let mut pool = pool(&dir);
        pool.offer(snapshot("g1", &entries, 0), Instant::now());
        let router = pool.allocate(ROUTER_OWNER, "").unwrap().allocation;
        let pod = pool.allocate("c1/eth0", "default/a").unwrap().allocation;
        (router, pod)
    };
    let mut pool = pool(&dir);
    // Before any snapshot, restored owners get their IP back, with its ENI.
    let router = pool.allocate(ROUTER_OWNER, "").unwrap();
    assert!(router.existing);
    assert_eq!(router.allocation, before.0);
    assert_eq!(pool.router_ip(), Some(before.0.ip));
    assert!(matches!(
        pool.allocate("new", ""),
        Err(AllocateError::NoSnapshot)
    ));
    pool.offer(snapshot("g2", &entries, 0), Instant::now());
    assert_eq!(
        pool.allocate("c1/eth0", "default/a").unwrap().allocation,
        before.1
    );
    let new = pool.allocate("new", "").unwrap().allocation;
    assert_eq!((new.ip, new.generation.as_str()), (ip("10.0.2.10"), "g2"));
}

#[test]
fn a_restored_allocation_outside_the_first_pool_is_kept_and_reported_as_an_orphan() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut pool = pool(&dir);
        pool.offer(
            snapshot("g1", &[("10.0.1.10", "eni-1"), ("10.0.1.11", "eni-1")], 0),
            Instant::now(),
        );
        pool.allocate("c1/eth0", "default/a").unwrap();
        pool.allocate("c2/eth0", "default/b").unwrap();
    }
    let mut pool = pool(&dir);
    let now = Instant::now();
    // The operator's pool lost 10.0.1.10 (it should not, while the agent reported it used).
    let Offer::Accepted {
        first: true,
        orphaned,
        ..
    } = pool.offer(
        snapshot("g2", &[("10.0.1.11", "eni-1"), ("10.0.1.12", "eni-1")], 0),
        now,
    )
    else {
        panic!("refused")
    };
    assert_eq!(orphaned.len(), 1);
    assert_eq!(
        (orphaned[0].owner.as_str(), orphaned[0].ip),
        ("c1/eth0", ip("10.0.1.10"))
    );
    let status = pool.status(now);
    assert_eq!(status.orphans, [ip("10.0.1.10")]);
    assert_eq!(status.used, 2);
    // Kept: its owner gets it back; not reported used (the operator refuses it).
    assert_eq!(
        pool.allocate("c1/eth0", "").unwrap().allocation.ip,
        ip("10.0.1.10")
    );
    assert_eq!(
        pool.used().iter().map(|u| u.ip).collect::<Vec<_>>(),
        [ip("10.0.1.11")]
    );
    // The next snapshot does not report it again; its IP back in the pool ends it.
    assert!(matches!(
        pool.offer(snapshot("g3", &[("10.0.1.11", "eni-1")], 0), now),
        Offer::Accepted { ref orphaned, .. } if orphaned.is_empty()
    ));
    pool.offer(
        snapshot("g4", &[("10.0.1.10", "eni-1"), ("10.0.1.11", "eni-1")], 0),
        now,
    );
    assert!(pool.status(now).orphans.is_empty());
    assert_eq!(pool.used().len(), 2);
    // Released, it is gone.
    pool.release("c1/eth0").unwrap();
    assert_eq!(pool.status(now).used, 1);
}

#[test]
fn a_checkpoint_that_cannot_be_written_hands_out_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut pool = pool(&dir);
    pool.offer(snapshot("g1", &[("10.0.1.10", "eni-1")], 0), Instant::now());
    // The temporary file's name taken by a directory: every write fails.
    std::fs::create_dir(dir.path().join("ipam.json.tmp")).unwrap();
    let err = pool.allocate("a", "").unwrap_err();
    assert_eq!(err.reason(), "checkpoint");
    assert!(err.to_string().contains("ipam.json"), "{err}");
    assert_eq!(pool.status(Instant::now()).used, 0);
    assert!(!pool.report_due());
    std::fs::remove_dir(dir.path().join("ipam.json.tmp")).unwrap();
    pool.allocate("a", "").unwrap();
    std::fs::create_dir(dir.path().join("ipam.json.tmp")).unwrap();
    assert!(matches!(
        pool.release("a"),
        Err(ReleaseError::Checkpoint(_))
    ));
    assert!(pool.allocation("a").is_some(), "the IP stays allocated");
}

#[test]
fn a_corrupt_checkpoint_fails_the_restore_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ipam.json"), "{not json").unwrap();
    let err = EniPool::restore(Checkpoint::in_dir(dir.path())).unwrap_err();
    assert!(matches!(err, CheckpointError::Corrupt { .. }), "{err}");
    assert!(
        err.to_string()
            .contains(&dir.path().join("ipam.json").display().to_string())
    );
}

#[test]
fn the_generation_age_counts_from_its_first_arrival() {
    let dir = tempfile::tempdir().unwrap();
    let mut pool = pool(&dir);
    let t0 = Instant::now();
    assert_eq!(pool.status(t0).age, None);
    pool.offer(snapshot("g1", &[("10.0.1.10", "eni-1")], 0), t0);
    // Resent (a reconnect): the same generation, still as old.
    assert_eq!(
        pool.offer(
            snapshot("g1", &[("10.0.1.10", "eni-1")], 0),
            t0 + Duration::from_secs(5)
        ),
        Offer::Unchanged
    );
    assert_eq!(
        pool.status(t0 + Duration::from_secs(9)).age,
        Some(Duration::from_secs(9))
    );
    pool.offer(
        snapshot("g2", &[("10.0.1.10", "eni-1")], 0),
        t0 + Duration::from_secs(10),
    );
    let status = pool.status(t0 + Duration::from_secs(12));
    assert_eq!(
        (status.generation.as_deref(), status.age),
        (Some("g2"), Some(Duration::from_secs(2)))
    );
}
