//! The real `meshwork-operator` binary in kvstore mode against moto and etcd: a CiliumNode
//! key for a moto instance gets its ENI and pool published, `/healthz` and `/metrics` answer
//! (the classic text format unless OpenMetrics is asked for), the NodeIpam gRPC service
//! streams the snapshot — also to a Python client (grpcio, stubs generated from `proto/`), with
//! standard health and reflection — and SIGTERM ends it with exit status 0, its health
//! NOT_SERVING first and open watches ended with UNAVAILABLE. An operator that cannot describe
//! EC2 stays NOT_SERVING. The same over TLS, with client-certificate auth as an etcd user that
//! may touch only the CiliumNode keys; the gRPC endpoint over mTLS, where a client speaks only
//! for the node its certificate names, with the test hook's inconsistent snapshot; and a
//! taken metrics port fails the start, naming the address and the OS error.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use common::Lab;
use futures::StreamExt as _;
use meshwork_kvstore::{EtcdBackend, EtcdConfig};
use meshwork_lab::etcd::{Access, ClientCert, EtcdOptions, EtcdServer, EtcdTls};
use meshwork_lab::python_client;
use meshwork_lab::wait::{Wait, free_port};
use meshwork_operator::cilium_node::{CiliumNode, CiliumNodeSpec};
use meshwork_operator::node_store::KEY_PREFIX;
use meshwork_operator::node_store::etcd::{decode, key};
use meshwork_proto::ipam::v1::node_ipam_client::NodeIpamClient;
use meshwork_proto::ipam::v1::{
    NodeSnapshot, RegisterNodeRequest, ReportUsageRequest, WatchNodeRequest, node_ipam_server,
};
use meshwork_proto::standard::client::{HealthStatus, health, watch_health};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

const DEADLINE: Duration = Duration::from_secs(60);
/// How long the operator may take to exit after SIGTERM.
const EXIT_DEADLINE: Duration = Duration::from_secs(10);

/// Kills the operator if the test fails before stopping it.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// A running operator and its ports.
struct Operator {
    child: Child,
    metrics_port: u16,
    grpc_port: u16,
}

fn http_get(port: u16, path: &str, accept: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).ok()?;
    reply.starts_with("HTTP/1.1 200").then_some(reply)
}

async fn connect(config: &EtcdConfig) -> EtcdBackend {
    EtcdBackend::connect(config, Duration::from_secs(10))
        .await
        .expect("connect to the lab etcd")
}

/// Stores node-1 for `instance`: pre-allocate 8 on a new ENI at device 1.
async fn put_node(backend: &EtcdBackend, instance: &str) {
    let mut spec = CiliumNodeSpec::default();
    spec.eni.instance_id = instance.to_owned();
    spec.eni.instance_type = "m5.large".to_owned();
    spec.eni.first_interface_index = Some(1);
    spec.ipam.pre_allocate = 8;
    let node = CiliumNode::new("node-1", spec);
    backend
        .put(&key("node-1"), serde_json::to_vec(&node).expect("json"))
        .await
        .expect("put");
}

/// Starts the operator against `lab`'s moto and the etcd `etcd_args` name.
fn start_operator(lab: &Lab, etcd_args: &[&str]) -> Operator {
    start_operator_against(&lab.moto.endpoint(), etcd_args)
}

/// Starts the operator against the EC2 API at `ec2` and the etcd `etcd_args` name.
fn start_operator_against(ec2: &str, etcd_args: &[&str]) -> Operator {
    let metrics_port = free_port().expect("port");
    let grpc_port = free_port().expect("port");
    let child = Command::new(env!("CARGO_BIN_EXE_meshwork-operator"))
        .args(["--cluster-name", "lab", "--aws-region", "us-east-1"])
        .args(["--ec2-endpoint", ec2])
        .args(etcd_args)
        .args([
            "--prometheus-serve-addr",
            &format!("127.0.0.1:{metrics_port}"),
        ])
        .args(["--grpc-serve-addr", &format!("127.0.0.1:{grpc_port}")])
        .stdin(Stdio::null())
        .spawn()
        .expect("start meshwork-operator");
    Operator {
        child: Child(child),
        metrics_port,
        grpc_port,
    }
}

