//! `meshctl troubleshoot clustermesh`, the binary, against the lab's TLS etcd: a healthy
//! remote passes every check, and each way a remote breaks fails the check that names it
//! (and exits 1), while warnings alone exit 0.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime};

use meshwork_lab::agent::{AgentOptions, AgentProcess};
use meshwork_lab::etcd::{Access, ClientCert, EtcdOptions, EtcdServer, EtcdTls};
use meshwork_lab::kvstoremesh::{KvstoremeshOptions, KvstoremeshProcess};
use meshwork_lab::net::LabNet;
use serde_json::Value;

const DAY: Duration = Duration::from_secs(86_400);

/// Every check a healthy TLS remote with one endpoint passes, in order.
const HEALTHY: &[&str] = &[
    "config",
    "url",
    "tcp",
    "tls",
    "server-cert",
    "version",
    "trusted-ca",
    "client-cert",
    "etcd-connect",
    "authorization",
    "etcd-cluster",
    "heartbeat",
    "cluster-config",
];

/// Runs meshctl: exit code, stdout, stderr.
fn meshctl(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_meshctl"))
        .env_remove("MESHWORK_SOCKET")
        .env_remove("MESHWORK_KVSTOREMESH")
        .args(args)
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `troubleshoot clustermesh --json` over `dir`: the exit code and the report.
fn troubleshoot(dir: &Path) -> (i32, Value) {
    let dir = dir.to_str().unwrap();
    let (code, out, err) = meshctl(&[
        "troubleshoot",
        "clustermesh",
        "--clustermesh-config",
        dir,
        "--json",
    ]);
    let report = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out:?} {err}"));
    (code, report)
}

fn cluster<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no cluster {name} in {report}"))
}

/// The checks of `name`, in order.
fn checks(report: &Value, name: &str) -> Vec<String> {
    cluster(report, name)["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["check"].as_str().unwrap().to_owned())
        .collect()
}

/// The checks of `name` that came out `status`.
fn with_status(report: &Value, name: &str, status: &str) -> Vec<String> {
    cluster(report, name)["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == status)
        .map(|c| c["check"].as_str().unwrap().to_owned())
        .collect()
}

/// The first check `kind` of `name`.
fn check<'a>(report: &'a Value, name: &str, kind: &str) -> &'a Value {
    cluster(report, name)["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == kind)
        .unwrap_or_else(|| panic!("no {kind} check of {name}"))
}

fn message(check: &Value) -> &str {
    check["message"].as_str().unwrap()
}

fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_seconds(time).to_string()
}

/// A TLS etcd as cluster `name` (ID `id`) writes it: a fresh heartbeat and its cluster
/// config, and the `remote` user (read on `cilium/`).
fn remote(name: &str, id: u32) -> (EtcdServer, ClientCert) {
    let etcd = EtcdServer::start_with(EtcdOptions {
        tls: true,
        ..EtcdOptions::default()
    })
    .unwrap();
    seed_heartbeat(&etcd, SystemTime::now());
    let config = format!(
        r#"{{"id":{id},"capabilities":{{"syncedCanaries":true,"maxConnectedClusters":255}}}}"#
    );
    etcd.ctl(&["put", &format!("cilium/cluster-config/{name}"), &config])
        .unwrap();
    let user = etcd.add_user("remote", "cilium/", Access::Read).unwrap();
    (etcd, user)
}

fn seed_heartbeat(etcd: &EtcdServer, at: SystemTime) {
    etcd.ctl(&["put", "cilium/.heartbeat", &rfc3339(at)])
        .unwrap();
}

/// `<dir>/<name>`: the agent's config file for `endpoint`.
fn configure(dir: &Path, name: &str, endpoint: &str, ca: &Path, cert: &ClientCert) {
    let file = format!(
        "endpoints:\n- {endpoint}\ntrusted-ca-file: {}\ncert-file: {}\nkey-file: {}\n",
        ca.display(),
        cert.cert_file.display(),
        cert.key_file.display()
    );
    std::fs::write(dir.join(name), file).unwrap();
}

fn ca(etcd: &EtcdServer) -> &Path {
    &etcd.tls().unwrap().ca_file
}

