//! `meshwork-apiserver etcd-init` against a real etcd with `--client-cert-auth`: it creates
//! Cilium's users and roles (and is idempotent); a remote agent's user (`remote`) can read
//! this cluster's state, config and canaries and cannot write, nor read another cluster's
//! config; the apiserver runs as its own user (`admin-<cluster>`); run as a user that is not
//! root, etcd-init fails and says why.

use std::process::{Command, Output};
use std::time::Duration;

use meshwork_kvstore::{EtcdBackend, EtcdConfig};
use meshwork_lab::etcd::{ClientCert, EtcdOptions, EtcdServer};
use meshwork_lab::process::LabProcess;
use meshwork_lab::wait::{Wait, free_port};
use nix::sys::signal::Signal;

const BINARY: &str = env!("CARGO_BIN_EXE_meshwork-apiserver");

fn tls_flags(etcd: &EtcdServer, cert: &ClientCert) -> Vec<String> {
    let tls = etcd.tls().expect("a TLS etcd");
    vec![
        "--kvstore-endpoints".to_owned(),
        etcd.endpoint(),
        "--kvstore-trusted-ca-file".to_owned(),
        tls.ca_file.display().to_string(),
        "--kvstore-cert-file".to_owned(),
        cert.cert_file.display().to_string(),
        "--kvstore-key-file".to_owned(),
        cert.key_file.display().to_string(),
    ]
}

fn etcd_init(etcd: &EtcdServer, cert: &ClientCert) -> Output {
    Command::new(BINARY)
        .args(["etcd-init", "--cluster-name", "c1"])
        .args(tls_flags(etcd, cert))
        .output()
        .unwrap()
}

async fn connect_as(etcd: &EtcdServer, cert: &ClientCert) -> EtcdBackend {
    let tls = etcd.tls().expect("a TLS etcd");
    let config = EtcdConfig {
        endpoints: vec![etcd.endpoint()],
        trusted_ca_file: Some(tls.ca_file.clone()),
        cert_file: Some(cert.cert_file.clone()),
        key_file: Some(cert.key_file.clone()),
    };
    EtcdBackend::connect(&config, Duration::from_secs(10))
        .await
        .unwrap()
}

fn denied<T: std::fmt::Debug>(result: &Result<T, meshwork_kvstore::KvstoreError>) -> bool {
    matches!(result, Err(err) if err.to_string().contains("permission denied"))
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs real etcd with TLS: `cargo xtask test` runs it"]
async fn users_and_roles_let_remote_read_only_and_the_apiserver_write() {
    let etcd = EtcdServer::start_with(EtcdOptions {
        tls: true,
        ..EtcdOptions::default()
    })
    .unwrap();
    let tls = etcd.tls().unwrap().clone();
    let root = tls.client("root");

    let first = etcd_init(&etcd, &root);
    let stdout = String::from_utf8_lossy(&first.stdout);
    assert!(
        first.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&first.stderr)
    );
    for line in [
        "role remote: added",
        "role local: added",
        "user remote: added",
        "user admin-c1: added",
        "user root: present",
    ] {
        assert!(stdout.lines().any(|l| l == line), "{line} in:\n{stdout}");
    }
    let again = etcd_init(&etcd, &root);
    let stdout = String::from_utf8_lossy(&again.stdout);
    assert!(again.status.success(), "idempotent: {stdout}");
    assert!(
        stdout.lines().any(|l| l == "user remote: present"),
        "{stdout}"
    );

    // The apiserver runs as admin-c1 and writes.
    let admin = tls.issue_client("admin-c1").unwrap();
    let health = free_port().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(BINARY);
    command
        .args([
            "--cluster-name",
            "c1",
            "--cluster-id",
            "1",
            "--initial-sync-timeout",
            "1s",
        ])
        .args(tls_flags(&etcd, &admin))
        .args([
            "--grpc-serve-addr",
            &format!("127.0.0.1:{}", free_port().unwrap()),
        ])
        .args(["--health-serve-addr", &format!("127.0.0.1:{health}")])
        .args(["--prometheus-serve-addr", ""]);
    let mut apiserver =
        LabProcess::spawn("meshwork-apiserver", command, &dir.path().join("log")).unwrap();
    let remote = connect_as(&etcd, &tls.issue_client("remote").unwrap()).await;
    let canary = "cilium/synced/c1/cilium/state/nodes/v1";
    let written = Wait::new("the apiserver's canaries, read as remote")
        .timeout(Duration::from_secs(30))
        .every(Duration::from_millis(100))
        .until_async(|| remote.get(canary), |r| matches!(r, Ok(Some(_))))
        .await;
    assert!(
        written.is_ok(),
        "{written:?}; log:\n{}",
        apiserver.log_tail()
    );
    apiserver.signal(Signal::SIGTERM).unwrap();

    // remote reads this cluster's state, config and heartbeat, writes nothing, and cannot
    // read another cluster's config.
    assert!(
        remote
            .get("cilium/cluster-config/c1")
            .await
            .unwrap()
            .is_some()
    );
    assert!(remote.get("cilium/state/nodes/v1/c1/n1").await.is_ok());
    assert!(remote.get("cilium/.heartbeat").await.is_ok());
    let write = remote.put("cilium/state/nodes/v1/c1/n1", "{}").await;
    assert!(denied(&write), "{write:?}");
    assert!(denied(&remote.get("cilium/cluster-config/c2").await));
    assert!(denied(&remote.get("meshwork/ciliumnodes/v1/n1").await));

    // The negative control: etcd-init as a user that is not root fails, saying why.
    let as_remote = etcd_init(&etcd, &tls.client("remote"));
    let stderr = String::from_utf8_lossy(&as_remote.stderr);
    assert!(!as_remote.status.success());
    assert!(
        stderr.contains("is the client certificate's CN root?"),
        "{stderr}"
    );
    Wait::new("the apiserver to exit")
        .timeout(Duration::from_secs(15))
        .some(|| apiserver.exit_status())
        .unwrap();
}
