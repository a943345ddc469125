//! The barrier's edges, in paused time.

use std::time::Duration;

use tokio::time::Instant;

use super::*;

const BREAKER: Duration = Duration::from_secs(60);

/// A barrier with the datapath and the identity cache registered, and `clusters` at
/// incarnation 1.
fn barrier(clusters: &[&str]) -> SyncBarrier {
    let mut barrier = SyncBarrier::new(BREAKER)
        .with_consumer(Consumer::Datapath)
        .with_consumer(Consumer::Identities);
    for cluster in clusters {
        barrier.add_cluster(cluster, 1);
    }
    barrier
}

/// `resource`'s first list of `cluster` delivered and applied by every registered consumer.
fn synced(barrier: &mut SyncBarrier, cluster: &str, resource: Resource) {
    barrier.delivered(cluster, 1, resource);
    for consumer in barrier.consumers().to_vec() {
        if consumer.resources().contains(&resource) {
            barrier.applied(cluster, 1, resource, consumer);
        }
    }
}

fn sync_all(barrier: &mut SyncBarrier, cluster: &str) {
    for resource in Resource::ALL {
        synced(barrier, cluster, resource);
    }
}

#[tokio::test(start_paused = true)]
async fn zero_clusters_return_at_once() {
    let barrier = barrier(&[]);
    let started = Instant::now();
    for kind in [SyncKind::Nodes, SyncKind::Services, SyncKind::IpIdentities] {
        assert_eq!(
            barrier.mesh_wait(kind).wait(None).await,
            Ok(WaitOutcome::Synced)
        );
    }
    assert_eq!(started.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn ip_identities_needs_ipcache_identities_and_nodes() {
    let mut barrier = barrier(&["c1", "c2"]);
    sync_all(&mut barrier, "c1");
    synced(&mut barrier, "c2", Resource::IpCache);
    synced(&mut barrier, "c2", Resource::Identities);
    let wait = tokio::spawn(barrier.mesh_wait(SyncKind::IpIdentities).wait(None));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!wait.is_finished(), "c2's nodes are missing");
    synced(&mut barrier, "c2", Resource::Nodes);
    assert_eq!(wait.await.unwrap(), Ok(WaitOutcome::Synced));
    assert!(!barrier.breaker_warned());
}

#[tokio::test(start_paused = true)]
async fn a_cluster_removed_before_it_synced_is_ignored() {
    let mut barrier = barrier(&["c1", "c2"]);
    sync_all(&mut barrier, "c1");
    let wait = tokio::spawn(barrier.mesh_wait(SyncKind::Nodes).wait(None));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!wait.is_finished());
    barrier.remove_cluster("c2");
    let started = Instant::now();
    assert_eq!(wait.await.unwrap(), Ok(WaitOutcome::Synced));
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn the_breaker_returns_ok_and_warns_once() {
    let mut barrier = barrier(&["c1", "c2"]);
    sync_all(&mut barrier, "c1");
    let started = Instant::now();
    let outcome = barrier.mesh_wait(SyncKind::IpIdentities).wait(None).await;
    assert_eq!(
        outcome,
        Ok(WaitOutcome::BreakerFired {
            pending: vec!["c2".to_owned()]
        })
    );
    assert_eq!(started.elapsed(), BREAKER);
    assert!(barrier.breaker_warned());
    // A second breaker in the same process does not warn again (the flag stays set), and
    // still returns Ok.
    let outcome = barrier.mesh_wait(SyncKind::Nodes).wait(None).await;
    assert!(matches!(outcome, Ok(WaitOutcome::BreakerFired { .. })));
}

#[tokio::test(start_paused = true)]
async fn the_caller_giving_up_first_is_an_error() {
    let barrier = barrier(&["c1"]);
    let deadline = Instant::now() + Duration::from_secs(5);
    let outcome = barrier
        .mesh_wait(SyncKind::Nodes)
        .wait(Some(deadline))
        .await;
    assert_eq!(
        outcome,
        Err(WaitError::CallerDeadline {
            kind: SyncKind::Nodes,
            waited: Duration::from_secs(5)
        })
    );
    assert!(!barrier.breaker_warned());
}

#[tokio::test(start_paused = true)]
async fn services_complete_only_once_the_datapath_applied_the_list() {
    let mut barrier = barrier(&["c1"]);
    barrier.delivered("c1", 1, Resource::Services);
    assert!(
        !barrier.is_synced("c1", SyncKind::Services),
        "delivered is not programmed"
    );
    let wait = tokio::spawn(barrier.mesh_wait(SyncKind::Services).wait(None));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!wait.is_finished());
    barrier.applied("c1", 1, Resource::Services, Consumer::Datapath);
    assert_eq!(wait.await.unwrap(), Ok(WaitOutcome::Synced));
    // A later list-done (a reconnect) changes nothing.
    barrier.applied("c1", 1, Resource::Services, Consumer::Datapath);
    assert!(barrier.is_synced("c1", SyncKind::Services));
    // An acknowledgement of a consumer nobody registered, or from another incarnation,
    // completes nothing.
    let mut other = self::barrier(&["c2"]);
    other.delivered("c2", 1, Resource::Services);
    other.applied("c2", 1, Resource::Services, Consumer::WireGuard);
    other.applied("c2", 7, Resource::Services, Consumer::Datapath);
    assert!(!other.is_synced("c2", SyncKind::Services));
}

