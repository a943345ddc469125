//! End to end with the real binaries: `meshwork-agent` against real etcd servers (one per
//! remote cluster), read by `meshctl status --json`, metrics checked by `promtool`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use meshwork_lab::agent::{AgentOptions, AgentProcess};
use meshwork_lab::cilium::{Cluster, Sizes};
use meshwork_lab::etcd::EtcdServer;
use meshwork_lab::wait;

mod common;
use common::binaries::{agent_binary, meshctl};

use common::prometheus;

const SIZES: Sizes = Sizes {
    nodes: 2,
    services: 1,
    identities: 3,
    ipcache: 10,
};

fn load(server: &EtcdServer, name: &str, id: u32) {
    let cluster = Cluster {
        name: name.to_owned(),
        id,
        sizes: SIZES,
    };
    common::load_blocking(server, &cluster);
}

fn write_config(dir: &Path, name: &str, server: &EtcdServer) {
    meshwork_lab::agent::write_cluster_config(dir, name, &server.endpoint()).unwrap();
}

fn status_json(socket: &Path) -> Option<serde_json::Value> {
    let output = Command::new(meshctl())
        .args(["--socket"])
        .arg(socket)
        .args(["status", "--json"])
        .output()
        .unwrap();
    output
        .status
        .success()
        .then(|| serde_json::from_slice(&output.stdout).expect("meshctl prints JSON"))
}

fn until<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    wait::until(
        what,
        Duration::from_secs(60),
        Duration::from_millis(100),
        &mut check,
    )
    .unwrap()
}

#[test]
#[ignore = "needs real etcd and promtool: `cargo xtask test` runs it"]
fn agent_status_json_metrics_drain_and_sigterm() {
    let c1 = EtcdServer::start().unwrap();
    let c2 = EtcdServer::start().unwrap();
    let c3 = EtcdServer::start().unwrap();
    load(&c1, "c1", 1);
    load(&c2, "c2", 2);
    load(&c3, "c3", 1); // the same ID as c1: must not become ready
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("clustermesh");
    std::fs::create_dir(&config).unwrap();
    write_config(&config, "c1", &c1);
    write_config(&config, "c2", &c2);
    write_config(&config, "local", &c3); // named like the local cluster: ignored
    let metrics_port = wait::free_port().unwrap();
    let options = AgentOptions::new(agent_binary(), "local", 9, &dir.path().join("state"))
        .clustermesh_config(&config)
        .metrics_port(metrics_port)
        .env("RUST_LOG", "info");
    let socket = options.socket();
    let mut agent = AgentProcess::start(&options).unwrap();

    let status = until("c1 and c2 ready", || {
        status_json(&socket).filter(|s| s["clustermesh"]["ready"] == 2)
    });
    assert_eq!(status["clustermesh"]["total"], 2, "{status}");
    // Now a third cluster with c1's ID.
    write_config(&config, "c3", &c3);
    let status = until("c3 reported", || {
        status_json(&socket).filter(|s| {
            s["clustermesh"]["clusters"][2]["last_error"] == "clusterID 1 is already used"
        })
    });
    let expected_c1 = serde_json::json!({
        "name": "c1", "ready": true, "connected": true, "cluster_id": 1,
        "config": {"required": false, "retrieved": true},
        "synced": {"nodes": true, "services": true, "identities": true, "endpoints": true},
        "entries": {"nodes": 2, "services": 1, "identities": 3, "endpoints": 10},
        "failures": 0, "last_failure": null, "last_error": null,
    });
    let c1_status = status["clustermesh"]["clusters"][0].as_object().unwrap();
    for (key, value) in expected_c1.as_object().unwrap() {
        assert_eq!(&c1_status[key], value, "field {key} of {status}");
    }
    assert_eq!(status["clustermesh"]["ready"], 2);
    assert_eq!(status["clustermesh"]["total"], 3);
    assert_eq!(status["clustermesh"]["clusters"][2]["ready"], false);
    // The exact shape: the field order of the contract.
    let raw = Command::new(meshctl())
        .arg("--socket")
        .arg(&socket)
        .args(["status", "--json"])
        .output()
        .unwrap();
    let raw = String::from_utf8(raw.stdout).unwrap();
    assert!(
        raw.starts_with(r#"{"clustermesh":{"ready":2,"total":3,"clusters":[{"name":"c1","ready":true,"connected":true,"cluster_id":1,"config":{"required":false,"retrieved":true},"synced":{"nodes":true,"services":true,"identities":true,"endpoints":true},"entries":{"nodes":2,"services":1,"identities":3,"endpoints":10},"failures":0,"last_failure":null,"last_error":null"#),
        "{raw}"
    );

    let metrics = prometheus::scrape(metrics_port).expect("the agent serves /metrics");
    assert!(metrics.contains("meshwork_remote_clusters 3"), "{metrics}");
    assert!(
        metrics.contains(r#"meshwork_remote_cluster_readiness_status{target_cluster="c1"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"meshwork_remote_cluster_endpoints{target_cluster="c2"} 10"#),
        "{metrics}"
    );
    prometheus::assert_promtool_clean(&metrics);

    // Removing a config file removes the cluster.
    std::fs::remove_file(config.join("c2")).unwrap();
    until("c2 removed", || {
        status_json(&socket).filter(|s| s["clustermesh"]["total"] == 2)
    });

    agent
        .process()
        .signal(nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    let started = Instant::now();
    until("the agent exits after SIGTERM", || {
        (!agent.process().is_running()).then_some(())
    });
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(!socket.exists(), "the agent removes its socket");
    let log = std::fs::read_to_string(agent.log()).unwrap();
    assert!(log.contains("meshwork-agent stopped"), "{log}");
}