/// Waits until node-1's published pool holds 8 addresses, failing at once if the operator
/// exits meanwhile; checks what was published: no pool IP without its ENI, eth0 and the new
/// ENI at device 1, tagged with the cluster name.
async fn wait_for_pool(backend: &EtcdBackend, operator: &mut Operator) -> CiliumNode {
    let node_key = key("node-1");
    let (exited, published) = Wait::new("node-1's pool of 8")
        .timeout(DEADLINE)
        .every(Duration::from_millis(100))
        .until_async(
            || {
                let exited = operator.child.0.try_wait().expect("status");
                let node_key = &node_key;
                async move {
                    let stored = backend.get(node_key).await.expect("get");
                    let node = stored.map(|(value, revision)| {
                        decode(node_key, &value, revision).expect("decode")
                    });
                    (exited, node)
                }
            },
            |(exited, node)| {
                exited.is_some() || node.as_ref().is_some_and(|n| n.spec.ipam.pool.len() == 8)
            },
        )
        .await
        .unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(exited, None, "operator exited early");
    let published = published.expect("checked present");
    assert!(published.pool_ips_without_eni().is_empty());
    let status = published.status.as_ref().expect("status");
    assert_eq!(status.eni.enis.len(), 2, "eth0 and the new ENI");
    let new = status
        .eni
        .enis
        .values()
        .find(|eni| eni.number == 1)
        .expect("the ENI at device 1");
    assert_eq!(
        new.tags.get("meshwork.io/cluster-name").map(String::as_str),
        Some("lab")
    );
    published
}

/// SIGTERM, then the exit status (within [`EXIT_DEADLINE`]). Waits without blocking the
/// test's runtime, so the test's open gRPC connections answer the server's graceful
/// shutdown (its GOAWAY ping) meanwhile.
async fn terminate(operator: &mut Operator) -> ExitStatus {
    let pid = operator.child.0.id().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    let child = &mut operator.child.0;
    Wait::new("the operator's exit after SIGTERM")
        .timeout(EXIT_DEADLINE)
        .every(Duration::from_millis(50))
        .until_async(
            || std::future::ready(child.try_wait().expect("wait")),
            Option::is_some,
        )
        .await
        .unwrap_or_else(|err| panic!("{err}"))
        .expect("checked exited")
}

#[tokio::test]
#[ignore = "needs the patched moto server and real etcd: `cargo xtask test` runs it"]
async fn the_binary_allocates_for_an_etcd_node_and_exits_0_on_sigterm() {
    let lab = Lab::start("10.213.0.0/24").await;
    let etcd = memory_etcd();
    let backend = connect(&EtcdConfig::new([etcd.endpoint()])).await;
    let instance = lab.instance("m5.large").await;
    put_node(&backend, &instance).await;

    let endpoint = etcd.endpoint();
    let mut operator = start_operator(&lab, &["--kvstore-endpoints", &endpoint]);
    wait_for_pool(&backend, &mut operator).await;

    let port = operator.metrics_port;
    assert!(http_get(port, "/healthz", "*/*").is_some_and(|r| r.ends_with("ok\n")));
    let classic = http_get(port, "/metrics", "text/plain").expect("metrics");
    assert!(
        classic.contains("text/plain; version=0.0.4"),
        "the classic format by default: {classic}"
    );
    assert!(
        classic.contains("meshwork_ipam_api_duration_seconds_count{operation=\"CreateNetworkInterface\",response_code=\"OK\"} 1"),
        "{classic}"
    );
    assert!(classic.contains("meshwork_ipam_api_rate_limit_duration_seconds"));
    let body = meshwork_lab::prometheus::scrape(port).expect("the operator serves /metrics");
    meshwork_lab::prometheus::assert_promtool_clean(&body);
    // The CiliumNode watch store reports its first list done.
    assert!(
        classic.contains("source=\"lab\",action=\"read\"} 1"),
        "{classic}"
    );
    let open = http_get(
        port,
        "/metrics",
        "application/openmetrics-text; version=1.0.0",
    )
    .expect("OpenMetrics");
    assert!(open.contains("application/openmetrics-text"), "{open}");
    assert!(open.contains("# EOF"), "{open}");

    // The NodeIpam service streams the same snapshot, at once.
    let mut client = NodeIpamClient::new(grpc_channel(operator.grpc_port).await);
    let mut watch_node = client
        .watch_node(WatchNodeRequest {
            node: "node-1".to_owned(),
        })
        .await
        .expect("WatchNode")
        .into_inner();
    let snapshot = tokio::time::timeout(Duration::from_secs(5), watch_node.message())
        .await
        .expect("at once")
        .expect("a stream")
        .expect("a snapshot");
    assert_eq!(snapshot.pool.len(), 8);
    assert_eq!(snapshot.enis.len(), 2);
    assert!(pool_ips_without_eni(&snapshot).is_empty());

    let target = format!("127.0.0.1:{}", operator.grpc_port);
    let checks = python_client::check_server(&target, &["operator", "--node", "node-1"])
        .expect("the Python client");
    assert!(checks.passed, "{}", checks.output);
    for check in [
        "health meshwork.ipam.v1.NodeIpam",
        "reflection v1 lists the served services",
        "reflection describes meshwork.ipam.v1.NodeIpam",
        "NodeIpam.WatchNode",
        "NodeIpam.WatchNode with an invalid name",
        "NodeIpam.WatchNode of an unknown node",
        "NodeIpam.ReportUsage with a bad answer",
        "NodeIpam.ReportUsage of a generation never published",
        "NodeIpam.RegisterNode without an instance",
    ] {
        assert!(checks.passed_check(check), "{check}: {}", checks.output);
    }

    let channel = grpc_channel(operator.grpc_port).await;
    let mut watch = watch_health(channel, "").await.expect("Health/Watch");
    assert_eq!(
        watch.next().await.expect("a status").expect("ok"),
        HealthStatus::Serving
    );
    let status = terminate(&mut operator).await;
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert_eq!(
        watch.next().await.map(|s| s.expect("ok")),
        Some(HealthStatus::NotServing),
        "NOT_SERVING before the server goes"
    );
    // The open watch did not hold the server up: it ended, telling the client to come back.
    let ended = tokio::time::timeout(DEADLINE, watch_node.message())
        .await
        .expect("the watch ended");
    let status = ended.map(|_| ()).expect_err("an error");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status}");
    assert!(
        status.message().contains("shutting down"),
        "ended by the operator, not by the connection going: {status}"
    );
}