#[tokio::test(start_paused = true)]
async fn a_resource_nobody_applies_completes_on_delivery() {
    let mut barrier = SyncBarrier::new(BREAKER).with_consumer(Consumer::Identities);
    barrier.add_cluster("c1", 1);
    barrier.delivered("c1", 1, Resource::Nodes);
    assert!(barrier.is_synced("c1", SyncKind::Nodes));
    assert!(!barrier.is_synced("c1", SyncKind::IpIdentities));
}

#[tokio::test(start_paused = true)]
async fn a_scoped_wait_counts_only_its_consumers() {
    let mut barrier = SyncBarrier::new(BREAKER)
        .with_consumer(Consumer::Datapath)
        .with_consumer(Consumer::WireGuard);
    barrier.add_cluster("c1", 1);
    barrier.delivered("c1", 1, Resource::Nodes);
    barrier.applied("c1", 1, Resource::Nodes, Consumer::Datapath);
    // WireGuard has not applied the nodes: a wait for everyone waits, one for the datapath
    // does not.
    let datapath = [Consumer::Datapath];
    assert_eq!(
        barrier
            .mesh_wait_in(SyncKind::Nodes, Scope::Only(&datapath))
            .wait(Some(Instant::now()))
            .await,
        Ok(WaitOutcome::Synced)
    );
    let all = tokio::spawn(barrier.mesh_wait(SyncKind::Nodes).wait(None));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!all.is_finished());
    barrier.applied("c1", 1, Resource::Nodes, Consumer::WireGuard);
    assert_eq!(all.await.unwrap(), Ok(WaitOutcome::Synced));
}

#[tokio::test(start_paused = true)]
async fn latches_survive_a_re_add_and_the_snapshot_is_taken_at_call_time() {
    let mut barrier = barrier(&["c1"]);
    synced(&mut barrier, "c1", Resource::Nodes);
    barrier.add_cluster("c1", 1); // a reconnect or a config change keeps the latches
    assert!(barrier.is_synced("c1", SyncKind::Nodes));
    let wait = barrier.mesh_wait(SyncKind::Nodes);
    barrier.add_cluster("late", 1);
    assert_eq!(wait.clusters().collect::<Vec<_>>(), ["c1"]);
    assert_eq!(wait.wait(None).await, Ok(WaitOutcome::Synced));
    // A new incarnation (removed and configured again) starts over, and the old one's late
    // acknowledgements complete nothing.
    barrier.add_cluster("c1", 2);
    assert!(!barrier.is_synced("c1", SyncKind::Nodes));
    synced(&mut barrier, "c1", Resource::Nodes);
    assert!(!barrier.is_synced("c1", SyncKind::Nodes));
}

#[tokio::test(start_paused = true)]
async fn a_cluster_wait_reports_the_disconnect_and_stop_all_releases_mesh_waits() {
    let mut barrier = barrier(&["c1", "c2"]);
    let c1 = barrier.cluster_wait("c1", SyncKind::Nodes).unwrap();
    let mesh = tokio::spawn(barrier.mesh_wait(SyncKind::Nodes).wait(None));
    barrier.stop_all();
    assert_eq!(
        c1.wait().await,
        Err(WaitError::Disconnected("c1".to_owned()))
    );
    assert_eq!(mesh.await.unwrap(), Ok(WaitOutcome::Synced));
    assert!(barrier.cluster_wait("c1", SyncKind::Nodes).is_none());
}
