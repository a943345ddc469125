//! meshctl end to end against a fake agent serving the API on a unix socket.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use meshwork_proto::StandardServices;
use meshwork_proto::agent::v1::agent_server::{self, Agent, AgentServer};
use meshwork_proto::agent::v1::{
    ClusterMeshStatus, ConfigStatus, EntryCounts, RemoteClusterStatus, StatusRequest,
    StatusResponse, SyncStatus, WaitSyncedRequest, WaitSyncedResponse,
};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// Two remote clusters: `cluster-a` always ready, `cluster-b` ready from the
/// `ready_from`-th Status call on (counting from 1).
struct FakeAgent {
    calls: Arc<AtomicU32>,
    ready_from: u32,
}

fn cluster(name: &str, id: u32, ready: bool) -> RemoteClusterStatus {
    RemoteClusterStatus {
        name: name.into(),
        ready,
        connected: true,
        cluster_id: id,
        config: Some(ConfigStatus {
            required: true,
            retrieved: true,
        }),
        synced: Some(SyncStatus {
            nodes: true,
            services: ready,
            identities: ready,
            endpoints: ready,
        }),
        entries: Some(EntryCounts {
            nodes: 2,
            services: 1,
            identities: 3,
            endpoints: 4,
        }),
        failures: u64::from(!ready),
        last_failure: (!ready).then(|| "2026-11-29T10:00:00Z".into()),
        last_error: (!ready).then(|| "etcd: connection refused".into()),
        endpoints: "http://127.0.0.1:2379".into(),
        heartbeat_age_ms: Some(12_000),
        cached: false,
    }
}

#[tonic::async_trait]
impl Agent for FakeAgent {
    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let b_ready = call >= self.ready_from;
        Ok(Response::new(StatusResponse {
            datapath: None,
            apiserver: None,
            clustermesh: Some(ClusterMeshStatus {
                ready: 1 + u32::from(b_ready),
                total: 2,
                config_dir: String::new(),
                clusters: vec![
                    cluster("cluster-a", 2, true),
                    cluster("cluster-b", 3, b_ready),
                ],
            }),
        }))
    }

    async fn timeline(
        &self,
        _: Request<meshwork_proto::agent::v1::TimelineRequest>,
    ) -> Result<Response<meshwork_proto::agent::v1::TimelineResponse>, Status> {
        Err(Status::unimplemented("not part of this test"))
    }

    async fn wait_synced(
        &self,
        _: Request<WaitSyncedRequest>,
    ) -> Result<Response<WaitSyncedResponse>, Status> {
        Err(Status::unimplemented("meshctl does not call it"))
    }
}

/// A fake agent on a socket in its own temp dir; the server stops with the test's runtime.
struct Served {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    calls: Arc<AtomicU32>,
}

fn serve(ready_from: u32) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    // Bound before meshctl runs, so it can't race the server.
    let listener = UnixListener::bind(&socket).unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let agent = FakeAgent {
        calls: Arc::clone(&calls),
        ready_from,
    };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AgentServer::new(agent))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    Served {
        _dir: dir,
        socket,
        calls,
    }
}

