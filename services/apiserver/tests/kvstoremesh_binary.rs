//! `meshwork-apiserver kvstoremesh`, the binary: `/readyz` follows the cache, `meshctl
//! --kvstoremesh` shows it, and a SIGKILL and restart while the remote changes deletes no
//! cached entry the remote still has.

#[path = "../../kvstoremesh/tests/common/mod.rs"]
mod cache;
mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::apiserver::{http_get, wait_readyz};
use meshwork_lab::etcd::EtcdServer;
use meshwork_lab::kvstoremesh::{KvstoremeshOptions, KvstoremeshProcess};
use meshwork_lab::wait::Wait;

/// Runs meshctl (built beside this binary by the workspace build) against kvstoremesh's
/// API on `port`: exit code, stdout, stderr.
fn meshctl(port: u16, args: &[&str]) -> (i32, String, String) {
    let binary = Path::new(env!("CARGO_BIN_EXE_meshwork-apiserver")).with_file_name("meshctl");
    assert!(
        binary.exists(),
        "{} is missing: build the workspace",
        binary.display()
    );
    let output = Command::new(binary)
        .env_remove("MESHWORK_KVSTOREMESH")
        .args(["--kvstoremesh", &format!("127.0.0.1:{port}")])
        .args(args)
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[actix_rt::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn sigkill_and_restart_while_the_remote_changes_deletes_no_live_entry() {
    let local = EtcdServer::start().unwrap();
    let c1 = cache::cluster("c1", 1);
    let server = cache::loaded(&c1).await;
    let dir = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    cache::configure(dir.path(), "c1", &server);
    let options = KvstoremeshOptions::new(
        Path::new(env!("CARGO_BIN_EXE_meshwork-apiserver")),
        ("local", 9),
        &local.endpoint(),
        dir.path(),
        logs.path(),
    )
    .unwrap();
    let (health, api) = (options.health_port, options.api_port);
    let mut first = KvstoremeshProcess::start(&options, 1).unwrap();
    wait_readyz(health, Duration::from_secs(30)).await.unwrap();
    let backend = cache::connect(&local).await;
    let remote = cache::connect(&server).await;
    cache::converged(&backend, &remote, "c1").await;
    let from = backend.revision("cilium/").await.unwrap() + 1;

    let (code, json, err) = meshctl(api, &["status", "--json"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        json.contains(r#""name":"c1","ready":true,"connected":true,"cluster_id":1"#)
            && json.contains(r#""entries":{"nodes":3,"services":2,"identities":5,"endpoints":20}"#),
        "{json}"
    );

    first.process().kill();
    let (code, _, err) = meshctl(api, &["status"]);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("cannot reach kvstoremesh at 127.0.0.1:"),
        "{err}"
    );
    let (gone, _) = c1.node(2);
    remote.delete(&gone).await.unwrap();
    let (added, value) = c1.node(7);
    remote.put(&added, value).await.unwrap();
    let mut second = KvstoremeshProcess::start(&options, 2).unwrap();
    wait_readyz(health, Duration::from_secs(30)).await.unwrap();
    cache::converged(&backend, &remote, "c1").await;

    assert_eq!(
        cache::events_since(&backend, "cilium/cache/", from).await,
        [
            "+cilium/cache/nodes/v1/c1/c1-node-7",
            "-cilium/cache/nodes/v1/c1/c1-node-2",
        ],
        "only the new node written, only the vanished one deleted"
    );
    let (status, body) = http_get(health, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    let (code, text, err) = meshctl(api, &["status"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        text.contains("ClusterMesh:   1/1 remote clusters ready"),
        "{text}"
    );
    assert!(
        text.contains("   c1: ready, 3 nodes, 20 endpoints"),
        "{text}"
    );
    assert!(text.contains("KVStoreMesh:   ready ("), "{text}");
    second
        .process()
        .signal(nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    let exited = Wait::new("kvstoremesh to exit on SIGTERM")
        .until(|| second.process().exit_status(), Option::is_some)
        .unwrap_or_else(|err| panic!("{err}"));
    assert!(exited.is_some_and(|s| s.success()), "{}", second.log_tail());
}
