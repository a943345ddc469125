//! The stream over a plain [`Snapshots`], without actix: first the newest snapshot, then
//! newer ones (a slow reader skipping to the newest), the hook's broken snapshot once, and
//! how it ends.

use futures::{FutureExt as _, StreamExt as _};

use super::*;
use crate::cilium_node::{AllocationIp, CiliumNode, CiliumNodeSpec, CiliumNodeStatus, EniEntry};
use crate::manager::Snapshots;

/// `name` at `version`: eth0 and eni-1 (device 1), one pool IP on each.
fn node(name: &str, version: u64) -> CiliumNode {
    let mut node = CiliumNode::new(name, CiliumNodeSpec::default());
    node.metadata.resource_version = Some(version.to_string());
    let mut status = CiliumNodeStatus::default();
    for (id, number, ip) in [("eni-0", 0, "10.0.0.4"), ("eni-1", 1, "10.0.0.5")] {
        status.eni.enis.insert(
            id.to_owned(),
            EniEntry {
                id: id.to_owned(),
                number,
                ..EniEntry::default()
            },
        );
        node.spec.ipam.pool.insert(
            ip.to_owned(),
            AllocationIp {
                owner: String::new(),
                resource: id.to_owned(),
            },
        );
    }
    node.status = Some(status);
    node
}

fn started(snapshots: &mut Snapshots, name: &str) -> watch::Receiver<Published> {
    snapshots.observe(&CiliumNode::new(name, CiliumNodeSpec::default()));
    snapshots.subscribe(name).expect("driven")
}

/// The next item, which must be there already.
fn ready(stream: &mut SnapshotStream) -> Option<Result<NodeSnapshot, Status>> {
    stream.next().now_or_never().expect("an item ready")
}

fn generation(item: Option<Result<NodeSnapshot, Status>>) -> String {
    item.expect("an item").expect("a snapshot").generation
}

#[tokio::test]
async fn the_newest_snapshot_first_then_newer_ones_skipping_to_the_newest() {
    let mut snapshots = Snapshots::new();
    let receiver = started(&mut snapshots, "node-1");
    let mut stream = follow(
        "node-1".to_owned(),
        receiver,
        CancellationToken::new(),
        None,
    );
    assert!(
        stream.next().now_or_never().is_none(),
        "nothing published yet"
    );
    snapshots.observe(&node("node-1", 5));
    assert_eq!(generation(ready(&mut stream)), "5");
    assert!(stream.next().now_or_never().is_none());
    // Two generations before the client reads: it gets the newest.
    snapshots.observe(&node("node-1", 6));
    snapshots.observe(&node("node-1", 7));
    assert_eq!(generation(ready(&mut stream)), "7");

    let late = snapshots.subscribe("node-1").expect("driven");
    let mut late = follow("node-1".to_owned(), late, CancellationToken::new(), None);
    assert_eq!(
        generation(ready(&mut late)),
        "7",
        "a new watcher starts at the newest"
    );
}

#[tokio::test]
async fn a_node_no_longer_driven_ends_the_stream_with_not_found() {
    let mut snapshots = Snapshots::new();
    let receiver = started(&mut snapshots, "node-1");
    let mut stream = follow(
        "node-1".to_owned(),
        receiver,
        CancellationToken::new(),
        None,
    );
    snapshots.remove("node-1");
    let status = ready(&mut stream).expect("an item").expect_err("an end");
    assert_eq!(status.code(), tonic::Code::NotFound);
    assert!(ready(&mut stream).is_none(), "ended");
}

#[tokio::test]
async fn shutdown_and_a_stopped_manager_end_the_stream_with_unavailable() {
    let mut snapshots = Snapshots::new();
    let receiver = started(&mut snapshots, "node-1");
    let stop = CancellationToken::new();
    let mut stream = follow("node-1".to_owned(), receiver, stop.clone(), None);
    assert!(stream.next().now_or_never().is_none());
    stop.cancel();
    let status = ready(&mut stream).expect("an item").expect_err("an end");
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(ready(&mut stream).is_none());

    let receiver = snapshots.subscribe("node-1").expect("driven");
    let mut stream = follow(
        "node-1".to_owned(),
        receiver,
        CancellationToken::new(),
        None,
    );
    drop(snapshots);
    let status = ready(&mut stream).expect("an item").expect_err("an end");
    assert_eq!(status.code(), tonic::Code::Unavailable);
}

#[tokio::test]
async fn the_hook_sends_one_broken_snapshot_before_the_real_one_once() {
    let mut snapshots = Snapshots::new();
    let receiver = started(&mut snapshots, "node-1");
    let hook = Arc::new(InconsistentSnapshotHook::new("node-1"));
    let mut stream = follow(
        "node-1".to_owned(),
        receiver,
        CancellationToken::new(),
        Some(Arc::clone(&hook)),
    );
    snapshots.observe(&node("node-1", 5));
    let broken = ready(&mut stream).expect("an item").expect("a snapshot");
    assert_eq!(
        convert::pool_ips_without_eni(&broken)
            .iter()
            .map(|ip| ip.resource.as_str())
            .collect::<Vec<_>>(),
        ["eni-1"]
    );
    let real = ready(&mut stream).expect("an item").expect("a snapshot");
    assert_eq!(real.generation, "5");
    assert!(convert::pool_ips_without_eni(&real).is_empty());
    assert_ne!(broken.generation, real.generation);

    // Once: neither a newer generation nor another watcher gets another broken one.
    snapshots.observe(&node("node-1", 6));
    let next = ready(&mut stream).expect("an item").expect("a snapshot");
    assert!(convert::pool_ips_without_eni(&next).is_empty());
    let other = snapshots.subscribe("node-1").expect("driven");
    let mut other = follow(
        "node-1".to_owned(),
        other,
        CancellationToken::new(),
        Some(hook),
    );
    let first = ready(&mut other).expect("an item").expect("a snapshot");
    assert!(convert::pool_ips_without_eni(&first).is_empty());
}

#[tokio::test]
async fn the_hook_leaves_other_nodes_alone() {
    let mut snapshots = Snapshots::new();
    let receiver = started(&mut snapshots, "node-2");
    let hook = Arc::new(InconsistentSnapshotHook::new("node-1"));
    let mut stream = follow(
        "node-2".to_owned(),
        receiver,
        CancellationToken::new(),
        Some(hook),
    );
    snapshots.observe(&node("node-2", 5));
    let first = ready(&mut stream).expect("an item").expect("a snapshot");
    assert!(convert::pool_ips_without_eni(&first).is_empty());
    assert_eq!(first.generation, "5");
}