/// Pool IPs of `snapshot` whose ENI is not among its ENIs.
fn pool_ips_without_eni(snapshot: &NodeSnapshot) -> Vec<String> {
    snapshot
        .pool
        .iter()
        .filter(|ip| !snapshot.enis.iter().any(|eni| eni.id == ip.resource))
        .map(|ip| ip.ip.clone())
        .collect()
}

/// A channel to the operator's gRPC port, once it accepts.
async fn grpc_channel(port: u16) -> tonic::transport::Channel {
    Wait::new("the operator's gRPC port")
        .timeout(DEADLINE)
        .every(Duration::from_millis(50))
        .until_async(
            || async move {
                Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
                    .expect("endpoint")
                    .connect()
                    .await
                    .ok()
            },
            Option::is_some,
        )
        .await
        .unwrap_or_else(|err| panic!("{err}"))
        .expect("checked connected")
}

/// A single-member etcd keeping its data in memory.
fn memory_etcd() -> EtcdServer {
    EtcdServer::start_with(EtcdOptions {
        data_in_memory: true,
        ..EtcdOptions::default()
    })
    .expect("etcd")
}

#[tokio::test]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn an_operator_that_cannot_describe_ec2_is_not_serving() {
    let etcd = memory_etcd();
    let endpoint = etcd.endpoint();
    // Nothing listens on port 1: every describe fails.
    let mut operator =
        start_operator_against("http://127.0.0.1:1", &["--kvstore-endpoints", &endpoint]);
    let channel = grpc_channel(operator.grpc_port).await;
    // The store's listing arrives at once; the describe never succeeds.
    let store_listed = Wait::new("the CiliumNode store's first listing")
        .timeout(DEADLINE)
        .every(Duration::from_millis(100))
        .until(
            || http_get(operator.metrics_port, "/metrics", "text/plain"),
            |m| {
                m.as_ref()
                    .is_some_and(|m| m.contains("source=\"lab\",action=\"read\"} 1"))
            },
        );
    assert!(store_listed.is_ok(), "{store_listed:?}");
    for service in ["", node_ipam_server::SERVICE_NAME] {
        assert_eq!(
            health(channel.clone(), service)
                .await
                .expect("Health/Check"),
            HealthStatus::NotServing,
            "{service:?}"
        );
    }
    let status = terminate(&mut operator).await;
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[tokio::test]
#[ignore = "needs the patched moto server and real etcd: `cargo xtask test` runs it"]
async fn the_binary_allocates_over_tls_as_an_etcd_user_of_the_node_prefix() {
    let lab = Lab::start("10.213.0.0/24").await;
    let etcd = EtcdServer::start_with(EtcdOptions {
        tls: true,
        data_in_memory: true,
        ..EtcdOptions::default()
    })
    .expect("TLS etcd");
    let tls = etcd.tls().expect("TLS material").clone();
    // With client-certificate auth the certificate's CN is the etcd user; this one may
    // read and write the CiliumNode keys and nothing else.
    let user = etcd
        .add_user("meshwork-operator", KEY_PREFIX, Access::ReadWrite)
        .expect("operator user");
    let root = tls.client("root");
    let admin = connect(&EtcdConfig {
        endpoints: vec![etcd.endpoint()],
        trusted_ca_file: Some(tls.ca_file.clone()),
        cert_file: Some(root.cert_file),
        key_file: Some(root.key_file),
    })
    .await;
    let instance = lab.instance("m5.large").await;
    put_node(&admin, &instance).await;

    let endpoint = etcd.endpoint();
    let (ca, cert, key_file) = (
        tls.ca_file.to_string_lossy().into_owned(),
        user.cert_file.to_string_lossy().into_owned(),
        user.key_file.to_string_lossy().into_owned(),
    );
    let mut operator = start_operator(
        &lab,
        &[
            "--kvstore-endpoints",
            &endpoint,
            "--kvstore-trusted-ca-file",
            &ca,
            "--kvstore-cert-file",
            &cert,
            "--kvstore-key-file",
            &key_file,
        ],
    );
    assert!(endpoint.starts_with("https://"), "{endpoint}");
    wait_for_pool(&admin, &mut operator).await;

    let status = terminate(&mut operator).await;
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[test]
#[ignore = "needs the patched moto server and real etcd: `cargo xtask test` runs it"]
fn a_taken_metrics_port_fails_the_start_with_the_address_and_the_os_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr");
    // Nothing listens on port 1: the bind fails before etcd would be asked anything.
    let output = Command::new(env!("CARGO_BIN_EXE_meshwork-operator"))
        .args(["--aws-region", "us-east-1"])
        .args(["--ec2-endpoint", "http://127.0.0.1:1"])
        .args(["--kvstore-endpoints", "http://127.0.0.1:1"])
        .args(["--prometheus-serve-addr", &addr.to_string()])
        .stdin(Stdio::null())
        .output()
        .expect("run meshwork-operator");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{:?}: {stderr}", output.status);
    assert!(
        stderr.contains(&format!("binding the metrics endpoint {addr}")),
        "{stderr}"
    );
    assert!(stderr.contains("Address already in use"), "{stderr}");
}

