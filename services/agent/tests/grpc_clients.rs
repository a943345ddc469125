//! The agent's socket for any gRPC client, with the real binary: its standard health says
//! NOT_SERVING until the start-up sync wait returns, SERVING after, and NOT_SERVING once
//! SIGTERM arrives; and a Python client (grpcio, stubs generated from `proto/`) checks health,
//! reflection, every read RPC and the errors of malformed requests.

mod common;

use std::path::Path;
use std::time::Duration;

use futures::StreamExt as _;
use meshwork_kvstore::EtcdBackend;
use meshwork_lab::agent::{AgentOptions, AgentProcess, write_cluster_config};
use meshwork_lab::bpffs::BpfRoot;
use meshwork_lab::etcd::EtcdServer;
use meshwork_lab::python_client;
use meshwork_lab::wait::{Wait, eventually_async};
use meshwork_proto::agent::v1::agent_server;
use meshwork_proto::connect_unix;
use meshwork_proto::standard::client::{HealthStatus, health, watch_health};

fn agent_binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_meshwork-agent"))
}

/// An agent of c1 with its BPF datapath, meshed with `server`'s c2.
fn start_agent(server: &EtcdServer, dir: &Path, bpf: &BpfRoot, flags: &[&str]) -> AgentProcess {
    let config = dir.join("clustermesh");
    write_cluster_config(&config, "c2", &server.endpoint()).unwrap();
    let options = AgentOptions::new(agent_binary(), "c1", 1, &dir.join("state"))
        .clustermesh_config(&config)
        .bpf_root(bpf.path())
        .flags(flags.iter().copied())
        .env("RUST_LOG", "info");
    AgentProcess::start(&options).unwrap()
}

async fn status(socket: &Path, service: &str) -> HealthStatus {
    let channel = connect_unix(socket).await.expect("the agent's socket");
    health(channel, service)
        .await
        .expect("grpc.health.v1.Health/Check")
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs real etcd, root and bpffs: `cargo xtask test` runs it"]
async fn health_is_serving_only_between_the_start_up_sync_and_sigterm() {
    let server = EtcdServer::start().unwrap();
    let cluster = common::small_c2();
    let backend: EtcdBackend = common::connect(&server).await;
    // The remote announces canaries but has not written them: the agent cannot sync.
    let (key, value) = cluster.config();
    backend.put(&key, value).await.unwrap();
    backend.put_many(cluster.state(), 100).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bpf = BpfRoot::new().unwrap();
    let agent = start_agent(
        &server,
        dir.path(),
        &bpf,
        &["--clustermesh-sync-timeout", "5m"],
    );
    let socket = agent.socket().to_owned();

    for service in ["", agent_server::SERVICE_NAME, "meshwork.agent.v1.Datapath"] {
        assert_eq!(
            status(&socket, service).await,
            HealthStatus::NotServing,
            "{service:?} before the remote synced; log:\n{}",
            agent.log_tail()
        );
    }
    backend.put_many(cluster.canaries(), 100).await.unwrap();
    eventually_async(
        "the agent to serve once the remote synced",
        || status(&socket, ""),
        |s| *s == HealthStatus::Serving,
    )
    .await;
    assert_eq!(
        status(&socket, "meshwork.agent.v1.Encrypt").await,
        HealthStatus::Serving
    );

    let channel = connect_unix(&socket).await.unwrap();
    let mut watch = watch_health(channel, "").await.unwrap();
    assert_eq!(watch.next().await.unwrap().unwrap(), HealthStatus::Serving);
    let mut agent = agent;
    agent
        .process()
        .signal(nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    let next = tokio::time::timeout(Duration::from_secs(2), watch.next())
        .await
        .expect("a health change within 2 s of SIGTERM");
    assert_eq!(
        next.map(|status| status.unwrap()),
        Some(HealthStatus::NotServing),
        "the agent says NOT_SERVING before its API goes; log:\n{}",
        agent.log_tail()
    );
    let exit = Wait::new("the agent to exit after SIGTERM")
        .timeout(Duration::from_secs(5))
        .some(|| agent.process().exit_status())
        .unwrap_or_else(|err| panic!("{err}; log:\n{}", agent.log_tail()));
    assert!(exit.success(), "{exit}");
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs real etcd, root, bpffs and the venv's grpcio: `cargo xtask test` runs it"]
async fn a_python_grpc_client_reads_every_service_and_gets_invalid_argument_for_bad_requests() {
    let server = EtcdServer::start().unwrap();
    common::load(&common::connect(&server).await, &common::small_c2())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bpf = BpfRoot::new().unwrap();
    let agent = start_agent(&server, dir.path(), &bpf, &[]);
    let socket = agent.socket().to_owned();
    eventually_async(
        "the agent to serve",
        || status(&socket, ""),
        |s| *s == HealthStatus::Serving,
    )
    .await;
    let target = format!("unix:{}", agent.socket().display());
    let checks = tokio::task::spawn_blocking(move || {
        python_client::check_server(&target, &["agent", "--clusters", "1"])
    })
    .await
    .unwrap()
    .unwrap();
    println!("{}", checks.output);
    assert!(
        checks.passed,
        "{}\nagent log:\n{}",
        checks.output,
        agent.log_tail()
    );
    for check in [
        "health (server)",
        "health meshwork.agent.v1.Datapath",
        "reflection v1 lists the served services",
        "reflection v1alpha lists the served services",
        "reflection describes meshwork.agent.v1.Agent",
        "Agent.Status",
        "Datapath.ListEndpoints",
        "Datapath.PutEndpoint with an unparsable IP",
        "Agent.WaitSynced with an unspecified kind",
        "Encrypt.Status without WireGuard",
    ] {
        assert!(checks.passed_check(check), "{check}: {}", checks.output);
    }
}
