//! The restart timeline end to end: the real `meshwork-agent` with one remote cluster on a
//! real etcd, read by the real `meshctl timeline` (JSON, the table and the SVG).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use meshwork_lab::agent::{AgentOptions, AgentProcess};
use meshwork_lab::etcd::EtcdServer;
use meshwork_lab::wait;
use serde_json::Value;

mod common;
use common::binaries::{agent_binary, meshctl};

fn run_meshctl(socket: &Path, args: &[&str]) -> std::process::Output {
    Command::new(meshctl())
        .env_remove("MESHWORK_SOCKET")
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .unwrap()
}

fn timeline_json(socket: &Path) -> Option<Value> {
    let output = run_meshctl(socket, &["timeline", "--json"]);
    output
        .status
        .success()
        .then(|| serde_json::from_slice(&output.stdout).expect("meshctl prints JSON"))
}

/// The position of the first step matching `step`, `cluster` and `kind`.
fn position(steps: &[Value], step: &str, cluster: Option<&str>, kind: Option<&str>) -> usize {
    steps
        .iter()
        .position(|s| {
            s["step"] == step
                && cluster.is_none_or(|c| s["cluster"] == c)
                && kind.is_none_or(|k| s["kind"] == k)
        })
        .unwrap_or_else(|| panic!("no {step} {cluster:?} {kind:?} in {steps:#?}"))
}

#[test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
fn meshctl_timeline_lists_the_start_in_order() {
    let etcd = EtcdServer::start().unwrap();
    common::load_blocking(&etcd, &common::small_c2());
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("clustermesh");
    std::fs::create_dir(&config).unwrap();
    meshwork_lab::agent::write_cluster_config(&config, "c2", &etcd.endpoint()).unwrap();
    let options = AgentOptions::new(agent_binary(), "c1", 1, &dir.path().join("state"))
        .clustermesh_config(&config)
        .metrics_port(wait::free_port().unwrap());
    let socket = options.socket();
    let _agent = AgentProcess::start(&options).unwrap();

    // The start-up wait's last kind returned: every step before it is in.
    let timeline = wait::until(
        "the readiness wait for IPIdentitiesSynced on the timeline",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            timeline_json(&socket).filter(|t| {
                t["steps"].as_array().unwrap().iter().any(|s| {
                    s["step"] == "wait-returned"
                        && s["waiter"] == "readiness"
                        && s["kind"] == "IPIdentitiesSynced"
                })
            })
        },
    )
    .unwrap();
    let steps = timeline["steps"].as_array().unwrap();
    assert_eq!(steps[0]["step"], "start", "{timeline:#}");
    assert_eq!(steps[0]["offset_us"], 0);
    let connected = position(steps, "connected", Some("c2"), None);
    let lists: Vec<usize> = ["nodes", "services", "identities", "ipcache"]
        .into_iter()
        .map(|kind| position(steps, "first-list", Some("c2"), Some(kind)))
        .collect();
    let ready = position(steps, "wait-returned", None, Some("IPIdentitiesSynced"));
    assert!(0 < connected, "{timeline:#}");
    assert!(
        lists.iter().all(|&l| connected < l && l < ready),
        "{timeline:#}"
    );
    for wait in steps.iter().filter(|s| s["step"] == "wait-returned") {
        assert_eq!(wait["wait_end"], "synced", "{wait}");
        assert_eq!(wait["waiter"], "readiness", "{wait}");
    }
    let offsets: Vec<u64> = steps
        .iter()
        .map(|s| s["offset_us"].as_u64().unwrap())
        .collect();
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]), "{offsets:?}");
    assert_eq!(timeline["dropped"], 0);

    // The table and the picture of the same timeline.
    let svg = dir.path().join("timeline.svg");
    let output = run_meshctl(&socket, &["timeline", "--svg", svg.to_str().unwrap()]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let table = String::from_utf8(output.stdout).unwrap();
    assert!(
        table.lines().nth(1).unwrap().starts_with("OFFSET "),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.contains("first-list") && l.contains("c2") && l.contains("ipcache")),
        "{table}"
    );
    let svg = std::fs::read_to_string(&svg).unwrap();
    let rows: Vec<usize> = ["nodes", "services", "identities", "ipcache"]
        .iter()
        .map(|kind| {
            svg.find(&format!(">\nc2 · {kind}\n</text>"))
                .unwrap_or_else(|| panic!("no row for c2 · {kind}:\n{svg}"))
        })
        .collect();
    assert!(rows.windows(2).all(|w| w[0] < w[1]), "{svg}");
    assert!(svg.contains(">\nready (SERVING)\n</text>"), "{svg}");
}
