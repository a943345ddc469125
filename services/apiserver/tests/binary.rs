//! The real `meshwork-apiserver` binary against a real etcd, every event under `cilium/`
//! recorded, an agent played by a gRPC client of `meshwork.apiserver.v1.Export`:
//!
//! - an agent publishes, gets its identities and "written"; `/readyz` and gRPC health turn
//!   ready once the canaries are written;
//! - the apiserver SIGKILLed and restarted, the agent republishing: a reader sees no event
//!   but the heartbeat;
//! - an agent restarted (a new session republishing): no event either;
//! - its etcd wiped (Cilium's ephemeral mode) and the apiserver restarted: the canaries come
//!   back only once every agent that reconnected within the initial-sync timeout has
//!   republished, after all their entries;
//! - an agent gone: its entries stay for `--node-gc-grace`, then are deleted;
//!   `DeleteNode` deletes at once, and is refused while the agent is connected;
//! - `meshctl --apiserver` declares, lists and deletes a shared service whose backends are the
//!   matching endpoints, and `node delete` is refused while the agent is connected;
//! - bad input: INVALID_ARGUMENT naming the value, counted by reason, nothing written;
//! - a Python client (grpcio) checks health, reflection, a read RPC and malformed requests;
//! - SIGTERM exits 0 and deletes nothing.

mod common;

use std::process::Command;
use std::time::Duration;

use common::apiserver::{
    Agent, DEADLINE, NODE_GC_GRACE, channel, http_get, node, start, wait_readyz,
};
use common::{connect, events_since};
use meshwork_apiserver::grpc::MAX_MESSAGE_BYTES;
use meshwork_kvstore::EtcdBackend;
use meshwork_lab::etcd::EtcdServer;
use meshwork_lab::wait::Wait;
use meshwork_proto::apiserver::v1 as pb;
use meshwork_proto::apiserver::v1::export_client::ExportClient;
use meshwork_proto::standard::client::{HealthStatus, health};
use nix::sys::signal::Signal;
use pb::publish_request::Request as Publish;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