/// A TLS channel to the operator's gRPC port trusting `ca`, presenting `identity` if given.
async fn tls_channel(
    port: u16,
    ca: &std::path::Path,
    identity: Option<&ClientCert>,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(ca).expect("CA")))
        .domain_name("localhost");
    if let Some(identity) = identity {
        tls = tls.identity(Identity::from_pem(
            std::fs::read(&identity.cert_file).expect("certificate"),
            std::fs::read(&identity.key_file).expect("key"),
        ));
    }
    Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
        .expect("endpoint")
        .tls_config(tls)
        .expect("TLS config")
        .connect()
        .await
}

fn register(node: &str, instance: &str, pre: i32) -> RegisterNodeRequest {
    RegisterNodeRequest {
        node: node.to_owned(),
        instance_id: instance.to_owned(),
        instance_type: "m5.large".to_owned(),
        first_interface_index: Some(1),
        pre_allocate: Some(pre),
        ..RegisterNodeRequest::default()
    }
}

#[tokio::test]
#[ignore = "needs the patched moto server and real etcd: `cargo xtask test` runs it"]
async fn over_mtls_a_node_speaks_only_for_itself_and_the_test_hook_breaks_one_snapshot() {
    let lab = Lab::start("10.213.0.0/24").await;
    let etcd = memory_etcd();
    let backend = connect(&EtcdConfig::new([etcd.endpoint()])).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let tls = EtcdTls::create(&dir.path().join("ours")).expect("TLS material");
    let node_1 = tls.issue_client("node-1").expect("node-1's certificate");
    let node_2 = tls.issue_client("node-2").expect("node-2's certificate");
    let foreign = EtcdTls::foreign(&dir.path().join("foreign"))
        .expect("another CA")
        .issue_client("node-1")
        .expect("a node-1 certificate of another CA");
    let server = tls.server();
    let path = |p: &std::path::Path| p.to_string_lossy().into_owned();
    let (cert, key_file, ca) = (
        path(&server.cert_file),
        path(&server.key_file),
        path(&tls.ca_file),
    );
    let endpoint = etcd.endpoint();
    let mut operator = start_operator(
        &lab,
        &[
            "--kvstore-endpoints",
            &endpoint,
            "--grpc-tls-cert",
            &cert,
            "--grpc-tls-key",
            &key_file,
            "--grpc-tls-client-ca",
            &ca,
            "--test-hook-inconsistent-snapshot",
            "node-1",
        ],
    );
    let port = operator.grpc_port;
    let channel = Wait::new("the operator's mTLS port")
        .timeout(DEADLINE)
        .every(Duration::from_millis(100))
        .until_async(
            || tls_channel(port, &tls.ca_file, Some(&node_1)),
            Result::is_ok,
        )
        .await
        .unwrap_or_else(|err| panic!("{err}"))
        .expect("checked connected");
    let mut as_node_1 = NodeIpamClient::new(channel);
    let instance = lab.instance("m5.large").await;
    as_node_1
        .register_node(register("node-1", &instance, 8))
        .await
        .expect("node-1 registers itself");

    // The hook: one snapshot whose pool names an ENI it lacks, then the real one.
    let mut watch = as_node_1
        .watch_node(WatchNodeRequest {
            node: "node-1".to_owned(),
        })
        .await
        .expect("node-1 watches itself")
        .into_inner();
    let mut next = async || {
        tokio::time::timeout(DEADLINE, watch.message())
            .await
            .expect("a snapshot in time")
            .expect("a stream")
            .expect("a snapshot")
    };
    let broken = next().await;
    let real = next().await;
    assert!(!pool_ips_without_eni(&broken).is_empty(), "{broken:?}");
    assert!(pool_ips_without_eni(&real).is_empty(), "{real:?}");
    assert_eq!(broken.pool, real.pool);
    assert_ne!(broken.generation, real.generation);
    assert_eq!(real.pool.len(), 8);
    let report = |generation: &str| ReportUsageRequest {
        node: "node-1".to_owned(),
        generation: generation.to_owned(),
        ..ReportUsageRequest::default()
    };
    let refused = as_node_1
        .report_usage(report(&broken.generation))
        .await
        .expect_err("the broken snapshot was never published");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused}");
    as_node_1
        .report_usage(report(&real.generation))
        .await
        .expect("node-1 reports on itself");
    let before = backend.get(&key("node-1")).await.expect("get");

    // Another node's certificate may not speak for node-1.
    let mut as_node_2 = NodeIpamClient::new(
        tls_channel(port, &tls.ca_file, Some(&node_2))
            .await
            .expect("node-2 connects"),
    );
    let denied = [
        as_node_2
            .register_node(register("node-1", &instance, 2))
            .await
            .map(drop),
        as_node_2
            .watch_node(WatchNodeRequest {
                node: "node-1".to_owned(),
            })
            .await
            .map(drop),
        as_node_2
            .report_usage(report(&real.generation))
            .await
            .map(drop),
    ];
    for result in denied {
        let status = result.expect_err("another node");
        assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status}");
    }
    assert_eq!(
        backend.get(&key("node-1")).await.expect("get"),
        before,
        "nothing written for a refused client"
    );

    // No client certificate, one of another CA, or plaintext: refused before any RPC.
    let no_certificate = match tls_channel(port, &tls.ca_file, None).await {
        Ok(channel) => NodeIpamClient::new(channel)
            .register_node(register("node-1", &instance, 2))
            .await
            .map(drop),
        Err(err) => Err(tonic::Status::unavailable(err.to_string())),
    };
    let status = no_certificate.expect_err("refused without a certificate");
    assert_ne!(status.code(), tonic::Code::PermissionDenied, "{status}");
    let wrong_ca = match tls_channel(port, &tls.ca_file, Some(&foreign)).await {
        Ok(channel) => NodeIpamClient::new(channel)
            .register_node(register("node-1", &instance, 2))
            .await
            .map(drop),
        Err(err) => Err(tonic::Status::unavailable(err.to_string())),
    };
    let status = wrong_ca.expect_err("refused with another CA's certificate");
    assert_ne!(status.code(), tonic::Code::PermissionDenied, "{status}");
    let plaintext = match Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .expect("endpoint")
        .connect()
        .await
    {
        Ok(channel) => NodeIpamClient::new(channel)
            .register_node(register("node-1", &instance, 2))
            .await
            .map(drop),
        Err(err) => Err(tonic::Status::unavailable(err.to_string())),
    };
    assert!(plaintext.is_err(), "plaintext on a TLS port");
    assert_eq!(backend.get(&key("node-1")).await.expect("get"), before);

    let status = terminate(&mut operator).await;
    assert_eq!(status.code(), Some(0), "{status:?}");
}