#[test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
fn a_healthy_remote_passes_every_check() {
    let (etcd, user) = remote("c2", 2);
    let dir = tempfile::tempdir().unwrap();
    configure(dir.path(), "c2", &etcd.endpoint(), ca(&etcd), &user);

    let (code, report) = troubleshoot(dir.path());
    assert_eq!(code, 0, "{report}");
    assert_eq!(checks(&report, "c2"), HEALTHY, "{report}");
    assert_eq!(with_status(&report, "c2", "ok"), HEALTHY, "{report}");
    assert_eq!(report["status"], "ok");
    assert!(message(check(&report, "c2", "version")).starts_with("etcd 3."));
    assert_eq!(
        message(check(&report, "c2", "authorization")),
        "user remote reads cilium/.heartbeat"
    );
    assert_eq!(
        message(check(&report, "c2", "cluster-config")),
        "ID 2, syncedCanaries, maxConnectedClusters 255"
    );

    // The human view: one ✔ line per check, nothing else marked.
    let path = dir.path().to_str().unwrap();
    let (code, text, _) = meshctl(&["troubleshoot", "clustermesh", "--clustermesh-config", path]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(text.matches('✔').count(), HEALTHY.len(), "{text}");
    assert!(!text.contains('✖') && !text.contains('⚠'), "{text}");
    assert!(text.contains(&format!(
        "  {}\n    ✔ URL: https, host 127.0.0.1",
        etcd.endpoint()
    )));
    assert!(
        text.ends_with("1 cluster checked: 1 ok, 0 with warnings, 0 failing\n"),
        "{text}"
    );
}

#[test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
fn a_wrong_ca_fails_the_handshake_and_a_foreign_client_cert_shows_the_accepted_cas() {
    let (etcd, user) = remote("c2", 2);
    let dir = tempfile::tempdir().unwrap();
    let other = tempfile::tempdir().unwrap();
    let foreign = EtcdTls::foreign(other.path()).unwrap();
    // Our trusted-ca-file is not the CA of the server's certificate.
    configure(
        dir.path(),
        "wrong-ca",
        &etcd.endpoint(),
        &foreign.ca_file,
        &user,
    );
    // Our client certificate is of a CA the server does not accept.
    configure(
        dir.path(),
        "foreign-cert",
        &etcd.endpoint(),
        ca(&etcd),
        &foreign.client("root"),
    );

    let (code, report) = troubleshoot(dir.path());
    assert_eq!(code, 1, "{report}");
    assert_eq!(
        with_status(&report, "wrong-ca", "fail"),
        ["tls", "etcd-connect"],
        "{report}"
    );
    let tls = message(check(&report, "wrong-ca", "tls"));
    assert!(tls.contains("UnknownIssuer"), "{tls}");
    // Cilium's extra warning: our certificate is not of the CA we trust.
    assert_eq!(
        with_status(&report, "wrong-ca", "warn"),
        ["client-cert"],
        "{report}"
    );

    assert_eq!(
        with_status(&report, "foreign-cert", "fail"),
        ["tls", "etcd-connect"],
        "{report}"
    );
    let tls = check(&report, "foreign-cert", "tls");
    assert_eq!(
        message(tls),
        "the client certificate (cert-file) is issued by none of the CAs the server accepts"
    );
    assert_eq!(tls["details"][0], "acceptable CAs: CN=meshwork-lab-ca");
    assert!(
        !checks(&report, "foreign-cert").contains(&"version".to_owned()),
        "no GET /version after a refused client certificate: {report}"
    );
}

#[test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
fn an_expired_client_cert_fails_and_a_soon_expiring_one_warns() {
    let (etcd, _) = remote("c2", 2);
    let tls = etcd.tls().unwrap();
    let now = SystemTime::now();
    let expired = tls
        .issue_client_valid("remote", now - 30 * DAY, now - DAY)
        .unwrap();
    let soon = tls
        .issue_client_valid("remote", now - DAY, now + 10 * DAY)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    configure(dir.path(), "expired", &etcd.endpoint(), ca(&etcd), &expired);
    configure(dir.path(), "soon", &etcd.endpoint(), ca(&etcd), &soon);
    // Both read the config of c2 (the file name is the cluster name).
    etcd.ctl(&["put", "cilium/cluster-config/expired", r#"{"id":3}"#])
        .unwrap();
    etcd.ctl(&["put", "cilium/cluster-config/soon", r#"{"id":4}"#])
        .unwrap();

    let (code, report) = troubleshoot(dir.path());
    assert_eq!(code, 1, "{report}");
    // TLS 1.3: the handshake completes on our side; the refusal comes with GET /version.
    assert_eq!(
        with_status(&report, "expired", "fail"),
        ["version", "client-cert", "etcd-connect"],
        "{report}"
    );
    let version = message(check(&report, "expired", "version"));
    assert!(
        version.starts_with("TLS client authentication failed"),
        "{version}"
    );
    let cert = message(check(&report, "expired", "client-cert"));
    assert!(cert.contains("; expired 1 day ago ("), "{cert}");

    assert_eq!(cluster(&report, "soon")["status"], "warn", "{report}");
    assert_eq!(
        with_status(&report, "soon", "warn"),
        ["client-cert"],
        "{report}"
    );
    assert_eq!(checks(&report, "soon"), HEALTHY, "{report}");
    let cert = message(check(&report, "soon", "client-cert"));
    assert!(cert.contains("; expires in 9 days ("), "{cert}");

    // Warnings alone do not fail the run.
    let (code, report) = {
        let path = dir.path().to_str().unwrap();
        let (code, out, _) = meshctl(&[
            "troubleshoot",
            "clustermesh",
            "soon",
            "--clustermesh-config",
            path,
            "--json",
        ]);
        (code, serde_json::from_str::<Value>(&out).unwrap())
    };
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["clusters"].as_array().unwrap().len(), 1);
}

#[test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
fn a_user_who_may_not_read_the_heartbeat_fails_authorization() {
    let (etcd, _) = remote("c2", 2);
    let reader = etcd
        .add_user("state-reader", "cilium/state/", Access::Read)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    configure(dir.path(), "c2", &etcd.endpoint(), ca(&etcd), &reader);

    let (code, report) = troubleshoot(dir.path());
    assert_eq!(code, 1, "{report}");
    assert_eq!(
        with_status(&report, "c2", "fail"),
        ["authorization"],
        "{report}"
    );
    assert_eq!(checks(&report, "c2"), HEALTHY[..10], "{report}");
    let auth = message(check(&report, "c2", "authorization"));
    assert!(
        auth.starts_with("user state-reader cannot read cilium/.heartbeat")
            && auth.contains("permission denied"),
        "{auth}"
    );
}

#[test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
fn a_stale_heartbeat_warns_and_a_missing_announced_config_fails() {
    let (etcd, user) = remote("c2", 2);
    seed_heartbeat(&etcd, SystemTime::now() - Duration::from_secs(5 * 60));
    etcd.ctl(&["del", "cilium/cluster-config/c2"]).unwrap();
    etcd.ctl(&["put", "cilium/.has-cluster-config", "true"])
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    configure(dir.path(), "c2", &etcd.endpoint(), ca(&etcd), &user);

    let (code, report) = troubleshoot(dir.path());
    assert_eq!(code, 1, "{report}");
    assert_eq!(
        with_status(&report, "c2", "warn"),
        ["heartbeat"],
        "{report}"
    );
    assert_eq!(
        with_status(&report, "c2", "fail"),
        ["cluster-config"],
        "{report}"
    );
    let heartbeat = message(check(&report, "c2", "heartbeat"));
    assert!(
        heartbeat.ends_with("5 minutes ago: older than 2 minutes"),
        "{heartbeat}"
    );
}

#[test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
fn a_stopped_etcd_fails_the_tcp_connect() {
    let (mut etcd, user) = remote("c2", 2);
    let dir = tempfile::tempdir().unwrap();
    configure(dir.path(), "c2", &etcd.endpoint(), ca(&etcd), &user);
    etcd.stop();

    let (code, report) = troubleshoot(dir.path());
    assert_eq!(code, 1, "{report}");
    assert_eq!(
        with_status(&report, "c2", "fail"),
        ["tcp", "etcd-connect"],
        "{report}"
    );
    assert_eq!(
        checks(&report, "c2"),
        [
            "config",
            "url",
            "tcp",
            "trusted-ca",
            "client-cert",
            "etcd-connect"
        ],
        "the certificates are still checked: {report}"
    );
    let tcp = message(check(&report, "c2", "tcp"));
    assert!(tcp.contains("Connection refused"), "{tcp}");
}

/// A name under `.invalid` (RFC 6761) looked up from a network namespace of the lab's:
/// there the system resolver is unreachable, so the lookup fails on this machine and the
/// query never leaves it (the resolver's address is in a routed private range).
#[test]
#[ignore = "needs root for a network namespace: `cargo xtask test` runs it"]
fn a_name_that_does_not_resolve_fails_dns() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("c2"),
        "endpoints:\n- http://meshwork-troubleshoot.invalid:2379\n",
    )
    .unwrap();

    let lab = LabNet::new().unwrap();
    let netns = lab.netns("dns").unwrap();
    let output = netns
        .command(env!("CARGO_BIN_EXE_meshctl"))
        .env_remove("MESHWORK_SOCKET")
        .env_remove("MESHWORK_KVSTOREMESH")
        .args([
            "troubleshoot",
            "clustermesh",
            "--json",
            "--clustermesh-config",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&output.stdout);
    let report: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    assert_eq!(output.status.code(), Some(1), "{report}");
    assert_eq!(
        checks(&report, "c2"),
        ["config", "url", "dns", "trusted-ca", "etcd-connect"],
        "{report}"
    );
    assert_eq!(
        with_status(&report, "c2", "fail"),
        ["dns", "etcd-connect"],
        "{report}"
    );
    let dns = check(&report, "c2", "dns");
    assert_eq!(dns["endpoint"], "http://meshwork-troubleshoot.invalid:2379");
    assert!(
        message(dns).starts_with("cannot resolve meshwork-troubleshoot.invalid"),
        "{dns}"
    );
}

#[test]
fn a_broken_file_fails_the_config_check_and_an_unreadable_directory_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("c2"),
        "endpoints: [\"https://h:1\"]\ncert-file: /c\n",
    )
    .unwrap();
    let (code, report) = troubleshoot(dir.path());
    assert_eq!(code, 1, "{report}");
    assert_eq!(checks(&report, "c2"), ["config"]);
    assert!(message(check(&report, "c2", "config")).contains("must be given together"));

    let (code, _, err) = meshctl(&[
        "troubleshoot",
        "clustermesh",
        "--clustermesh-config",
        "/nonexistent/meshwork",
    ]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("does not exist"), "{err}");
}

/// The agent and kvstoremesh report their directory, and their remotes are the default.
#[test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
fn the_agent_and_kvstoremesh_report_their_config_directory() {
    let (etcd, user) = remote("c2", 2);
    let dir = tempfile::tempdir().unwrap();
    configure(dir.path(), "c2", &etcd.endpoint(), ca(&etcd), &user);
    let expect = |code: i32, out: &str, err: &str| {
        assert_eq!(code, 0, "{out} {err}");
        let report: Value = serde_json::from_str(out).unwrap();
        assert_eq!(report["config_dir"], dir.path().to_str().unwrap());
        assert_eq!(checks(&report, "c2"), HEALTHY, "{report}");
    };
    let bin = Path::new(env!("CARGO_BIN_EXE_meshctl"));
    let built = |name: &str| {
        let binary = bin.with_file_name(name);
        assert!(
            binary.exists(),
            "{} is missing: build the workspace",
            binary.display()
        );
        binary
    };

    let state = tempfile::tempdir().unwrap();
    let options = AgentOptions::new(&built("meshwork-agent"), "local", 9, state.path())
        .clustermesh_config(dir.path());
    let _agent = AgentProcess::start(&options).unwrap();
    let socket = options.socket();
    let (code, out, err) = meshctl(&[
        "--socket",
        socket.to_str().unwrap(),
        "troubleshoot",
        "clustermesh",
        "--json",
    ]);
    expect(code, &out, &err);

    let local = EtcdServer::start().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let options = KvstoremeshOptions::new(
        &built("meshwork-apiserver"),
        ("local", 9),
        &local.endpoint(),
        dir.path(),
        logs.path(),
    )
    .unwrap();
    let _kvstoremesh = KvstoremeshProcess::start(&options, 1).unwrap();
    let (code, out, err) = meshctl(&[
        "--kvstoremesh",
        &options.api_addr(),
        "troubleshoot",
        "clustermesh",
        "--json",
    ]);
    expect(code, &out, &err);
}
