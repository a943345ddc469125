//! The no-drop proof as a test, on both scenes: Meshwork meshed with itself (state written by
//! each cluster's apiserver) and hand-written Cilium-format fixtures. Real agents, apiservers,
//! etcd and BPF programs in lab network namespaces (see `meshwork-scenarios proof`). With the
//! bounded wait nothing drops and the stream has no gap (and, on the mesh, no new connection to
//! the global service fails and the stream through WireGuard alone has no gap); the negative
//! control (0s) must drop, stall the stream, fail connections and stall the WireGuard stream,
//! proving the checks can fail.

use std::process::Command;

fn figures(line: &str) -> Vec<(String, String)> {
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[test]
#[ignore = "needs real etcd, root, bpffs and network namespaces: `cargo xtask test` runs it"]
fn on_meshwork_meshed_with_itself_a_restart_drops_nothing_and_the_negative_control_drops() {
    proof(&[]);
}

#[test]
#[ignore = "needs real etcd, root, bpffs and network namespaces: `cargo xtask test` runs it"]
fn on_cilium_fixtures_a_restart_drops_nothing_and_the_negative_control_drops() {
    proof(&["--fixtures"]);
}

fn proof(flags: &[&str]) {
    let output = Command::new(env!("CARGO_BIN_EXE_meshwork-scenarios"))
        // The workspace test build put the binaries it runs next to it; building them again
        // with the plain build's features would take longer than the test may.
        .args(["proof", "--no-build"])
        .args(flags)
        .output()
        .expect("running meshwork-scenarios proof");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "proof failed:\n{stdout}\n{stderr}");
    let last = stdout.lines().last().unwrap_or_default();
    let figures = figures(last);
    let get = |name: &str| -> u64 {
        figures
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {last:?}\n{stdout}"))
    };
    assert_eq!(get("drops_with_wait"), 0, "{stdout}");
    assert_eq!(get("stream_gaps_with_wait"), 0, "{stdout}");
    assert!(
        get("drops_without_wait") > 0,
        "the negative control must drop:\n{stdout}"
    );
    // On the mesh, new connections to a global service through socket-LB: none fails with
    // the wait, some do when the restored service entries are pruned while B is late.
    if flags.is_empty() {
        assert_eq!(get("connect_failures_with_wait"), 0, "{stdout}");
        assert!(
            get("connect_failures_without_wait") > 0,
            "the negative control's connections must fail:\n{stdout}"
        );
        // Every cross-cluster packet goes through WireGuard: A keeps B's restored peers until
        // B's nodes are known, so the stream that only WireGuard can break never stalls; the
        // negative control prunes them while B is late.
        assert_eq!(get("wg_stream_gaps_with_wait"), 0, "{stdout}");
        assert!(
            get("wg_stream_gaps_without_wait") > 0,
            "the negative control's WireGuard stream must stall:\n{stdout}"
        );
    } else {
        assert!(
            last.ends_with("wg_stream_gaps_with_wait=- wg_stream_gaps_without_wait=-"),
            "{last}"
        );
    }
    // The sampled order: with the wait the endpoint waited and never ran on a map without B.
    let with = stdout
        .lines()
        .find(|l| l.starts_with("with wait"))
        .expect("a with-wait line");
    assert!(with.contains("regenerated-without-B=0"), "{with}");
    assert!(with.contains("bad entries written=0"), "{with}");
    assert!(
        !with.contains("waiting=0 "),
        "the restored endpoint must have waited: {with}"
    );
    let without = stdout
        .lines()
        .find(|l| l.starts_with("without wait"))
        .expect("a without-wait line");
    assert!(!without.contains("regenerated-without-B=0"), "{without}");
    assert!(
        !without.contains(" gaps=0 "),
        "the negative control's stream must stall: {without}"
    );
}
