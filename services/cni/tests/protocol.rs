//! The CNI protocol of the built binary: environment and stdin in, JSON and exit status
//! out. Each case fails before any namespace is entered or changed, so these need no root
//! (the one that reaches the agent's socket is given one that does not exist).

use std::io::Write as _;
use std::process::{Command, Stdio};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_meshwork-cni");

struct Run {
    status: std::process::ExitStatus,
    stdout: Value,
}

/// Runs the plugin with exactly `env` and `stdin`.
fn plugin(env: &[(&str, &str)], stdin: &str) -> Run {
    let mut child = Command::new(BIN)
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let stdout = serde_json::from_str(&text)
        .unwrap_or_else(|err| panic!("stdout is not JSON ({err}): {text:?}"));
    Run {
        status: out.status,
        stdout,
    }
}

/// Asserts a CNI error with `code` and returns its message.
fn expect_error(run: &Run, code: u64) -> String {
    assert!(
        !run.status.success(),
        "exit {:?}: {}",
        run.status,
        run.stdout
    );
    assert_eq!(run.stdout["code"], code, "{}", run.stdout);
    assert!(run.stdout["cniVersion"].is_string(), "{}", run.stdout);
    let msg = run.stdout["msg"].as_str().unwrap_or_default().to_owned();
    assert!(!msg.is_empty(), "{}", run.stdout);
    msg
}

/// ADD's environment for a container `c1` in the namespace `netns`.
fn add_env(netns: &str) -> Vec<(&'static str, String)> {
    vec![
        ("CNI_COMMAND", "ADD".to_owned()),
        ("CNI_CONTAINERID", "c1".to_owned()),
        ("CNI_NETNS", netns.to_owned()),
        ("CNI_IFNAME", "eth0".to_owned()),
        ("CNI_PATH", "/opt/cni/bin".to_owned()),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0".to_owned(),
        ),
    ]
}

