//! The etcd backend against real etcd: leases, conditional creates, TLS with etcd users.

mod common;

use std::time::Duration;

use common::*;
use meshwork_agent_core::kvstore::{EtcdBackend, EtcdConfig, KvstoreError};
use meshwork_lab::etcd::{Access, EtcdOptions, EtcdServer, EtcdTls};

#[tokio::test]
async fn leased_keys_vanish_with_their_lease() {
    init_tracing();
    let etcd = EtcdServer::start().unwrap();
    let backend = connect(&etcd).await;
    let lease = backend.lease_grant(30).await.unwrap();
    backend
        .put_with_lease("cilium/state/nodes/v1/c1/n1", "{}", lease)
        .await
        .unwrap();
    assert!(backend.lease_keep_alive_once(lease).await.unwrap());
    assert!(backend.lease_ttl(lease).await.unwrap() > 0);
    assert!(
        backend
            .get("cilium/state/nodes/v1/c1/n1")
            .await
            .unwrap()
            .is_some()
    );
    backend.lease_revoke(lease).await.unwrap();
    assert_eq!(
        backend.get("cilium/state/nodes/v1/c1/n1").await.unwrap(),
        None
    );
    assert!(!backend.lease_keep_alive_once(lease).await.unwrap());
}

#[tokio::test]
async fn create_if_absent_creates_once() {
    init_tracing();
    let etcd = EtcdServer::start().unwrap();
    let backend = connect(&etcd).await;
    assert!(backend.create_if_absent("k", "v1").await.unwrap());
    assert!(!backend.create_if_absent("k", "v2").await.unwrap());
    assert_eq!(backend.get("k").await.unwrap().unwrap().0, b"v1");
}

#[tokio::test]
async fn tls_with_a_read_only_user_reads_and_cannot_write() {
    init_tracing();
    let etcd = EtcdServer::start_with(EtcdOptions {
        tls: true,
        ..EtcdOptions::default()
    })
    .unwrap();
    let tls = etcd.tls().unwrap().clone();
    etcd.ctl(&["put", "cilium/cluster-config/c1", r#"{"id":1}"#])
        .unwrap();
    let remote = etcd.add_user("remote", "cilium/", Access::Read).unwrap();
    let config = EtcdConfig {
        endpoints: vec![etcd.endpoint()],
        trusted_ca_file: Some(tls.ca_file.clone()),
        cert_file: Some(remote.cert_file),
        key_file: Some(remote.key_file),
    };
    let backend = EtcdBackend::connect(&config, Duration::from_secs(10))
        .await
        .unwrap();
    let (value, _) = backend
        .get("cilium/cluster-config/c1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(value, br#"{"id":1}"#);
    let err = backend
        .put("cilium/cluster-config/c1", "x")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("permission denied"), "{err}");
}

#[tokio::test]
async fn tls_with_a_wrong_ca_fails_with_a_clear_error() {
    init_tracing();
    let etcd = EtcdServer::start_with(EtcdOptions {
        tls: true,
        ..EtcdOptions::default()
    })
    .unwrap();
    let remote = etcd.add_user("remote", "cilium/", Access::Read).unwrap();
    let other = tempfile::tempdir().unwrap();
    let config = EtcdConfig {
        endpoints: vec![etcd.endpoint()],
        trusted_ca_file: Some(EtcdTls::foreign_ca(other.path()).unwrap()),
        cert_file: Some(remote.cert_file),
        key_file: Some(remote.key_file),
    };
    let err = EtcdBackend::connect(&config, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        matches!(err, KvstoreError::Connect { .. } | KvstoreError::Timeout(_)),
        "{err:?}"
    );
    assert!(err.to_string().contains(&etcd.endpoint()), "{err}");
}

#[tokio::test]
async fn missing_tls_files_are_named_in_the_error() {
    let config = EtcdConfig {
        endpoints: vec!["https://127.0.0.1:1".to_owned()],
        trusted_ca_file: Some("/nonexistent/ca.crt".into()),
        ..EtcdConfig::default()
    };
    let err = EtcdBackend::connect(&config, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("trusted-ca-file /nonexistent/ca.crt"),
        "{err}"
    );
}