/// Runs meshctl off the runtime's threads (it blocks), with stderr a pipe: progress in lines.
async fn meshctl(socket: &Path, args: &[&str]) -> Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_meshctl"));
    cmd.env_remove("MESHWORK_SOCKET")
        .arg("--socket")
        .arg(socket)
        .args(args);
    tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_is_one_line_of_the_documented_shape() {
    let agent = serve(u32::MAX);
    let out = meshctl(&agent.socket, &["status", "--json"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert_eq!(stdout.lines().count(), 1);
    assert!(stdout.ends_with('\n'));
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let mesh = &json["clustermesh"];
    assert_eq!(
        (mesh["ready"].as_u64(), mesh["total"].as_u64()),
        (Some(1), Some(2))
    );
    assert_eq!(mesh["clusters"][0]["last_error"], serde_json::Value::Null);
    assert_eq!(
        mesh["clusters"][1]["last_error"],
        "etcd: connection refused"
    );
    assert_eq!(mesh["clusters"][1]["cluster_id"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_shows_progress_then_the_ready_status() {
    let agent = serve(3);
    let out = meshctl(&agent.socket, &["status", "--wait", "--timeout", "60s"]).await;
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(agent.calls.load(Ordering::SeqCst) >= 3);
    assert!(
        text(&out.stdout).starts_with("ClusterMesh:   2/2 remote clusters ready\n"),
        "{}",
        text(&out.stdout)
    );
    // Not a terminal: one line per change, the header and cluster-b each changing once.
    assert!(
        stderr.contains("] ClusterMesh: 1/2 remote clusters ready\n"),
        "{stderr}"
    );
    assert!(
        stderr.contains("] ClusterMesh: 2/2 remote clusters ready\n"),
        "{stderr}"
    );
    assert_eq!(stderr.matches("cluster-a").count(), 1, "{stderr}");
    assert_eq!(stderr.matches("cluster-b").count(), 2, "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_timeout_names_the_clusters_not_ready() {
    let agent = serve(u32::MAX);
    let out = meshctl(
        &agent.socket,
        &["status", "--json", "--wait", "--timeout", "1s"],
    )
    .await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("timed out after 1s waiting for the cluster mesh: 1/2 remote clusters ready; not ready:\n   cluster-b: etcd: connection refused"),
        "{stderr}"
    );
    // The last status still goes to stdout, as JSON.
    let json: serde_json::Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(json["clustermesh"]["ready"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_agent_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("absent.sock");
    let out = meshctl(&socket, &["status"]).await;
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(
        text(&out.stderr),
        format!(
            "meshctl: cannot reach the agent at {}: no such socket — is meshwork-agent running? \
             (--socket / MESHWORK_SOCKET)\n",
            socket.display()
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_service_is_named_in_the_error() {
    // The fake agent serves only `Agent`: the encrypt call is unimplemented.
    let served = serve(0);
    let out = meshctl(&served.socket, &["encrypt", "status"]).await;
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(
        text(&out.stderr),
        format!(
            "meshctl: the agent at {} does not serve meshwork.agent.v1.Encrypt/Status — a \
             different version?\n",
            served.socket.display()
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_closes_early_is_not_an_error() {
    let served = serve(0);
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_meshctl"));
    cmd.env_remove("MESHWORK_SOCKET")
        .arg("--socket")
        .arg(&served.socket)
        .args(["status", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = tokio::task::spawn_blocking(move || {
        let mut child = cmd.spawn().unwrap();
        // Like `meshctl status | head -0`: the reader is gone before meshctl writes.
        drop(child.stdout.take());
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    assert_eq!(text(&out.stderr), "");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        served.calls.load(Ordering::SeqCst),
        1,
        "meshctl asked the agent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_a_probe_that_exits_0_only_when_serving() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let (standard, readiness) = StandardServices::new(&[agent_server::SERVICE_NAME]).await;
    let agent = FakeAgent {
        calls: Arc::new(AtomicU32::new(0)),
        ready_from: 1,
    };
    let router = tonic::transport::Server::builder().add_service(AgentServer::new(agent));
    tokio::spawn(
        standard
            .add_to(router)
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );

    let out = meshctl(&socket, &["health"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "NOT_SERVING\n");
    readiness.ready().await;
    let out = meshctl(&socket, &["health"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "SERVING\n");
    let out = meshctl(
        &socket,
        &["health", "--service", agent_server::SERVICE_NAME],
    )
    .await;
    assert_eq!(text(&out.stdout), "SERVING\n");

    let out = meshctl(
        &socket,
        &["health", "--service", "meshwork.agent.v1.Datapath"],
    )
    .await;
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out.stderr).contains("serves no service \"meshwork.agent.v1.Datapath\""),
        "{}",
        text(&out.stderr)
    );
    let out = meshctl(&socket, &["health", "--grpc-addr", "127.0.0.1:1"]).await;
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out.stderr).contains("cannot reach the gRPC server at 127.0.0.1:1"),
        "{}",
        text(&out.stderr)
    );
}
