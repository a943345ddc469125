//! The agent process's start and stop, with the real binary: every listener is bound before it
//! says it runs, a listener it cannot bind fails the start at once naming the address and the
//! OS error, and SIGTERM ends it cleanly in under two seconds without draining anything.

use std::net::TcpListener;
use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

mod common;

use meshwork_datapath::maps::PinDir;
use meshwork_lab::agent::{AgentOptions, AgentProcess, write_cluster_config};
use meshwork_lab::bpffs::BpfRoot;
use meshwork_lab::cilium::Cluster;
use meshwork_lab::etcd::EtcdServer;
use meshwork_lab::process::LabProcess;
use meshwork_lab::wait::{Wait, eventually};

fn agent_binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_meshwork-agent"))
}

/// Runs the agent as `options` say and waits (at most `within`) for it to exit.
fn exit_of(options: &AgentOptions, within: Duration) -> (ExitStatus, Duration, String) {
    let log = options.state_dir.join("agent.log");
    std::fs::create_dir_all(&options.state_dir).unwrap();
    let started = Instant::now();
    let mut process = LabProcess::spawn("meshwork-agent", options.command(), &log).unwrap();
    let status = Wait::new("the agent to exit")
        .timeout(within)
        .some(|| process.exit_status())
        .unwrap_or_else(|err| panic!("{err}; log:\n{}", process.log_tail()));
    (
        status,
        started.elapsed(),
        std::fs::read_to_string(&log).unwrap(),
    )
}

#[test]
#[ignore = "needs real etcd, root and bpffs: `cargo xtask test` runs it"]
fn a_listener_it_cannot_bind_fails_the_start_within_5s_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let options =
        AgentOptions::new(agent_binary(), "local", 9, &dir.path().join("a")).metrics_port(port);
    let (status, took, log) = exit_of(&options, Duration::from_secs(5));
    assert!(!status.success(), "{status}: {log}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(
        log.contains(&format!("binding the metrics endpoint 127.0.0.1:{port}: "))
            && log.contains("Address already in use"),
        "{log}"
    );
    assert!(!log.contains("meshwork-agent running"), "{log}");

    // A socket path under a regular file.
    let file = dir.path().join("file");
    std::fs::write(&file, "").unwrap();
    let socket = file.join("agent.sock");
    let options = AgentOptions::new(agent_binary(), "local", 9, &dir.path().join("b"))
        .flags(["--api-socket".into(), socket.clone().into_os_string()]);
    let (status, took, log) = exit_of(&options, Duration::from_secs(5));
    assert!(!status.success(), "{status}: {log}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(
        log.contains(&format!("binding the API socket {}: ", socket.display()))
            && log.contains("(os error"),
        "{log}"
    );
}

fn loaded_remote() -> (EtcdServer, Cluster) {
    let server = EtcdServer::start().unwrap();
    let cluster = common::small_c2();
    common::load_blocking(&server, &cluster);
    (server, cluster)
}

/// Entries of the pinned ipcache, as its file holds them (readable with no agent running).
fn pinned_entries(pins: &PinDir) -> usize {
    pins.open_ipcache()
        .and_then(|map| map.entries())
        .map_or(0, |entries| entries.len())
}

#[test]
#[ignore = "needs real etcd, root and bpffs: `cargo xtask test` runs it"]
fn sigterm_stops_everything_and_exits_0_within_2s_draining_nothing() {
    let (remote, cluster) = loaded_remote();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("clustermesh");
    write_cluster_config(&config, &cluster.name, &remote.endpoint()).unwrap();
    let bpf = BpfRoot::new().unwrap();
    let metrics = meshwork_lab::wait::free_port().unwrap();
    let options = AgentOptions::new(agent_binary(), "c1", 1, &dir.path().join("state"))
        .clustermesh_config(&config)
        .bpf_root(bpf.path())
        .metrics_port(metrics)
        .env("RUST_LOG", "info");
    let mut agent = AgentProcess::start(&options).unwrap();
    // The agent says it runs only once every listener is bound.
    let log = eventually(
        "the agent to say it runs",
        || std::fs::read_to_string(agent.log()).unwrap_or_default(),
        |log| log.contains("meshwork-agent running"),
    );
    assert!(meshwork_lab::wait::port_open(metrics), "{log}");
    assert!(std::os::unix::net::UnixStream::connect(agent.socket()).is_ok());

    let pins = PinDir::under(bpf.path());
    eventually(
        "the remote's entries in the ipcache",
        || pinned_entries(&pins),
        |n| *n == 10,
    );
    agent
        .process()
        .signal(nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    let stopping = Instant::now();
    let status = Wait::new("the agent to exit after SIGTERM")
        .timeout(Duration::from_secs(2))
        .some(|| agent.process().exit_status())
        .unwrap_or_else(|err| panic!("{err}; log:\n{}", agent.log_tail()));
    assert!(status.success(), "{status}; log:\n{}", agent.log_tail());
    assert!(stopping.elapsed() < Duration::from_secs(2));
    let log = std::fs::read_to_string(agent.log()).unwrap();
    assert!(log.contains("meshwork-agent stopped"), "{log}");
    assert!(!log.contains("draining"), "{log}");
    assert!(!agent.socket().exists(), "the agent removes its socket");
    assert_eq!(
        pinned_entries(&pins),
        10,
        "the datapath keeps the remote's entries across the stop"
    );
}
