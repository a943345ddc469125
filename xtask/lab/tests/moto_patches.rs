//! The patched moto server: its Python test suite passes against it, and it leaves no process
//! behind. Needs the venv of `cargo xtask setup` (moto, boto3).
//!
//! `cargo test -p meshwork-lab --test moto_patches -- --nocapture`

use std::fs::File;
use std::process::{Command, Stdio};
use std::time::Duration;

use meshwork_lab::moto::MotoServer;
use meshwork_lab::{paths, wait};

/// Deadline of the whole Python suite; a hung server call is cut off long before by the
/// suite's own client timeouts.
const SUITE_DEADLINE: Duration = Duration::from_secs(300);

#[test]
#[ignore = "needs the patched moto server: `cargo xtask test` runs it"]
fn python_suite_passes_against_the_patched_server() {
    let server = MotoServer::start().expect("start meshwork_moto");
    let python = paths::venv_python().expect("venv python");
    let out_dir = tempfile::tempdir().expect("temp dir");
    let out_path = out_dir.path().join("unittest.log");
    let out = File::create(&out_path).expect("create output file");
    let err = out.try_clone().expect("clone output handle");
    let mut child = Command::new(python)
        .args(["-m", "unittest", "-v", "test_meshwork_moto"])
        .current_dir(MotoServer::moto_dir())
        .env("MESHWORK_MOTO_ENDPOINT", server.endpoint())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("run the Python suite");
    let status = wait::until(
        "the Python suite",
        SUITE_DEADLINE,
        Duration::from_millis(100),
        || child.try_wait().ok().flatten(),
    );
    let status = status.unwrap_or_else(|timeout| {
        // Only our own child, by its handle.
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "{timeout}; output so far:\n{}",
            std::fs::read_to_string(&out_path).unwrap_or_default()
        )
    });
    let output = std::fs::read_to_string(&out_path).unwrap_or_default();
    println!("{output}");
    assert!(
        status.success(),
        "Python suite failed ({status}); server log tail:\n{}",
        std::fs::read_to_string(server.log())
            .map(|log| log.lines().rev().take(30).collect::<Vec<_>>().join("\n"))
            .unwrap_or_default()
    );
    assert!(output.contains("\nOK"), "no OK line in the suite's output");
}

#[test]
#[ignore = "needs the patched moto server: `cargo xtask test` runs it"]
fn control_endpoints_round_trip() {
    let server = MotoServer::start().expect("start meshwork_moto");
    server.reset().expect("reset");
    assert_eq!(server.calls().expect("calls").trim(), "{}");
    server
        .set_faults(r#"{"rules":[{"action":"DescribeVpcs","error":"Unavailable","status":503}]}"#)
        .expect("set faults");
    let rules = server
        .request("GET", "/meshwork/faults", None)
        .expect("get");
    assert!(rules.body.contains("DescribeVpcs"), "{}", rules.body);
    server.clear_faults().expect("clear faults");
    let rules = server
        .request("GET", "/meshwork/faults", None)
        .expect("get");
    assert!(!rules.body.contains("DescribeVpcs"), "{}", rules.body);
    let bad = server.set_faults("not json");
    assert!(bad.is_err(), "malformed rules must be refused");
    assert!(server.call_counts().expect("counts").is_empty());
}

#[test]
#[ignore = "needs the patched moto server: `cargo xtask test` runs it"]
fn drop_stops_the_server() {
    let server = MotoServer::start().expect("start meshwork_moto");
    let pid = server.pid();
    let port = server.port();
    let dir = server.dir().to_owned();
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    drop(server);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "moto (pid {pid}) still exists after drop"
    );
    assert!(!wait::port_open(port), "port {port} still open after drop");
    assert!(!dir.exists(), "temp dir {} left behind", dir.display());
}
