//! The real `meshwork-operator` binary in kvstore mode against moto and etcd: a CiliumNode
//! key for a moto instance gets its ENI and pool published, `/healthz` and `/metrics` answer
//! (the classic text format unless OpenMetrics is asked for), the NodeIpam gRPC service
//! serves the snapshot — also to a Python client (grpcio, stubs generated from `proto/`), with
//! standard health and reflection — and SIGTERM ends it with exit status 0, its health
//! NOT_SERVING first. An operator that cannot describe EC2 stays NOT_SERVING. The same over TLS, with
//! client-certificate auth as an etcd user that may touch only the CiliumNode keys; and a
//! taken metrics port fails the start, naming the address and the OS error.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use common::Lab;
use futures::StreamExt as _;
use meshwork_kvstore::{EtcdBackend, EtcdConfig};
use meshwork_lab::etcd::{Access, EtcdOptions, EtcdServer};
use meshwork_lab::python_client;
use meshwork_lab::wait::{Wait, free_port};
use meshwork_operator::cilium_node::{CiliumNode, CiliumNodeSpec};
use meshwork_operator::node_store::KEY_PREFIX;
use meshwork_operator::node_store::etcd::{decode, key};
use meshwork_proto::operator::v1::node_ipam_server;
use meshwork_proto::standard::client::{HealthStatus, health, watch_health};

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

/// SIGTERM, then the exit status (within [`EXIT_DEADLINE`]).
fn terminate(operator: &mut Operator) -> ExitStatus {
    let pid = operator.child.0.id().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    // Blocking is fine: the operator is another process.
    Wait::new("the operator's exit after SIGTERM")
        .timeout(EXIT_DEADLINE)
        .every(Duration::from_millis(50))
        .until(
            || operator.child.0.try_wait().expect("wait"),
            Option::is_some,
        )
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

    // The NodeIpam service serves the same snapshot.
    let mut client = meshwork_proto::operator::v1::node_ipam_client::NodeIpamClient::connect(
        format!("http://127.0.0.1:{}", operator.grpc_port),
    )
    .await
    .expect("gRPC connect");
    let snapshot = client
        .get_node_ipam(meshwork_proto::operator::v1::GetNodeIpamRequest {
            node: "node-1".to_owned(),
        })
        .await
        .expect("GetNodeIpam")
        .into_inner();
    assert_eq!(snapshot.pool.len(), 8);
    assert_eq!(snapshot.enis.len(), 2);

    let target = format!("127.0.0.1:{}", operator.grpc_port);
    let checks = python_client::check_server(&target, &["operator", "--node", "node-1"])
        .expect("the Python client");
    assert!(checks.passed, "{}", checks.output);
    for check in [
        "health meshwork.operator.v1.NodeIpam",
        "reflection v1 lists the served services",
        "reflection describes meshwork.operator.v1.NodeIpam",
        "NodeIpam.GetNodeIpam",
        "NodeIpam.GetNodeIpam with an invalid name",
    ] {
        assert!(checks.passed_check(check), "{check}: {}", checks.output);
    }

    let channel = grpc_channel(operator.grpc_port).await;
    let mut watch = watch_health(channel, "").await.expect("Health/Watch");
    assert_eq!(
        watch.next().await.expect("a status").expect("ok"),
        HealthStatus::Serving
    );
    let status = terminate(&mut operator);
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert_eq!(
        watch.next().await.map(|s| s.expect("ok")),
        Some(HealthStatus::NotServing),
        "NOT_SERVING before the server goes"
    );
}

/// A channel to the operator's gRPC port, once it accepts.
async fn grpc_channel(port: u16) -> tonic::transport::Channel {
    Wait::new("the operator's gRPC port")
        .timeout(DEADLINE)
        .every(Duration::from_millis(50))
        .until_async(
            || async move {
                tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
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
    let status = terminate(&mut operator);
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

    let status = terminate(&mut operator);
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
