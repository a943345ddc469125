//! The barrier's edges, in paused time.

use std::time::Duration;

use tokio::time::Instant;

use super::*;

const BREAKER: Duration = Duration::from_secs(60);

fn barrier(clusters: &[&str]) -> SyncBarrier {
    let mut barrier = SyncBarrier::new(BREAKER);
    for cluster in clusters {
        barrier.add_cluster(cluster);
    }
    barrier
}

fn sync_all(barrier: &mut SyncBarrier, cluster: &str) {
    for resource in [Resource::Nodes, Resource::Identities, Resource::IpCache] {
        barrier.synced(cluster, resource);
    }
    barrier.services_list_done(cluster, 0);
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
    barrier.synced("c2", Resource::IpCache);
    barrier.synced("c2", Resource::Identities);
    let wait = tokio::spawn(barrier.mesh_wait(SyncKind::IpIdentities).wait(None));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!wait.is_finished(), "c2's nodes are missing");
    barrier.synced("c2", Resource::Nodes);
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
async fn services_complete_only_when_programmed_up_to_list_done() {
    let mut barrier = barrier(&["c1"]);
    barrier.services_programmed("c1", 3);
    barrier.services_list_done("c1", 5);
    assert!(!barrier.is_synced("c1", Resource::Services));
    barrier.services_programmed("c1", 4);
    assert!(!barrier.is_synced("c1", Resource::Services));
    let wait = tokio::spawn(barrier.mesh_wait(SyncKind::Services).wait(None));
    barrier.services_programmed("c1", 5);
    assert_eq!(wait.await.unwrap(), Ok(WaitOutcome::Synced));
    // A later list-done (a reconnect) does not move the marker.
    barrier.services_list_done("c1", 50);
    assert!(barrier.is_synced("c1", Resource::Services));
    // Services never complete through the generic path.
    let mut other = self::barrier(&["c2"]);
    other.synced("c2", Resource::Services);
    assert!(!other.is_synced("c2", Resource::Services));
}

#[tokio::test(start_paused = true)]
async fn latches_survive_a_re_add_and_the_snapshot_is_taken_at_call_time() {
    let mut barrier = barrier(&["c1"]);
    barrier.synced("c1", Resource::Nodes);
    barrier.add_cluster("c1"); // a reconnect or a config change keeps the latches
    assert!(barrier.is_synced("c1", Resource::Nodes));
    let wait = barrier.mesh_wait(SyncKind::Nodes);
    barrier.add_cluster("late");
    assert_eq!(wait.clusters().collect::<Vec<_>>(), ["c1"]);
    assert_eq!(wait.wait(None).await, Ok(WaitOutcome::Synced));
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
