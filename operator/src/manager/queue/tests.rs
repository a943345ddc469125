use super::*;
use crate::cilium_node::{AllocationIp, CiliumNodeSpec, CiliumNodeStatus};

fn node(name: &str, pre: i64) -> CiliumNode {
    let mut spec = CiliumNodeSpec::default();
    spec.eni.instance_id = format!("i-{name}");
    spec.eni.instance_type = "m5.large".to_owned();
    spec.ipam.pre_allocate = pre;
    CiliumNode::new(name, spec)
}

/// The deficit used by the tests: the node's pre-allocate.
fn pre(allocator: &NodeAllocator, _: &CiliumNode) -> usize {
    usize::try_from(allocator.spec().ipam.pre_allocate).unwrap_or(0)
}

#[test]
fn the_worst_deficit_goes_first_ties_by_name() {
    let mut queue = NodeQueue::new(Tags::new(), false);
    for (name, deficit) in [("b", 4), ("a", 4), ("c", 16), ("d", 1)] {
        assert!(queue.upsert(node(name, deficit)));
    }
    let now = Instant::now();
    let order: Vec<String> =
        std::iter::from_fn(|| queue.next(now, pre).map(|pass| pass.name)).collect();
    assert_eq!(order, ["c", "a", "b", "d"]);
    assert!(queue.next(now, pre).is_none(), "all in flight");
}

#[test]
fn a_node_passes_at_most_once_per_interval_and_never_twice_at_once() {
    let mut queue = NodeQueue::new(Tags::new(), false);
    queue.upsert(node("a", 8));
    let start = Instant::now();
    let pass = queue.next(start, pre).expect("first pass");
    // Changed while in flight: not handed out again before the pass ends.
    queue.upsert(node("a", 9));
    assert!(queue.next(start, pre).is_none());
    queue.finish(start, "a", pass.allocator, None, PassOutcome::Settled);
    assert_eq!(
        queue.next(start, pre).map(|p| p.name),
        None,
        "interval not over"
    );
    assert_eq!(queue.next_wake(), Some(start + MIN_PASS_INTERVAL));
    let pass = queue
        .next(start + MIN_PASS_INTERVAL, pre)
        .expect("after the interval");
    assert_eq!(
        pass.allocator.spec().ipam.pre_allocate,
        9,
        "spec followed the object"
    );
}

#[test]
fn the_operators_own_publish_does_not_call_for_another_pass() {
    let mut queue = NodeQueue::new(Tags::new(), false);
    let mut stored = node("a", 8);
    queue.upsert(stored.clone());
    let start = Instant::now();
    let pass = queue.next(start, pre).expect("pass");
    stored.spec.ipam.pool.insert(
        "10.0.0.1".to_owned(),
        AllocationIp {
            owner: String::new(),
            resource: "eni-1".to_owned(),
        },
    );
    stored.status = Some(CiliumNodeStatus::default());
    stored.metadata.resource_version = Some("7".to_owned());
    queue.finish(
        start,
        "a",
        pass.allocator,
        Some(stored.clone()),
        PassOutcome::Settled,
    );
    assert!(!queue.upsert(stored.clone()), "the watch echo of our write");
    let later = start + MIN_PASS_INTERVAL;
    assert!(queue.next(later, pre).is_none());

    // The agent starts using an address: that is a reason.
    let mut used = stored;
    used.status
        .get_or_insert_default()
        .ipam
        .used
        .insert("10.0.0.1".to_owned(), AllocationIp::default());
    assert!(queue.upsert(used));
    assert!(queue.next(later, pre).is_some());
}

#[test]
fn a_node_deleted_during_its_pass_is_dropped_when_it_ends() {
    let mut queue = NodeQueue::new(Tags::new(), false);
    queue.upsert(node("a", 8));
    let pass = queue.next(Instant::now(), pre).expect("pass");
    assert!(queue.remove("a"));
    queue.finish(
        Instant::now(),
        "a",
        pass.allocator,
        None,
        PassOutcome::Again,
    );
    assert!(queue.is_empty());
    assert!(queue.next_wake().is_none());
}

#[test]
fn nodes_without_an_instance_id_are_not_eni_nodes() {
    let mut queue = NodeQueue::new(Tags::new(), false);
    assert!(!queue.upsert(CiliumNode::new("plain", CiliumNodeSpec::default())));
    queue.upsert(node("a", 8));
    let mut lost = node("a", 8);
    lost.spec.eni.instance_id.clear();
    queue.upsert(lost);
    assert!(queue.is_empty());
}

#[test]
fn transient_failures_back_off() {
    let mut queue = NodeQueue::new(Tags::new(), false);
    queue.upsert(node("a", 8));
    let start = Instant::now();
    let pass = queue.next(start, pre).expect("pass");
    queue.finish(start, "a", pass.allocator, None, PassOutcome::Retry);
    assert_eq!(queue.next_wake(), Some(start + 2 * MIN_PASS_INTERVAL));
    let pass = queue
        .next(start + 2 * MIN_PASS_INTERVAL, pre)
        .expect("retry");
    let now = start + 2 * MIN_PASS_INTERVAL;
    queue.finish(now, "a", pass.allocator, None, PassOutcome::Retry);
    assert_eq!(queue.next_wake(), Some(now + 4 * MIN_PASS_INTERVAL));
}

#[test]
fn an_older_version_never_replaces_a_newer_one() {
    let mut queue = NodeQueue::new(Tags::new(), false);
    let mut newer = node("a", 8);
    newer.metadata.resource_version = Some("10".to_owned());
    queue.upsert(newer);
    let pass = queue.next(Instant::now(), pre).expect("pass");
    queue.finish(
        Instant::now(),
        "a",
        pass.allocator,
        None,
        PassOutcome::Settled,
    );
    // The store watch lagging behind a write the manager was told of directly.
    let mut older = node("a", 2);
    older.metadata.resource_version = Some("9".to_owned());
    assert!(!queue.upsert(older), "not a reason to pass");
    let latest = queue.latest("a").expect("known");
    assert_eq!(latest.metadata.resource_version.as_deref(), Some("10"));
    assert_eq!(latest.spec.ipam.pre_allocate, 8);
    let mut next = node("a", 4);
    next.metadata.resource_version = Some("11".to_owned());
    assert!(queue.upsert(next), "a newer one is taken");
    assert_eq!(queue.latest("a").map(|n| n.spec.ipam.pre_allocate), Some(4));
}

#[test]
fn an_unknown_instance_asks_for_one_resync_until_it_is_found() {
    let mut queue = NodeQueue::new(Tags::new(), false);
    queue.upsert(node("a", 8));
    assert!(queue.instance_unknown("a", true), "the first time");
    assert!(
        !queue.instance_unknown("a", true),
        "not again: it may be gone"
    );
    assert!(!queue.instance_unknown("a", false), "found");
    assert!(queue.instance_unknown("a", true), "unknown again later");
    // The node names another instance: that one may be new too.
    let mut moved = node("a", 8);
    moved.spec.eni.instance_id = "i-other".to_owned();
    queue.upsert(moved);
    assert!(queue.instance_unknown("a", true));
    assert!(!queue.instance_unknown("b", true), "no such node");
}