/// Runs meshctl (built beside this binary by the workspace build) against the apiserver at
/// `addr`: exit code, stdout, stderr.
fn meshctl(addr: &str, args: &[&str], more: &[&str]) -> (i32, String, String) {
    let binary =
        std::path::Path::new(env!("CARGO_BIN_EXE_meshwork-apiserver")).with_file_name("meshctl");
    assert!(
        binary.exists(),
        "{} is missing: build the workspace (cargo build --workspace)",
        binary.display()
    );
    let output = Command::new(binary)
        .env_remove("MESHWORK_APISERVER")
        .args(["--apiserver", addr])
        .args(args)
        .args(more)
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A session that sends `node` and nothing more: the apiserver's answer to it.
async fn publish_node_only(
    client: &mut ExportClient<tonic::transport::Channel>,
    node: pb::Node,
) -> Result<(), tonic::Status> {
    let (requests, rx) = mpsc::channel(1);
    requests
        .send(pb::PublishRequest {
            request: Some(Publish::Node(node)),
        })
        .await
        .unwrap();
    drop(requests);
    client.publish(ReceiverStream::new(rx)).await.map(drop)
}

async fn key_exists(backend: &EtcdBackend, key: &str) -> bool {
    backend.get(key).await.unwrap().is_some()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs real etcd and the venv's grpcio: `cargo xtask test` runs it"]
async fn publish_restart_gone_agents_bad_input_and_sigterm() {
    let etcd = EtcdServer::start().unwrap();
    let backend = connect(&etcd).await;
    let dir = tempfile::tempdir().unwrap();
    let mut apiserver = start(&etcd.endpoint(), dir.path(), None);

    let (status, body) = http_get(apiserver.health, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        health(channel(apiserver.grpc).await, "").await.unwrap(),
        HealthStatus::NotServing
    );
    let n1 = Agent::publish(apiserver.grpc, "n1", 1, 3).await.unwrap();
    let ready = wait_readyz(apiserver.health, DEADLINE).await;
    assert!(
        ready.is_ok(),
        "{ready:?}; log:\n{}",
        apiserver.process.log_tail()
    );
    assert_eq!(
        health(channel(apiserver.grpc).await, "").await.unwrap(),
        HealthStatus::Serving
    );
    assert!(key_exists(&backend, "cilium/state/ip/v1/default/10.1.1.3").await);
    assert!(key_exists(&backend, "cilium/synced/c1/cilium/state/ip/v1").await);

    // SIGKILL, restart on the same ports, the agent republishes: nothing changes.
    drop(n1);
    apiserver.kill();
    let before = backend.revision("cilium/").await.unwrap();
    let mut apiserver = start(&etcd.endpoint(), dir.path(), Some(apiserver.ports()));
    let (status, _) = http_get(apiserver.health, "/readyz").await;
    assert_eq!(status, 200, "the canaries are there: ready at once");
    let n1 = Agent::publish(apiserver.grpc, "n1", 1, 3).await.unwrap();
    let events = events_since(&backend, before + 1).await;
    let changed: Vec<_> = events
        .iter()
        .filter(|(k, _)| k != "cilium/.heartbeat")
        .collect();
    assert!(changed.is_empty(), "a reader saw {changed:?}");

    // The agent restarts (its session ends, a new one republishes): nothing changes.
    drop(n1);
    let before = backend.revision("cilium/").await.unwrap();
    let n1 = Agent::publish(apiserver.grpc, "n1", 1, 3).await.unwrap();
    let events = events_since(&backend, before + 1).await;
    let changed: Vec<_> = events
        .iter()
        .filter(|(k, _)| k != "cilium/.heartbeat")
        .collect();
    assert!(
        changed.is_empty(),
        "an agent restart showed a reader {changed:?}"
    );

    // DeleteNode is refused while the agent is connected.
    let mut client = ExportClient::new(channel(apiserver.grpc).await);
    let delete = |name: &str| pb::DeleteNodeRequest {
        name: name.to_owned(),
    };
    let refused = client.delete_node(delete("n1")).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");

    // meshctl declares, lists and deletes a global service; n1's app1 pods are its backends.
    let addr = format!("127.0.0.1:{}", apiserver.grpc);
    let out = meshctl(
        &addr,
        &["service", "put", "default/web", "--frontend", "10.96.0.10"],
        &[
            "--port",
            "http:80",
            "--selector",
            "k8s:app=app1",
            "--shared",
        ],
    );
    assert_eq!(out.0, 0, "{out:?}");
    assert_eq!(out.1, "service default/web declared (shared), 2 backends\n");
    let (value, _) = backend
        .get("cilium/state/services/v1/c1/default/web")
        .await
        .unwrap()
        .expect("the shared service's key");
    let value: serde_json::Value = serde_json::from_slice(&value).unwrap();
    assert_eq!(value["backends"]["10.1.1.3"]["http"]["Port"], 80, "{value}");
    let out = meshctl(&addr, &["service", "list", "--json"], &[]);
    let listed: serde_json::Value = serde_json::from_str(&out.1).unwrap();
    assert_eq!(
        listed["services"][0]["backends"],
        serde_json::json!(["10.1.1.1", "10.1.1.3"])
    );
    let out = meshctl(
        &addr,
        &["service", "put", "default/web", "--frontend", "nope"],
        &["--port", "http:80", "--selector", "k8s:app=app1"],
    );
    assert_eq!(out.0, 3, "{out:?}");
    assert!(
        out.2.contains("frontend \"nope\" is not an IP address"),
        "{out:?}"
    );
    let out = meshctl(&addr, &["service", "delete", "default/web"], &[]);
    assert_eq!(out.1, "service default/web deleted\n", "{out:?}");
    assert!(!key_exists(&backend, "cilium/state/services/v1/c1/default/web").await);
    let out = meshctl(&addr, &["node", "delete", "n1"], &[]);
    assert_eq!(out.0, 3, "{out:?}");
    assert!(out.2.contains("FailedPrecondition"), "{out:?}");

    // n1 goes: its entries stay for the grace, then go.
    drop(n1);
    let gone_at = tokio::time::Instant::now();
    let deleted = Wait::new("n1's ipcache entry deleted after the grace")
        .timeout(DEADLINE)
        .every(Duration::from_millis(100))
        .until_async(
            || key_exists(&backend, "cilium/state/ip/v1/default/10.1.1.1"),
            |e| !e,
        )
        .await;
    assert!(deleted.is_ok(), "{deleted:?}");
    assert!(gone_at.elapsed() >= NODE_GC_GRACE - Duration::from_millis(500));
    assert!(!key_exists(&backend, "cilium/state/nodes/v1/c1/n1").await);

    // n2 goes and is deleted at once.
    let n2 = Agent::publish(apiserver.grpc, "n2", 2, 1).await.unwrap();
    drop(n2);
    let existed = Wait::new("DeleteNode n2 after its session closed")
        .timeout(DEADLINE)
        .every(Duration::from_millis(50))
        .until_async(
            || {
                let mut client = client.clone();
                async move {
                    client
                        .delete_node(delete("n2"))
                        .await
                        .map(|r| r.into_inner().existed)
                        .ok()
                }
            },
            Option::is_some,
        )
        .await
        .unwrap();
    assert_eq!(existed, Some(true));
    assert!(!key_exists(&backend, "cilium/state/ip/v1/default/10.1.2.1").await);

    // Bad input: refused, named, counted, nothing written.
    let before = backend.revision("cilium/").await.unwrap();
    let Err(err) = Agent::publish(apiserver.grpc, "N_3", 3, 0).await else {
        panic!("node N_3 was accepted");
    };
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("node name \"N_3\""), "{err:?}");
    let mut bad_cidr = node("n4", 4);
    bad_cidr.ipv4_alloc_cidrs = vec!["10.1.4.0/33".to_owned()];
    let Err(err) = publish_node_only(&mut client, bad_cidr).await else {
        panic!("a node with CIDR 10.1.4.0/33 was accepted");
    };
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("\"10.1.4.0/33\" is not a CIDR"),
        "{err:?}"
    );
    // An oversized message: refused before it is decoded, and counted.
    let mut huge = node("n5", 5);
    huge.labels = [("big".to_owned(), "x".repeat(MAX_MESSAGE_BYTES))].into();
    let Err(err) = publish_node_only(&mut client, huge).await else {
        panic!("a 4 MiB node was accepted");
    };
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    assert!(err.message().contains("too large"), "{err:?}");
    let (_, metrics) = http_get(apiserver.metrics, "/metrics").await;
    assert!(
        metrics
            .contains("meshwork_apiserver_refused_requests_total{reason=\"invalid_node_name\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("meshwork_apiserver_refused_requests_total{reason=\"oversized\"} 1"),
        "{metrics}"
    );
    let port = apiserver.metrics;
    let body = tokio::task::spawn_blocking(move || meshwork_lab::prometheus::scrape(port))
        .await
        .unwrap()
        .expect("the apiserver serves /metrics");
    meshwork_lab::prometheus::assert_promtool_clean(&body);
    let events = events_since(&backend, before + 1).await;
    let written: Vec<_> = events
        .iter()
        .filter(|(k, _)| k != "cilium/.heartbeat")
        .collect();
    assert!(written.is_empty(), "refused input wrote {written:?}");

    // A client no Meshwork code wrote.
    let target = format!("127.0.0.1:{}", apiserver.grpc);
    let checks = tokio::task::spawn_blocking(move || {
        meshwork_lab::python_client::check_server(&target, &["apiserver"])
    })
    .await
    .unwrap()
    .unwrap();
    assert!(checks.passed, "{}", checks.output);
    for check in [
        "health meshwork.apiserver.v1.Export",
        "reflection v1 lists the served services",
        "Export.PutService with an unparsable frontend",
    ] {
        assert!(checks.passed_check(check), "{check}: {}", checks.output);
    }

    // SIGTERM: exit 0, nothing deleted.
    apiserver.process.signal(Signal::SIGTERM).unwrap();
    let status = Wait::new("the apiserver to exit after SIGTERM")
        .timeout(Duration::from_secs(15))
        .some(|| apiserver.process.exit_status())
        .unwrap();
    assert!(
        status.success(),
        "{status}; log:\n{}",
        apiserver.process.log_tail()
    );
    assert!(key_exists(&backend, "cilium/synced/c1/cilium/state/ip/v1").await);
    assert!(key_exists(&backend, "cilium/cluster-config/c1").await);
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn after_a_restart_what_no_agent_claims_goes_an_absent_node_after_the_grace() {
    let etcd = EtcdServer::start().unwrap();
    let backend = connect(&etcd).await;
    let dir = tempfile::tempdir().unwrap();
    let mut apiserver = start(&etcd.endpoint(), dir.path(), None);
    let agents = [
        Agent::publish(apiserver.grpc, "n1", 1, 3).await.unwrap(),
        Agent::publish(apiserver.grpc, "n2", 2, 2).await.unwrap(),
        Agent::publish(apiserver.grpc, "n3", 3, 1).await.unwrap(),
    ];
    wait_readyz(apiserver.health, DEADLINE).await.unwrap();
    drop(agents);
    apiserver.kill();

    // Restarted: n1 comes back without its third endpoint (deleted while the apiserver was
    // away), n2 never comes back, n3 is deleted by hand.
    let apiserver = start(&etcd.endpoint(), dir.path(), Some(apiserver.ports()));
    let restarted = tokio::time::Instant::now();
    let out = meshctl(
        &format!("127.0.0.1:{}", apiserver.grpc),
        &["node", "delete", "n3"],
        &[],
    );
    assert_eq!(
        out,
        (
            0,
            "node n3 deleted, with its entries\n".to_owned(),
            String::new()
        )
    );
    assert!(!key_exists(&backend, "cilium/state/nodes/v1/c1/n3").await);
    assert!(!key_exists(&backend, "cilium/state/ip/v1/default/10.1.3.1").await);
    let _n1 = Agent::publish(apiserver.grpc, "n1", 1, 2).await.unwrap();
    assert!(
        !key_exists(&backend, "cilium/state/ip/v1/default/10.1.1.3").await,
        "n1's republished state is complete: what it no longer has is gone"
    );
    assert!(key_exists(&backend, "cilium/state/ip/v1/default/10.1.1.2").await);
    assert!(
        key_exists(&backend, "cilium/state/ip/v1/default/10.1.2.1").await,
        "n2 is waited for"
    );
    let gone = Wait::new("n2's entries deleted after the grace")
        .timeout(DEADLINE)
        .every(Duration::from_millis(100))
        .until_async(
            || key_exists(&backend, "cilium/state/nodes/v1/c1/n2"),
            |exists| !exists,
        )
        .await;
    assert!(
        gone.is_ok(),
        "{gone:?}; log:\n{}",
        apiserver.process.log_tail()
    );
    assert!(restarted.elapsed() >= NODE_GC_GRACE - Duration::from_millis(500));
    for ip in ["10.1.2.1", "10.1.2.2"] {
        let key = format!("cilium/state/ip/v1/default/{ip}");
        assert!(!key_exists(&backend, &key).await, "{key}");
    }
    assert!(key_exists(&backend, "cilium/state/ip/v1/default/10.1.1.1").await);
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn declared_services_survive_a_restart_and_their_key_waits_for_every_node() {
    let etcd = EtcdServer::start().unwrap();
    let backend = connect(&etcd).await;
    let dir = tempfile::tempdir().unwrap();
    let mut apiserver = start(&etcd.endpoint(), dir.path(), None);
    let agents = [
        Agent::publish(apiserver.grpc, "n1", 1, 3).await.unwrap(),
        Agent::publish(apiserver.grpc, "n2", 2, 3).await.unwrap(),
    ];
    wait_readyz(apiserver.health, DEADLINE).await.unwrap();
    let addr = format!("127.0.0.1:{}", apiserver.grpc);
    let out = meshctl(
        &addr,
        &["service", "put", "default/web", "--frontend", "10.96.0.10"],
        &[
            "--port",
            "http:80",
            "--selector",
            "k8s:app=app1",
            "--shared",
        ],
    );
    assert_eq!(
        out.1, "service default/web declared (shared), 4 backends\n",
        "{out:?}"
    );
    let service_key = "cilium/state/services/v1/c1/default/web";
    let (before_value, _) = backend.get(service_key).await.unwrap().unwrap();
    // Every session gets the cluster's services, shared or not, with their backends.
    let out = meshctl(
        &addr,
        &[
            "service",
            "put",
            "default/local",
            "--frontend",
            "10.96.0.11",
        ],
        &["--port", "http:80", "--selector", "k8s:app=app0"],
    );
    assert_eq!(
        out.1,
        "service default/local declared (not shared: this cluster's agents only), 2 backends\n",
        "{out:?}"
    );
    let mut agents = agents;
    let set = loop {
        let set = agents[1].next_local_services().await;
        if set.services.len() == 2 {
            break set;
        }
    };
    let summary: Vec<(String, bool, Vec<String>)> = set
        .services
        .iter()
        .map(|s| {
            let spec = s.service.as_ref().unwrap();
            (spec.name.clone(), spec.shared, s.backends.clone())
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                "local".to_owned(),
                false,
                vec!["10.1.1.2".to_owned(), "10.1.2.2".to_owned()]
            ),
            (
                "web".to_owned(),
                true,
                ["10.1.1.1", "10.1.1.3", "10.1.2.1", "10.1.2.3"]
                    .map(str::to_owned)
                    .to_vec()
            ),
        ]
    );
    let out = meshctl(&addr, &["service", "delete", "default/local"], &[]);
    assert_eq!(out.1, "service default/local deleted\n", "{out:?}");
    assert!(
        backend
            .get("meshwork/apiserver/v1/c1/services/default/web")
            .await
            .unwrap()
            .is_some(),
        "the declaration is stored"
    );

    drop(agents);
    apiserver.kill();
    let revision = backend.revision("cilium/").await.unwrap();
    let apiserver = start(&etcd.endpoint(), dir.path(), Some(apiserver.ports()));
    // n1 is back, n2 not yet: the service key is not rewritten with n1's backends alone, and
    // no agent is handed the services before the initial state is complete.
    let mut n1 = Agent::publish(apiserver.grpc, "n1", 1, 3).await.unwrap();
    assert!(
        !n1.local_services_waiting() && n1.local_services.is_none(),
        "services sent before n2 was back: {:?}",
        n1.local_services
    );
    let (value, _) = backend.get(service_key).await.unwrap().unwrap();
    assert_eq!(
        value, before_value,
        "the service key changed before n2 was back"
    );
    let _n2 = Agent::publish(apiserver.grpc, "n2", 2, 3).await.unwrap();
    let set = match n1.local_services.take() {
        Some(set) => set,
        None => n1.next_local_services().await,
    };
    assert_eq!(set.services.len(), 1, "{set:?}");
    assert_eq!(
        set.services[0].backends,
        ["10.1.1.1", "10.1.1.3", "10.1.2.1", "10.1.2.3"],
        "the first set n1 gets has every node's backends"
    );
    let out = meshctl(&addr, &["service", "list", "--json"], &[]);
    let listed: serde_json::Value = serde_json::from_str(&out.1).unwrap();
    assert_eq!(
        listed["services"][0]["backends"],
        serde_json::json!(["10.1.1.1", "10.1.1.3", "10.1.2.1", "10.1.2.3"]),
        "the declaration survived the restart: {out:?}"
    );
    let events = events_since(&backend, revision + 1).await;
    let changed: Vec<_> = events
        .iter()
        .filter(|(k, _)| k != "cilium/.heartbeat")
        .collect();
    assert!(changed.is_empty(), "a reader saw {changed:?}");

    let out = meshctl(&addr, &["service", "delete", "default/web"], &[]);
    assert_eq!(out.1, "service default/web deleted\n", "{out:?}");
    assert!(!key_exists(&backend, service_key).await);
    assert!(
        backend
            .get("meshwork/apiserver/v1/c1/services/default/web")
            .await
            .unwrap()
            .is_none(),
        "the declaration is removed"
    );
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn a_wiped_etcd_gets_its_canaries_back_only_after_the_returning_agents_republished() {
    let etcd = EtcdServer::start().unwrap();
    let backend = connect(&etcd).await;
    let dir = tempfile::tempdir().unwrap();
    let mut apiserver = start(&etcd.endpoint(), dir.path(), None);
    let n1 = Agent::publish(apiserver.grpc, "n1", 1, 3).await.unwrap();
    let n2 = Agent::publish(apiserver.grpc, "n2", 2, 2).await.unwrap();
    wait_readyz(apiserver.health, DEADLINE).await.unwrap();

    // The apiserver stops, its etcd loses everything, and it starts again.
    apiserver.process.signal(Signal::SIGTERM).unwrap();
    Wait::new("the apiserver to exit")
        .timeout(DEADLINE)
        .some(|| apiserver.process.exit_status())
        .unwrap();
    drop((n1, n2));
    backend.delete_prefix("cilium/").await.unwrap();
    let wiped = backend.revision("cilium/").await.unwrap();
    let apiserver = start(&etcd.endpoint(), dir.path(), Some(apiserver.ports()));
    let (status, _) = http_get(apiserver.health, "/readyz").await;
    assert_eq!(status, 503, "no canaries in a wiped store");

    // n1 is back at once; n2 reconnects within the window but takes its time.
    let _n1 = Agent::publish(apiserver.grpc, "n1", 1, 3).await.unwrap();
    let mut n2 = Agent::open(apiserver.grpc, "n2", 2).await.unwrap();
    let early = wait_readyz(apiserver.health, Duration::from_secs(4)).await;
    assert!(early.is_err(), "canaries before n2 republished");
    n2.finish(2).await.unwrap();
    wait_readyz(apiserver.health, DEADLINE).await.unwrap();

    let events = events_since(&backend, wiped + 1).await;
    let last = |key: &str| {
        events
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, r)| *r)
            .max()
            .unwrap_or_else(|| panic!("no event for {key}"))
    };
    let canary = last("cilium/synced/c1/cilium/state/ip/v1");
    for key in [
        "cilium/state/ip/v1/default/10.1.1.3",
        "cilium/state/ip/v1/default/10.1.2.2",
        "cilium/state/nodes/v1/c1/n2",
    ] {
        assert!(last(key) < canary, "{key} came after the canaries");
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs real etcd and openssl: `cargo xtask test` runs it"]
async fn with_mtls_a_node_publishes_only_as_its_certificates_cn() {
    use meshwork_lab::etcd::EtcdTls;
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

    let etcd = EtcdServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tls = EtcdTls::create(&dir.path().join("tls")).unwrap();
    let server = tls.server();
    let flags = [
        "--grpc-cert-file".to_owned(),
        server.cert_file.display().to_string(),
        "--grpc-key-file".to_owned(),
        server.key_file.display().to_string(),
        "--grpc-ca-file".to_owned(),
        tls.ca_file.display().to_string(),
    ];
    let apiserver = common::apiserver::start_with(&etcd.endpoint(), dir.path(), None, &flags);
    let ca = Certificate::from_pem(std::fs::read(&tls.ca_file).unwrap());
    let connect = |client: Option<&meshwork_lab::etcd::ClientCert>| {
        let mut config = ClientTlsConfig::new().ca_certificate(ca.clone());
        if let Some(cert) = client {
            config = config.identity(Identity::from_pem(
                std::fs::read(&cert.cert_file).unwrap(),
                std::fs::read(&cert.key_file).unwrap(),
            ));
        }
        Endpoint::from_shared(format!("https://127.0.0.1:{}", apiserver.grpc))
            .unwrap()
            .tls_config(config)
            .unwrap()
            .connect_lazy()
    };
    let n1 = tls.issue_client("n1").unwrap();
    let mut agent = Agent::open_on(connect(Some(&n1)), "n1", 1).await.unwrap();
    agent.finish(1).await.unwrap();
    let Err(refused) = Agent::open_on(connect(Some(&n1)), "n2", 2).await else {
        panic!("n1's certificate published n2");
    };
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("CN is Some(\"n1\")"),
        "{refused:?}"
    );
    // Without a client certificate the handshake fails.
    assert!(Agent::open_on(connect(None), "n3", 3).await.is_err());
    let (_, metrics) = http_get(apiserver.metrics, "/metrics").await;
    assert!(
        metrics.contains("meshwork_apiserver_refused_requests_total{reason=\"cn_mismatch\"} 1"),
        "{metrics}"
    );
}