fn run_with(env: &[(&'static str, String)], stdin: &str) -> Run {
    let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    plugin(&pairs, stdin)
}

fn config(socket: &str, extra: &str) -> String {
    format!(
        r#"{{"cniVersion":"1.0.0","name":"mesh","type":"meshwork-cni","agent-socket":"{socket}"{extra}}}"#
    )
}

#[test]
fn version_lists_the_supported_versions_in_the_asked_version() {
    let run = plugin(&[("CNI_COMMAND", "VERSION")], r#"{"cniVersion":"0.4.0"}"#);
    assert!(run.status.success());
    assert_eq!(
        run.stdout,
        serde_json::json!({
            "cniVersion": "0.4.0",
            "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0"]
        })
    );
    let run = plugin(&[("CNI_COMMAND", "VERSION")], "");
    assert!(run.status.success());
    assert_eq!(run.stdout["cniVersion"], "1.0.0");
    let run = plugin(&[("CNI_COMMAND", "VERSION")], r#"{"cniVersion":"1.1.0"}"#);
    expect_error(&run, 1);
}

#[test]
fn a_missing_or_unknown_command_is_an_invalid_environment() {
    let msg = expect_error(&plugin(&[], ""), 4);
    assert!(msg.contains("CNI_COMMAND"), "{msg}");
    expect_error(&plugin(&[("CNI_COMMAND", "FROB")], "{}"), 4);
    // CNI 1.1's commands are not spoken.
    for command in ["STATUS", "GC"] {
        let msg = expect_error(&plugin(&[("CNI_COMMAND", command)], &config("/x", "")), 4);
        assert!(msg.contains("1.1"), "{msg}");
    }
}

#[test]
fn config_failures_have_the_specs_codes() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let socket = socket.to_str().unwrap();
    let env = add_env("/proc/self/ns/net");

    expect_error(&run_with(&env, "{not json"), 6);
    let msg = expect_error(
        &run_with(
            &env,
            r#"{"cniVersion":"0.2.0","name":"mesh","type":"meshwork-cni"}"#,
        ),
        1,
    );
    assert!(msg.contains("0.2.0") && msg.contains("1.0.0"), "{msg}");
    expect_error(
        &run_with(
            &env,
            r#"{"cniVersion":"1.1.0","name":"mesh","type":"meshwork-cni"}"#,
        ),
        1,
    );
    expect_error(&run_with(&env, r#"{"cniVersion":"1.0.0","type":"x"}"#), 7);
    expect_error(&run_with(&env, &config(socket, r#","labels":["web"]"#)), 7);
    expect_error(&run_with(&env, &config(socket, r#","mtu":10"#)), 7);
    let msg = expect_error(
        &run_with(&env, &config(socket, r#","ipam":{"type":"host-local"}"#)),
        2,
    );
    assert!(msg.contains("host-local"), "{msg}");

    // No identity and nothing to allocate one from.
    let mut anonymous = env.clone();
    anonymous.retain(|(k, _)| *k != "CNI_ARGS");
    expect_error(&run_with(&anonymous, &config(socket, "")), 7);

    // An error reply carries the config's version.
    let run = run_with(
        &env,
        r#"{"cniVersion":"0.3.1","name":"mesh","type":"meshwork-cni","labels":["x"]}"#,
    );
    expect_error(&run, 7);
    assert_eq!(run.stdout["cniVersion"], "0.3.1");
}

#[test]
fn environment_failures_are_code_4_and_a_missing_netns_code_3() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let conf = config(socket.to_str().unwrap(), "");

    let mut env = add_env("/proc/self/ns/net");
    env.retain(|(k, _)| *k != "CNI_CONTAINERID");
    expect_error(&run_with(&env, &conf), 4);

    let mut env = add_env("/proc/self/ns/net");
    env.retain(|(k, _)| *k != "CNI_NETNS");
    let msg = expect_error(&run_with(&env, &conf), 4);
    assert!(msg.contains("CNI_NETNS"), "{msg}");

    let mut env = add_env("/proc/self/ns/net");
    env.push(("CNI_IFNAME", "much-too-long-ifname".to_owned()));
    expect_error(&run_with(&env, &conf), 4);

    let mut env = add_env("/proc/self/ns/net");
    env.push(("CNI_ARGS", "K8S_POD_NAME=web-0;SURPRISE=1".to_owned()));
    let msg = expect_error(&run_with(&env, &conf), 4);
    assert!(msg.contains("SURPRISE"), "{msg}");

    // The container's namespace is gone: code 3, nothing to clean up.
    let missing = dir.path().join("no-such-netns");
    let msg = expect_error(&run_with(&add_env(missing.to_str().unwrap()), &conf), 3);
    assert!(msg.contains("no-such-netns"), "{msg}");

    // A path that is no namespace.
    let file = dir.path().join("plain-file");
    std::fs::write(&file, "").unwrap();
    expect_error(&run_with(&add_env(file.to_str().unwrap()), &conf), 4);
}

#[test]
fn an_absent_agent_is_try_again_later_for_add_del_and_check() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let socket = socket.to_str().unwrap();

    // The plugin's own namespace as CNI_NETNS: the agent is asked first, so nothing is
    // compared or changed in it.
    let env = add_env("/proc/self/ns/net");
    let msg = expect_error(&run_with(&env, &config(socket, "")), 11);
    assert!(msg.contains(socket), "{msg}");

    let mut del = env.clone();
    del.push(("CNI_COMMAND", "DEL".to_owned()));
    del.retain(|(k, _)| *k != "CNI_NETNS");
    expect_error(&run_with(&del, &config(socket, "")), 11);

    let mut check = env.clone();
    check.push(("CNI_COMMAND", "CHECK".to_owned()));
    let prev = r#","prevResult":{"cniVersion":"1.0.0","ips":[{"address":"10.214.1.5/32","gateway":"10.214.1.1","interface":1}]}"#;
    expect_error(&run_with(&check, &config(socket, prev)), 11);
    // CHECK before 0.4.0 does not exist; CHECK without prevResult is an invalid config.
    let old = r#"{"cniVersion":"0.3.1","name":"mesh","type":"meshwork-cni"}"#;
    expect_error(&run_with(&check, old), 1);
    expect_error(&run_with(&check, &config(socket, "")), 7);
}
