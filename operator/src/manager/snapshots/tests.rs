//! [`Snapshots`] without actix: what watchers get, and which generations a report may answer.

use super::*;
use crate::cilium_node::{AllocationIp, CiliumNodeSpec, CiliumNodeStatus, EniEntry};

/// node-1 at `version`: eni-1 with pool .1–.3; .2 marked, .3 and .9 released (.9 gone from
/// the pool) — or, unpublished, without any ENI.
fn node(version: u64, published: bool) -> CiliumNode {
    let mut node = CiliumNode::new("node-1", CiliumNodeSpec::default());
    node.metadata.resource_version = Some(version.to_string());
    let mut status = CiliumNodeStatus::default();
    if published {
        status.eni.enis.insert(
            "eni-1".to_owned(),
            EniEntry {
                id: "eni-1".to_owned(),
                ..EniEntry::default()
            },
        );
        for last in 1..=3 {
            node.spec.ipam.pool.insert(
                format!("10.0.0.{last}"),
                AllocationIp {
                    owner: String::new(),
                    resource: "eni-1".to_owned(),
                },
            );
        }
        for (ip, state) in [
            ("10.0.0.2", MARKED_FOR_RELEASE),
            ("10.0.0.3", RELEASED),
            ("10.0.0.9", RELEASED),
        ] {
            status
                .ipam
                .release_ips
                .insert(ip.to_owned(), state.to_owned());
        }
    }
    node.status = Some(status);
    node
}

fn generation_of(receiver: &watch::Receiver<Published>) -> Option<String> {
    match &*receiver.borrow() {
        Published::Node(node) => node.metadata.resource_version.clone(),
        _ => None,
    }
}

#[test]
fn an_unpublished_node_has_a_channel_but_no_generation() {
    let mut snapshots = Snapshots::new();
    assert!(!snapshots.observe(&node(3, false)));
    let receiver = snapshots.subscribe("node-1").expect("driven");
    assert!(matches!(*receiver.borrow(), Published::Pending));
    assert_eq!(snapshots.check("node-1", "3"), GenerationCheck::Unpublished);
    assert_eq!(snapshots.check("node-2", "3"), GenerationCheck::Unknown);
    assert!(snapshots.subscribe("node-2").is_none());
}

#[test]
fn watchers_get_each_newer_generation_and_never_an_older_one() {
    let mut snapshots = Snapshots::new();
    snapshots.observe(&node(3, false));
    let mut receiver = snapshots.subscribe("node-1").expect("driven");
    assert!(snapshots.observe(&node(5, true)));
    assert!(receiver.has_changed().expect("open"));
    receiver.mark_unchanged();
    assert_eq!(generation_of(&receiver).as_deref(), Some("5"));
    assert!(
        !snapshots.observe(&node(5, true)),
        "the same generation again"
    );
    assert!(!snapshots.observe(&node(4, true)), "an older one");
    assert!(!receiver.has_changed().expect("open"));
    assert!(snapshots.observe(&node(6, true)));
    assert_eq!(generation_of(&receiver).as_deref(), Some("6"));
    // A late watcher starts from the newest.
    let late = snapshots.subscribe("node-1").expect("driven");
    assert_eq!(generation_of(&late).as_deref(), Some("6"));
}

#[test]
fn a_report_may_answer_only_a_recent_generation() {
    let mut snapshots = Snapshots::new();
    let first = 100;
    let last = first + u64::try_from(HISTORY).expect("small") + 3;
    for version in first..=last {
        snapshots.observe(&node(version, true));
    }
    let latest = last.to_string();
    let GenerationCheck::Published(answered) = snapshots.check("node-1", &latest) else {
        panic!("the latest is answerable");
    };
    assert_eq!(answered.generation, latest);
    assert_eq!(
        answered.marked.iter().collect::<Vec<_>>(),
        ["10.0.0.2"],
        "what it marked"
    );
    assert_eq!(
        answered.released.iter().collect::<Vec<_>>(),
        ["10.0.0.9"],
        "released and gone from the pool; .3 is released but still in it"
    );
    let oldest_kept = last + 1 - u64::try_from(HISTORY).expect("small");
    assert!(matches!(
        snapshots.check("node-1", &oldest_kept.to_string()),
        GenerationCheck::Published(_)
    ));
    for stale in [
        (oldest_kept - 1).to_string(),
        "never".to_owned(),
        String::new(),
    ] {
        assert_eq!(
            snapshots.check("node-1", &stale),
            GenerationCheck::Stale {
                latest: latest.clone()
            },
            "{stale:?}"
        );
    }
}

#[test]
fn a_node_no_longer_driven_tells_its_watchers_and_closes() {
    let mut snapshots = Snapshots::new();
    snapshots.observe(&node(5, true));
    snapshots.observe(&CiliumNode::new("node-2", CiliumNodeSpec::default()));
    let receiver = snapshots.subscribe("node-1").expect("driven");
    snapshots.retain(|name| name == "node-2");
    assert!(matches!(*receiver.borrow(), Published::Gone));
    assert!(receiver.has_changed().is_err(), "closed");
    assert!(snapshots.subscribe("node-1").is_none());
    assert_eq!(snapshots.check("node-1", "5"), GenerationCheck::Unknown);
    assert_eq!(snapshots.len(), 1);
    snapshots.remove("node-2");
    assert!(snapshots.is_empty());
}

#[test]
fn generations_that_are_not_numbers_move_on_when_they_differ() {
    assert!(is_newer("b", "a"));
    assert!(!is_newer("a", "a"));
    assert!(is_newer("10", "9"), "by number, not as text");
    assert!(!is_newer("9", "10"));
}
