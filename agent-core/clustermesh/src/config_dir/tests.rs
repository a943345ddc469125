//! State machine tests: scans in, events out.

use std::collections::BTreeMap;
use std::path::Path;

use super::{ClusterConfigEvent, ConfigDirState, ScannedFile};

const C1: &str = "endpoints:\n- https://c1.mesh.cilium.io:2379\n";
const C1_B: &str = "endpoints:\n- https://c1-b.mesh.cilium.io:2379\n";
const C2: &str = "endpoints:\n- https://c2.mesh.cilium.io:2379\n";

fn scan(files: &[(&str, &str)]) -> BTreeMap<String, ScannedFile> {
    files
        .iter()
        .map(|(name, content)| {
            let file = ScannedFile::Content(content.as_bytes().to_vec());
            ((*name).to_owned(), file)
        })
        .collect()
}

fn state() -> ConfigDirState {
    ConfigDirState::new("/etc/cm", "local")
}

/// Events as short strings, e.g. `upsert c1 https://…`, `remove c1`, `invalid c1: <error>`.
fn summary(events: &[ClusterConfigEvent]) -> Vec<String> {
    events
        .iter()
        .map(|event| match event {
            ClusterConfigEvent::Upsert { name, config } => {
                assert_eq!(*name, config.name);
                format!("upsert {name} {}", config.etcd.endpoints.join(","))
            }
            ClusterConfigEvent::Remove { name } => format!("remove {name}"),
            ClusterConfigEvent::Invalid { name, error } => format!("invalid {name}: {error}"),
        })
        .collect()
}

#[test]
fn add_change_rewrite_remove() {
    let mut state = state();
    assert_eq!(
        summary(&state.apply(&scan(&[("c1", C1), ("c2", C2)]))),
        [
            "upsert c1 https://c1.mesh.cilium.io:2379",
            "upsert c2 https://c2.mesh.cilium.io:2379"
        ]
    );
    assert_eq!(state.clusters().collect::<Vec<_>>(), ["c1", "c2"]);

    // Identical content: nothing.
    assert!(state.apply(&scan(&[("c1", C1), ("c2", C2)])).is_empty());

    // One changed file: one upsert, for it alone.
    assert_eq!(
        summary(&state.apply(&scan(&[("c1", C1_B), ("c2", C2)]))),
        ["upsert c1 https://c1-b.mesh.cilium.io:2379"]
    );

    assert_eq!(summary(&state.apply(&scan(&[("c2", C2)]))), ["remove c1"]);
    assert_eq!(state.len(), 1);
    assert_eq!(summary(&state.apply(&scan(&[]))), ["remove c2"]);
    assert!(state.is_empty());
}

#[test]
fn hash_tracks_content() {
    let mut state = state();
    let first = state.apply(&scan(&[("c1", C1)]));
    let second = state.apply(&scan(&[("c1", C1_B)]));
    let hash = |events: &[ClusterConfigEvent]| match &events[0] {
        ClusterConfigEvent::Upsert { config, .. } => config.hash,
        other => panic!("{other:?}"),
    };
    assert_ne!(hash(&first), hash(&second));
    // Back to the first content: a change again, with the first hash.
    let third = state.apply(&scan(&[("c1", C1)]));
    assert_eq!(hash(&third), hash(&first));
}

#[test]
fn local_cluster_file_is_ignored() {
    let mut state = state();
    assert_eq!(
        summary(&state.apply(&scan(&[("local", C1), ("c2", C2)]))),
        ["upsert c2 https://c2.mesh.cilium.io:2379"]
    );
    assert_eq!(state.clusters().collect::<Vec<_>>(), ["c2"]);
    assert!(
        state
            .apply(&scan(&[("local", C1_B), ("c2", C2)]))
            .is_empty()
    );
    assert!(state.apply(&scan(&[("c2", C2)])).is_empty());
}

#[test]
fn file_without_endpoints_is_not_a_cluster() {
    let mut state = state();
    let events = state.apply(&scan(&[("notes", "just some text\n"), ("c2", C2)]));
    assert_eq!(
        summary(&events),
        ["upsert c2 https://c2.mesh.cilium.io:2379"]
    );
    assert_eq!(state.len(), 1);

    // A tracked file that loses `endpoints:` is removed, as in Cilium.
    let events = state.apply(&scan(&[("c2", "truncated\n")]));
    assert_eq!(summary(&events), ["remove c2"]);
}

