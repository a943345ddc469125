//! The cluster lifecycle rules, without actors or IO.

use meshwork_kvstore::EtcdConfig;

use super::*;

fn config(name: &str, endpoint: &str) -> RemoteClusterConfig {
    RemoteClusterConfig {
        name: name.to_owned(),
        etcd: EtcdConfig::new([endpoint]),
        hash: 0,
    }
}

fn upsert(name: &str, endpoint: &str) -> ClusterConfigEvent {
    ClusterConfigEvent::Upsert {
        name: name.to_owned(),
        config: config(name, endpoint),
    }
}

fn invalid(name: &str) -> ClusterConfigEvent {
    ClusterConfigEvent::Invalid {
        name: name.to_owned(),
        error: format!("{name}: invalid YAML"),
    }
}

fn remove(name: &str) -> ClusterConfigEvent {
    ClusterConfigEvent::Remove {
        name: name.to_owned(),
    }
}

fn c(name: &str, incarnation: u64) -> ClusterRef {
    ClusterRef::new(name, incarnation)
}

#[test]
fn a_new_cluster_gets_latches_then_a_loop_and_a_change_restarts_it() {
    let mut mesh = MeshState::new("local", 9);
    assert_eq!(
        mesh.apply(upsert("c1", "http://a")),
        [
            Command::AddLatches(c("c1", 1)),
            Command::Start {
                cluster: c("c1", 1),
                config: config("c1", "http://a")
            }
        ]
    );
    assert_eq!(
        mesh.apply(upsert("c1", "http://b")),
        [Command::Restart {
            cluster: c("c1", 1),
            config: config("c1", "http://b")
        }]
    );
    // Busy: the next change waits for the restart, and only the newest content counts.
    assert!(mesh.apply(upsert("c1", "http://c")).is_empty());
    assert!(mesh.apply(upsert("c1", "http://d")).is_empty());
    assert_eq!(
        mesh.done(&c("c1", 1)),
        [Command::Restart {
            cluster: c("c1", 1),
            config: config("c1", "http://d")
        }]
    );
    // Other clusters do not wait.
    assert_eq!(mesh.apply(upsert("c2", "http://e")).len(), 2);
}

#[test]
fn an_invalid_file_stops_the_loop_and_the_fixed_file_starts_it_again() {
    let mut mesh = MeshState::new("local", 0);
    mesh.apply(upsert("c1", "http://a"));
    assert_eq!(mesh.apply(invalid("c1")), [Command::Stop(c("c1", 1))]);
    assert!(mesh.done(&c("c1", 1)).is_empty());
    let view: Vec<_> = mesh.clusters().collect();
    assert_eq!(view[0].invalid, Some("c1: invalid YAML"));
    // Still invalid: nothing runs, nothing to stop.
    assert!(mesh.apply(invalid("c1")).is_empty());
    assert_eq!(
        mesh.apply(upsert("c1", "http://a")),
        [Command::Start {
            cluster: c("c1", 1),
            config: config("c1", "http://a")
        }],
        "the same incarnation: its stores and latches are kept"
    );
    // A cluster only ever seen invalid has latches (it counts) but no loop.
    assert_eq!(mesh.apply(invalid("c2")), [Command::AddLatches(c("c2", 2))]);
}

#[test]
fn a_removal_drains_and_releases_the_id_only_when_done() {
    let mut mesh = MeshState::new("local", 9);
    mesh.apply(upsert("c1", "http://a"));
    mesh.reserve(&c("c1", 1), 1).unwrap();
    assert_eq!(mesh.apply(remove("c1")), [Command::Drain(c("c1", 1))]);
    // While the drain runs the ID is still held, and the old loop cannot take another.
    assert!(mesh.reserve(&c("c2", 7), 1).is_err());
    mesh.apply(upsert("c2", "http://b"));
    assert!(matches!(
        mesh.reserve(&c("c2", 2), 1),
        Err(ReserveError::InUse(_))
    ));
    assert!(matches!(
        mesh.reserve(&c("c1", 1), 3),
        Err(ReserveError::NotConfigured(_))
    ));
    assert!(mesh.done(&c("c1", 1)).is_empty());
    assert_eq!(mesh.clusters().count(), 1);
    mesh.reserve(&c("c2", 2), 1).unwrap();
    assert_eq!(
        mesh.reserved_ids(),
        BTreeMap::from([(1, "c2".to_owned()), (9, "local".to_owned())])
    );
}

#[test]
fn a_file_re_created_during_its_drain_is_a_new_incarnation_after_it() {
    let mut mesh = MeshState::new("local", 0);
    mesh.apply(upsert("c1", "http://a"));
    mesh.reserve(&c("c1", 1), 1).unwrap();
    assert_eq!(mesh.apply(remove("c1")), [Command::Drain(c("c1", 1))]);
    // 100 removals and re-creations while the drain runs: only the last content waits.
    for i in 0..100 {
        assert!(mesh.apply(upsert("c1", &format!("http://{i}"))).is_empty());
        assert!(mesh.apply(remove("c1")).is_empty());
    }
    assert!(mesh.apply(upsert("c1", "http://last")).is_empty());
    // A late answer about another incarnation changes nothing.
    assert!(mesh.done(&c("c1", 5)).is_empty());
    assert_eq!(
        mesh.done(&c("c1", 1)),
        [
            Command::AddLatches(c("c1", 2)),
            Command::Start {
                cluster: c("c1", 2),
                config: config("c1", "http://last")
            }
        ]
    );
    assert_eq!(
        mesh.reserved_ids(),
        BTreeMap::new(),
        "the old ID is released"
    );
    mesh.reserve(&c("c1", 2), 1).unwrap();
    assert_eq!(mesh.reserved_ids(), BTreeMap::from([(1, "c1".to_owned())]));
}

#[test]
fn a_removal_waiting_behind_a_restart_drains_before_the_new_content_starts() {
    let mut mesh = MeshState::new("local", 0);
    mesh.apply(upsert("c1", "http://a"));
    mesh.apply(upsert("c1", "http://b"));
    assert!(mesh.apply(remove("c1")).is_empty());
    assert!(mesh.apply(upsert("c1", "http://c")).is_empty());
    assert_eq!(mesh.done(&c("c1", 1)), [Command::Drain(c("c1", 1))]);
    assert_eq!(
        mesh.done(&c("c1", 1)),
        [
            Command::AddLatches(c("c1", 2)),
            Command::Start {
                cluster: c("c1", 2),
                config: config("c1", "http://c")
            }
        ]
    );
}

#[test]
fn shutdown_stops_every_loop_drains_nothing_and_ignores_later_events() {
    let mut mesh = MeshState::new("local", 0);
    mesh.apply(upsert("c1", "http://a"));
    mesh.apply(upsert("c2", "http://b"));
    mesh.apply(upsert("c2", "http://c")); // c2 restarting
    mesh.apply(invalid("c3")); // no loop
    assert_eq!(mesh.shutdown(), [Command::Stop(c("c1", 1))]);
    assert!(!mesh.is_stopped());
    assert!(mesh.apply(remove("c1")).is_empty());
    assert!(mesh.done(&c("c1", 1)).is_empty());
    // The restart in flight leaves a loop running: it is stopped in turn.
    assert_eq!(mesh.done(&c("c2", 2)), [Command::Stop(c("c2", 2))]);
    assert!(!mesh.is_stopped());
    assert!(mesh.done(&c("c2", 2)).is_empty());
    assert!(mesh.is_stopped());
    assert_eq!(mesh.clusters().count(), 3, "nothing is drained");
}
