//! The real `meshwork-operator` binary in kvstore mode against moto and etcd: a CiliumNode
//! key for a moto instance gets its ENI and pool published, `/healthz` and `/metrics`
//! answer, the NodeIpam gRPC service serves the snapshot, and SIGTERM ends it with exit
//! status 0.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Lab;
use etcd_client::Client;
use meshwork_lab::etcd::{EtcdOptions, EtcdServer};
use meshwork_operator::cilium_node::{CiliumNode, CiliumNodeSpec};
use meshwork_operator::node_store::etcd::{decode, key};

const DEADLINE: Duration = Duration::from_secs(60);

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

fn http_get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).ok()?;
    reply.starts_with("HTTP/1.1 200").then_some(reply)
}

#[tokio::test]
async fn the_binary_allocates_for_an_etcd_node_and_exits_0_on_sigterm() {
    let lab = Lab::start("10.213.0.0/24").await;
    let etcd = EtcdServer::start_with(EtcdOptions {
        data_in_memory: true,
        ..EtcdOptions::default()
    })
    .expect("etcd");
    let client = Client::connect([etcd.endpoint()], None)
        .await
        .expect("connect");
    let instance = lab.instance("m5.large").await;
    let mut spec = CiliumNodeSpec::default();
    spec.eni.instance_id.clone_from(&instance);
    spec.eni.instance_type = "m5.large".to_owned();
    spec.eni.first_interface_index = Some(1);
    spec.ipam.pre_allocate = 8;
    let node = CiliumNode::new("node-1", spec);
    client
        .clone()
        .put(
            key("node-1"),
            serde_json::to_vec(&node).expect("json"),
            None,
        )
        .await
        .expect("put");

    let port = meshwork_lab::wait::free_port().expect("port");
    let grpc_port = meshwork_lab::wait::free_port().expect("port");
    let operator = Command::new(env!("CARGO_BIN_EXE_meshwork-operator"))
        .args(["--cluster-name", "lab", "--aws-region", "us-east-1"])
        .args(["--ec2-endpoint", &lab.moto.endpoint()])
        .args(["--kvstore-endpoints", &etcd.endpoint()])
        .args(["--prometheus-serve-addr", &format!("127.0.0.1:{port}")])
        .args(["--grpc-serve-addr", &format!("127.0.0.1:{grpc_port}")])
        .stdin(Stdio::null())
        .spawn()
        .expect("start meshwork-operator");
    let mut operator = Child(operator);

    let start = Instant::now();
    let published = loop {
        let response = client.clone().get(key("node-1"), None).await.expect("get");
        if let Some(kv) = response.kvs().first() {
            let node = decode(kv).expect("decode");
            if node.spec.ipam.pool.len() == 8 {
                break node;
            }
        }
        assert!(
            operator.0.try_wait().expect("status").is_none(),
            "operator exited early"
        );
        assert!(start.elapsed() < DEADLINE, "no pool published");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(published.pool_ips_without_eni().is_empty());
    let status = published.status.expect("status");
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

    assert!(http_get(port, "/healthz").is_some_and(|r| r.ends_with("ok\n")));
    let metrics = http_get(port, "/metrics").expect("metrics");
    assert!(
        metrics.contains("meshwork_ipam_api_duration_seconds_count{operation=\"CreateNetworkInterface\",response_code=\"OK\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("meshwork_ipam_api_rate_limit_duration_seconds"));

    // The NodeIpam service serves the same snapshot.
    let mut client = meshwork_proto::operator::v1::node_ipam_client::NodeIpamClient::connect(
        format!("http://127.0.0.1:{grpc_port}"),
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

    let pid = operator.0.id().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    let start = Instant::now();
    let status = loop {
        if let Some(status) = operator.0.try_wait().expect("wait") {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(0), "{status:?}");
}