#[test]
fn unparsable_file_is_invalid_and_others_unaffected() {
    let mut state = state();
    let broken = "endpoints: [\"https://h:1\"\n";
    let events = state.apply(&scan(&[("c1", broken), ("c2", C2)]));
    let lines = summary(&events);
    assert_eq!(lines.len(), 2);
    assert!(
        lines[0].starts_with("invalid c1: /etc/cm/c1: invalid YAML:"),
        "{lines:?}"
    );
    assert_eq!(lines[1], "upsert c2 https://c2.mesh.cilium.io:2379");

    // Invalid clusters still count, and the same broken content is not reported again.
    assert_eq!(state.len(), 2);
    assert_eq!(state.invalid_clusters().collect::<Vec<_>>(), ["c1"]);
    assert!(state.apply(&scan(&[("c1", broken), ("c2", C2)])).is_empty());
}

#[test]
fn invalid_then_valid_then_invalid() {
    let mut state = state();
    let no_endpoints = "endpoints: []\n";
    let events = state.apply(&scan(&[("c1", no_endpoints)]));
    assert_eq!(
        summary(&events),
        ["invalid c1: /etc/cm/c1: `endpoints` is missing or empty"]
    );

    let events = state.apply(&scan(&[("c1", C1)]));
    assert_eq!(
        summary(&events),
        ["upsert c1 https://c1.mesh.cilium.io:2379"]
    );
    assert_eq!(state.invalid_clusters().count(), 0);

    let bad_url = "endpoints: [\"not a url\"]\n";
    let events = state.apply(&scan(&[("c1", bad_url)]));
    let lines = summary(&events);
    assert!(
        lines[0].starts_with("invalid c1: /etc/cm/c1: endpoint \"not a url\" is not a valid URL"),
        "{lines:?}"
    );

    // An invalid cluster's file removed: a remove like any other.
    assert_eq!(summary(&state.apply(&scan(&[]))), ["remove c1"]);
}

#[test]
fn bad_cluster_name_is_invalid() {
    let mut state = state();
    let events = state.apply(&scan(&[("Cluster_1", C1), ("c2", C2)]));
    let lines = summary(&events);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].starts_with("invalid Cluster_1: /etc/cm/Cluster_1: invalid cluster name"),
        "{lines:?}"
    );
    let long = "x".repeat(33);
    let events = state.apply(&scan(&[(long.as_str(), C1)]));
    assert!(
        matches!(&events[0], ClusterConfigEvent::Invalid { error, .. } if error.contains("32 characters"))
    );
}

#[test]
fn unreadable_file_is_invalid_until_readable() {
    let mut state = state();
    let unreadable = |error: &str| {
        BTreeMap::from([("c1".to_owned(), ScannedFile::Unreadable(error.to_owned()))])
    };
    let events = state.apply(&unreadable("Permission denied (os error 13)"));
    assert_eq!(
        summary(&events),
        ["invalid c1: /etc/cm/c1: cannot read the file: Permission denied (os error 13)"]
    );
    assert!(
        state
            .apply(&unreadable("Permission denied (os error 13)"))
            .is_empty()
    );
    let events = state.apply(&scan(&[("c1", C1)]));
    assert_eq!(
        summary(&events),
        ["upsert c1 https://c1.mesh.cilium.io:2379"]
    );
}

#[test]
fn upsert_carries_resolved_tls_files() {
    let mut state = state();
    let content = "endpoints: [\"https://h:2379\"]\ntrusted-ca-file: ca.crt\n\
                   cert-file: /tls/c.crt\nkey-file: /tls/c.key\n";
    let events = state.apply(&scan(&[("c1", content)]));
    let ClusterConfigEvent::Upsert { config, .. } = &events[0] else {
        panic!("{events:?}");
    };
    assert_eq!(
        config.etcd.trusted_ca_file.as_deref(),
        Some(Path::new("/etc/cm/ca.crt"))
    );
    assert_eq!(
        config.etcd.cert_file.as_deref(),
        Some(Path::new("/tls/c.crt"))
    );
    assert_eq!(
        config.etcd.key_file.as_deref(),
        Some(Path::new("/tls/c.key"))
    );
}
