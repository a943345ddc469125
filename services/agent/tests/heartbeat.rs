//! A remote's heartbeat (contract §8), against a real etcd with a short
//! `--kvstore-heartbeat-interval`: while the remote writes heartbeats the connection holds;
//! once it stops, stale checks reconnect it, and the reconnect drains nothing. Read as
//! Cilium's `remote` user, which may watch the heartbeat and the config only as keys.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use common::*;
use meshwork_kvstore::{EtcdBackend, EtcdConfig, keys};
use meshwork_lab::cilium::{Cluster, Sizes};
use meshwork_lab::etcd::{EtcdOptions, EtcdServer};
use tokio_util::sync::CancellationToken;

/// 300 ms: a heartbeat is stale after 600 ms, checked every 75 ms, so a remote that stops
/// writing is reconnected about 825 ms later.
const INTERVAL: &str = "--kvstore-heartbeat-interval=300ms";

/// 25 heartbeats, one every 100 ms: three times the time a stale heartbeat takes to
/// reconnect.
const HELD: u32 = 25;

const SIZES: Sizes = Sizes {
    nodes: 2,
    services: 1,
    identities: 3,
    ipcache: 10,
};

async fn beat(backend: &EtcdBackend) {
    let now = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
    backend.put(keys::HEARTBEAT_KEY, now).await.unwrap();
}

/// Writes a heartbeat every 100 ms until it is cancelled; counts them.
struct Heartbeats {
    stop: CancellationToken,
    written: Arc<AtomicU32>,
}

impl Heartbeats {
    fn start(backend: &EtcdBackend) -> Self {
        let (stop, written) = (CancellationToken::new(), Arc::new(AtomicU32::new(0)));
        let (backend, until, count) = (backend.clone(), stop.clone(), Arc::clone(&written));
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(100));
            loop {
                tokio::select! {
                    () = until.cancelled() => return,
                    _ = every.tick() => {
                        beat(&backend).await;
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        });
        Self { stop, written }
    }

    fn written(&self) -> u32 {
        self.written.load(Ordering::SeqCst)
    }
}

impl Drop for Heartbeats {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn a_stale_heartbeat_reconnects_the_remote_and_drains_nothing() {
    init_tracing();
    let server = EtcdServer::start().unwrap();
    let backend = connect(&server).await;
    let cluster = Cluster {
        name: "c1".to_owned(),
        id: 1,
        sizes: SIZES,
    };
    load(&backend, &cluster).await.unwrap();
    beat(&backend).await;
    let writer = Heartbeats::start(&backend);

    let options = Options::new("local", 9, Duration::from_secs(60))
        .flag("--enable-bpf-datapath=false")
        .flag(INTERVAL);
    let mesh = Mesh::start_with(options).await;
    mesh.add_server("c1", &server).await;
    let ready = mesh.status_until("c1", "ready", |s| s.ready()).await;
    assert!(ready.last_heartbeat.is_some(), "read at connect");
    let expected = Contribution {
        nodes: 2,
        services: 1,
        ipcache: 10,
    };
    mesh.contribution_until("c1", expected).await;

    // While the remote writes heartbeats the connection holds, and the status follows them.
    let from = writer.written();
    let held = mesh
        .status_until("c1", "25 more heartbeats", |_| {
            writer.written() >= from + HELD
        })
        .await;
    assert_eq!(held.failures, 0, "fresh heartbeats reconnected: {held:#?}");
    assert!(held.ready());
    let age = SystemTime::now()
        .duration_since(held.last_heartbeat.unwrap())
        .unwrap_or_default();
    assert!(age < Duration::from_secs(1), "the status follows: {age:?}");

    // The remote's writer stops: 600 ms later each check is a quorum error, the third in a
    // row reconnects (a failure), and the stores are kept.
    drop(writer);
    mesh.status_until("c1", "a reconnect for a stale heartbeat", |s| {
        s.failures >= 1 && s.last_failure.is_some()
    })
    .await;
    mesh.status_until("c1", "ready again after the reconnect", |s| s.ready())
        .await;
    assert_eq!(mesh.contribution("c1").await, expected);
    let deletes: Vec<String> = mesh
        .events()
        .await
        .into_iter()
        .filter(|e| e.contains("- "))
        .collect();
    assert!(
        deletes.is_empty(),
        "a heartbeat reconnect drained: {deletes:?}"
    );

    // Heartbeats again: the connection holds once more (one reconnect may have been under
    // way when they came back).
    let failures = mesh.status("c1").await.failures;
    let writer = Heartbeats::start(&backend);
    let held = mesh
        .status_until("c1", "25 new heartbeats", |_| writer.written() >= HELD)
        .await;
    assert!(held.failures <= failures + 1, "{held:#?}");
}

/// etcd-init's users on a TLS etcd; the config of a client of it as `user`.
fn cilium_roles(server: &EtcdServer, user: &str) -> EtcdConfig {
    let tls = server.tls().expect("a TLS etcd");
    let binary =
        Path::new(env!("CARGO_BIN_EXE_meshwork-agent")).with_file_name("meshwork-apiserver");
    let root = tls.client("root");
    let init = Command::new(&binary)
        .args(["etcd-init", "--cluster-name", "c1"])
        .args(["--kvstore-endpoints", &server.endpoint()])
        .arg("--kvstore-trusted-ca-file")
        .arg(&tls.ca_file)
        .arg("--kvstore-cert-file")
        .arg(&root.cert_file)
        .arg("--kvstore-key-file")
        .arg(&root.key_file)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (build the workspace)", binary.display()));
    assert!(
        init.status.success(),
        "etcd-init: {}",
        String::from_utf8_lossy(&init.stderr)
    );
    let cert = if user == "root" {
        root
    } else {
        tls.issue_client(user).unwrap()
    };
    EtcdConfig {
        endpoints: vec![server.endpoint()],
        trusted_ca_file: Some(tls.ca_file.clone()),
        cert_file: Some(cert.cert_file),
        key_file: Some(cert.key_file),
    }
}

/// Cilium's `remote` role grants the heartbeat and the cluster's config as single keys: an
/// agent reading as `remote` must watch each as a key (etcd cancels a prefix watch of
/// either), and must read the rest of what it needs within the role.
#[actix_rt::test]
#[ignore = "needs real etcd with TLS: `cargo xtask test` runs it"]
async fn as_cilium_remote_user_the_config_and_heartbeat_watches_hold() {
    init_tracing();
    let server = EtcdServer::start_with(EtcdOptions {
        tls: true,
        ..EtcdOptions::default()
    })
    .unwrap();
    let remote = cilium_roles(&server, "remote");
    let root = EtcdBackend::connect(&cilium_roles(&server, "root"), Duration::from_secs(10))
        .await
        .unwrap();
    let cluster = Cluster {
        name: "c1".to_owned(),
        id: 1,
        sizes: SIZES,
    };
    load(&root, &cluster).await.unwrap();
    beat(&root).await;
    let writer = Heartbeats::start(&root);

    let options = Options::new("local", 9, Duration::from_secs(60))
        .flag("--enable-bpf-datapath=false")
        .flag(INTERVAL);
    let mesh = Mesh::start_with(options).await;
    mesh.add("c1", remote).await;
    mesh.status_until("c1", "ready as remote", |s| s.ready())
        .await;
    let from = writer.written();
    let held = mesh
        .status_until("c1", "25 more heartbeats", |_| {
            writer.written() >= from + HELD
        })
        .await;
    assert_eq!(held.failures, 0, "a watch was refused: {held:#?}");
    let age = SystemTime::now()
        .duration_since(held.last_heartbeat.unwrap())
        .unwrap_or_default();
    assert!(age < Duration::from_secs(1), "heartbeats arrive: {age:?}");

    // The config watch follows its key: a new cluster ID restarts the connection.
    let (key, _) = cluster.config();
    let moved = Cluster {
        id: 7,
        ..cluster.clone()
    };
    root.put(&key, moved.config().1).await.unwrap();
    mesh.status_until("c1", "the new cluster ID", |s| s.cluster_id == 7)
        .await;
}
