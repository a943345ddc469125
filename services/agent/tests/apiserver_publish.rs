//! The real agent binary publishing to the cluster's apiserver (its library, served here on a
//! free port, over a real etcd), every event under `cilium/` recorded:
//!
//! - an endpoint added with labels and identity 0 gets its identity from the apiserver, and
//!   its ipcache key (HostIP = the node's IP) and the node are in etcd;
//! - a label not of the form source:key=value is refused before anything is published;
//! - the agent restarted republishes its restored endpoint: a reader sees no event but the
//!   heartbeat;
//! - the apiserver gone: the agent keeps serving its datapath, says so in its status, and
//!   reconnects once the apiserver is back;
//! - with WireGuard on, the node is published with its device's public key;
//! - the cluster's services (shared or not) come back from the apiserver and are programmed
//!   into the node's service maps, and follow each change of their declaration.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use meshwork_apiserver::exporter::{Exporter, Settings};
use meshwork_apiserver::grpc::ExportService;
use meshwork_apiserver::metrics::ApiserverMetrics;
use meshwork_kvstore::{EtcdBackend, WatchEvent};
use meshwork_lab::agent::{AgentOptions, AgentProcess};
use meshwork_lab::bpffs::BpfRoot;
use meshwork_lab::etcd::EtcdServer;
use meshwork_lab::net::LabNet;
use meshwork_lab::wait::{Wait, eventually_async};
use meshwork_proto::agent::v1 as pb;
use meshwork_proto::agent::v1::agent_client::AgentClient;
use meshwork_proto::agent::v1::datapath_client::DatapathClient;
use meshwork_proto::connect_unix;
use nix::sys::signal::Signal;
use tonic::Code;

const SENTINEL: &str = "cilium/zz-sentinel";

/// The apiserver's library serving `Export` on `addr` (port 0: a free one), on a runtime
/// of its own: shutting that down ends every connection, as the apiserver's death would.
fn apiserver(etcd: &EtcdServer, addr: SocketAddr) -> (SocketAddr, tokio::runtime::Runtime) {
    apiserver_with_tls(etcd, addr, None)
}

/// [`apiserver`] over `tls`, where a session publishes only its certificate's CN.
fn apiserver_with_tls(
    etcd: &EtcdServer,
    addr: SocketAddr,
    tls: Option<tonic::transport::ServerTlsConfig>,
) -> (SocketAddr, tokio::runtime::Runtime) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let endpoint = etcd.endpoint();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(addr))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    runtime.spawn(async move {
        let backend = EtcdBackend::connect(
            &meshwork_kvstore::EtcdConfig::new([endpoint]),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        let settings = Settings {
            initial_sync_timeout: Duration::from_secs(1),
            ..Settings::new("c1", 1)
        };
        let metrics = ApiserverMetrics::default();
        let (exporter, commands, _ready) = Exporter::start(backend, settings, metrics.clone())
            .await
            .unwrap();
        tokio::spawn(exporter.run());
        let mut service = ExportService::new(commands, metrics);
        let mut server = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            service = service.node_is_cn();
            server = server.tls_config(tls).unwrap();
        }
        let _ = server
            .add_service(service.into_server())
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await;
    });
    (addr, runtime)
}

/// Node n1 of c1 (node IP 192.0.2.1, pods in `pod_cidr`) with the BPF datapath under `bpf`,
/// its state under `dir`, publishing to the apiserver at `addr`.
fn publishing_agent(dir: &Path, bpf: &BpfRoot, addr: SocketAddr, pod_cidr: &str) -> AgentOptions {
    AgentOptions::new(
        Path::new(env!("CARGO_BIN_EXE_meshwork-agent")),
        "c1",
        1,
        &dir.join("state"),
    )
    .bpf_root(bpf.path())
    .flags([
        format!("--apiserver-addr={addr}"),
        "--node-name=n1".to_owned(),
        "--node-ip=192.0.2.1".to_owned(),
        format!("--ipv4-alloc-cidr={pod_cidr}"),
    ])
}

async fn agent_status(socket: &Path) -> pb::StatusResponse {
    let channel = connect_unix(socket).await.unwrap();
    AgentClient::new(channel)
        .status(pb::StatusRequest {})
        .await
        .unwrap()
        .into_inner()
}

async fn put_endpoint(socket: &Path, endpoint: pb::Endpoint) -> Result<(), tonic::Status> {
    let channel = connect_unix(socket).await.unwrap();
    DatapathClient::new(channel)
        .put_endpoint(pb::PutEndpointRequest {
            endpoint: Some(endpoint),
        })
        .await
        .map(drop)
}

/// Waits until the agent at `socket` says its initial state is written (`what` names it).
async fn wait_published(socket: &Path, what: &str) -> pb::StatusResponse {
    eventually_async(
        what,
        || agent_status(socket),
        |s| {
            s.apiserver
                .as_ref()
                .is_some_and(|a| a.connected && a.initial_state_written)
        },
    )
    .await
}

/// Every key a reader of `cilium/` sees change from `revision` on, but the heartbeat.
async fn changed_since(backend: &EtcdBackend, revision: i64) -> Vec<String> {
    let mut watch = backend.watch("cilium/", revision).await.unwrap();
    backend.put(SENTINEL, "x").await.unwrap();
    let mut keys = Vec::new();
    loop {
        let batch = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .expect("the watch reaches the sentinel")
            .unwrap()
            .expect("the watch goes on");
        for event in batch {
            let (WatchEvent::Put { key, .. } | WatchEvent::Delete { key, .. }) = event;
            let key = String::from_utf8(key).unwrap();
            if key == SENTINEL {
                return keys;
            }
            if key != "cilium/.heartbeat" {
                keys.push(key);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs real etcd, root, bpffs and network namespaces: `cargo xtask test` runs it"]
async fn the_agent_publishes_to_the_apiserver_and_a_restart_changes_nothing() {
    let etcd = EtcdServer::start().unwrap();
    let backend = common::connect(&etcd).await;
    let (addr, server) =
        tokio::task::block_in_place(|| apiserver(&etcd, "127.0.0.1:0".parse().unwrap()));

    let lab = LabNet::new().unwrap();
    let node = lab.netns("pub-node").unwrap();
    let pods = [
        lab.netns("pub-pod1").unwrap(),
        lab.netns("pub-pod2").unwrap(),
    ];
    node.veth_to("lxc1", &pods[0], "eth0").unwrap();
    node.veth_to("lxc2", &pods[1], "eth0").unwrap();
    let bpf = BpfRoot::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let options = publishing_agent(dir.path(), &bpf, addr, "10.214.7.0/24");
    let mut agent = AgentProcess::start(&options).unwrap();
    let socket = agent.socket().to_owned();

    let web = pb::Endpoint {
        id: 1,
        interface: "lxc1".to_owned(),
        netns: node.path().display().to_string(),
        ips: vec!["10.214.7.1".to_owned()],
        identity: 0,
        allowed_identities: vec![2000],
        labels: vec!["k8s:app=web".to_owned()],
        pod_namespace: "default".to_owned(),
        pod_name: "web-1".to_owned(),
        ..pb::Endpoint::default()
    };
    put_endpoint(&socket, web.clone())
        .await
        .unwrap_or_else(|err| panic!("{err:?}; log:\n{}", agent.log_tail()));
    let channel = connect_unix(&socket).await.unwrap();
    let listed = DatapathClient::new(channel)
        .list_endpoints(pb::ListEndpointsRequest {})
        .await
        .unwrap()
        .into_inner();
    let identity = listed.endpoints[0].endpoint.as_ref().unwrap().identity;
    assert_eq!(identity, 65536, "the first identity of cluster 1's range");
    let published = eventually_async(
        "the apiserver to write the endpoint's ipcache key",
        || backend.get("cilium/state/ip/v1/default/10.214.7.1"),
        |got| matches!(got, Ok(Some(_))),
    )
    .await;
    let (value, _) = published.unwrap().unwrap();
    let value: serde_json::Value = serde_json::from_slice(&value).unwrap();
    assert_eq!(
        (value["ID"].as_u64(), value["HostIP"].as_str()),
        (Some(65536), Some("192.0.2.1"))
    );
    assert_eq!(value["K8sPodName"], "web-1");
    assert!(
        backend
            .get("cilium/state/nodes/v1/c1/n1")
            .await
            .unwrap()
            .is_some()
    );
    let status = wait_published(&socket, "the agent to report its initial state written").await;
    assert_eq!(status.apiserver.unwrap().endpoints, 1);

    // A bad label is refused by the agent itself: nothing is published.
    let bad = pb::Endpoint {
        id: 2,
        labels: vec!["app=web".to_owned()],
        ..web.clone()
    };
    let refused = put_endpoint(&socket, bad).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("label \"app=web\""),
        "{refused:?}"
    );

    // The agent restarts and republishes its restored endpoint: nothing changes. The
    // apiserver answers "written" before it writes its canaries (same pass), so they are
    // waited for first.
    let canary = eventually_async(
        "the apiserver's canaries",
        || backend.get("cilium/synced/c1/cilium/state/ip/v1"),
        |got| matches!(got, Ok(Some(_))),
    )
    .await;
    assert!(matches!(canary, Ok(Some(_))));
    let before = backend.revision("cilium/").await.unwrap();
    agent.process().signal(Signal::SIGTERM).unwrap();
    Wait::new("the agent to exit")
        .timeout(Duration::from_secs(10))
        .some(|| agent.process().exit_status())
        .unwrap();
    let mut agent = AgentProcess::start(&options).unwrap();
    eventually_async(
        "the restarted agent to republish",
        || agent_status(&socket),
        |s| {
            s.apiserver
                .as_ref()
                .is_some_and(|a| a.initial_state_written && a.endpoints == 1)
        },
    )
    .await;
    let changed = changed_since(&backend, before + 1).await;
    assert!(
        changed.is_empty(),
        "an agent restart showed a reader {changed:?}"
    );

    // The apiserver goes: the datapath goes on, the status says so.
    server.shutdown_background();
    let status = eventually_async(
        "the agent to see the apiserver gone",
        || agent_status(&socket),
        |s| {
            s.apiserver
                .as_ref()
                .is_some_and(|a| !a.connected && a.last_error.is_some())
        },
    )
    .await;
    println!("while the apiserver is away: {:?}", status.apiserver);
    let local = pb::Endpoint {
        id: 2,
        interface: "lxc2".to_owned(),
        ips: vec!["10.214.7.2".to_owned()],
        identity: 2000,
        labels: Vec::new(),
        pod_name: String::new(),
        pod_namespace: String::new(),
        ..web.clone()
    };
    put_endpoint(&socket, local)
        .await
        .expect("the datapath does not wait for the apiserver");
    let (_, server) = tokio::task::block_in_place(|| apiserver(&etcd, addr));
    eventually_async(
        "the agent to reconnect",
        || agent_status(&socket),
        |s| {
            s.apiserver
                .as_ref()
                .is_some_and(|a| a.connected && a.sessions >= 2)
        },
    )
    .await;
    agent.stop(Duration::from_secs(5));
    server.shutdown_background();
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs real etcd and openssl: `cargo xtask test` runs it"]
async fn over_mtls_the_agent_publishes_only_as_its_certificates_cn() {
    use meshwork_lab::etcd::EtcdTls;
    use tonic::transport::{Certificate, Identity, ServerTlsConfig};

    let etcd = EtcdServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tls = EtcdTls::create(&dir.path().join("tls")).unwrap();
    let server = tls.server();
    let read = |path: &Path| std::fs::read(path).unwrap();
    let config = ServerTlsConfig::new()
        .identity(Identity::from_pem(
            read(&server.cert_file),
            read(&server.key_file),
        ))
        .client_ca_root(Certificate::from_pem(read(&tls.ca_file)));
    let (addr, apiserver) = tokio::task::block_in_place(|| {
        apiserver_with_tls(&etcd, "127.0.0.1:0".parse().unwrap(), Some(config))
    });
    let n1 = tls.issue_client("n1").unwrap();
    let start = |node: &str| {
        let options = AgentOptions::new(
            Path::new(env!("CARGO_BIN_EXE_meshwork-agent")),
            "c1",
            1,
            &dir.path().join(node),
        )
        .flags([
            "--apiserver-addr".to_owned(),
            addr.to_string(),
            "--apiserver-ca-file".to_owned(),
            tls.ca_file.display().to_string(),
            "--apiserver-cert-file".to_owned(),
            n1.cert_file.display().to_string(),
            "--apiserver-key-file".to_owned(),
            n1.key_file.display().to_string(),
            "--node-name".to_owned(),
            node.to_owned(),
        ]);
        AgentProcess::start(&options).unwrap()
    };
    let mut as_itself = start("n1");
    let socket = as_itself.socket().to_owned();
    wait_published(&socket, "n1 to publish over mTLS").await;
    // The negative control: n1's certificate cannot publish n2.
    let mut as_another = start("n2");
    let socket = as_another.socket().to_owned();
    let status = eventually_async(
        "n2 to be refused",
        || agent_status(&socket),
        |s| s.apiserver.as_ref().is_some_and(|a| a.last_error.is_some()),
    )
    .await;
    let apiserver_status = status.apiserver.unwrap();
    assert!(!apiserver_status.connected);
    assert!(
        apiserver_status
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("may not publish node \"n2\"")),
        "{apiserver_status:?}"
    );
    as_itself.stop(Duration::from_secs(5));
    as_another.stop(Duration::from_secs(5));
    apiserver.shutdown_background();
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs real etcd, network namespaces and wireguard-go: `cargo xtask test` runs it"]
async fn with_wireguard_on_the_node_is_published_with_the_devices_public_key() {
    use meshwork_proto::agent::v1::encrypt_client::EncryptClient;

    let etcd = EtcdServer::start().unwrap();
    let backend = common::connect(&etcd).await;
    let (addr, server) =
        tokio::task::block_in_place(|| apiserver(&etcd, "127.0.0.1:0".parse().unwrap()));
    let lab = LabNet::new().unwrap();
    let node = lab.netns("pub-wg").unwrap();
    // wireguard-go runs inside the node namespace, never in the root one.
    let dir = tempfile::tempdir().unwrap();
    let wrapper = meshwork_lab::wireguard::netns_wrapper(&node, dir.path()).unwrap();
    let device = meshwork_lab::wireguard::unique_device_name();
    let options = AgentOptions::new(
        Path::new(env!("CARGO_BIN_EXE_meshwork-agent")),
        "c1",
        1,
        &dir.path().join("state"),
    )
    .flags([
        "--enable-wireguard".to_owned(),
        format!("--wireguard-device={device}"),
        "--wireguard-userspace-fallback".to_owned(),
        format!("--wireguard-userspace-bin={}", wrapper.display()),
        format!("--apiserver-addr={addr}"),
        "--node-name=n1".to_owned(),
        "--node-ip=192.0.2.1".to_owned(),
    ]);
    let mut agent = AgentProcess::start(&options).unwrap();
    let socket = agent.socket().to_owned();
    let channel = connect_unix(&socket).await.unwrap();
    let device_key = EncryptClient::new(channel)
        .status(pb::EncryptStatusRequest {})
        .await
        .unwrap()
        .into_inner()
        .public_key;
    assert_eq!(device_key.len(), 44, "a base64 key: {device_key:?}");
    let published = eventually_async(
        "n1 in etcd",
        || backend.get("cilium/state/nodes/v1/c1/n1"),
        |got| matches!(got, Ok(Some(_))),
    )
    .await;
    let (value, _) = published.unwrap().unwrap();
    let value: serde_json::Value = serde_json::from_slice(&value).unwrap();
    assert_eq!(
        value["WireguardPubKey"], device_key,
        "the node carries its device's key: {value}"
    );
    agent.stop(Duration::from_secs(5));
    server.shutdown_background();
}

/// Entries of the pinned map `name` under `bpf`.
fn pinned(bpf: &BpfRoot, name: &str) -> usize {
    let pins = meshwork_datapath::maps::PinDir::under(bpf.path());
    meshwork_lab::bpffs::pinned_len(&pins.map(name)).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs real etcd, root, bpffs and network namespaces: `cargo xtask test` runs it"]
async fn the_clusters_services_come_back_from_the_apiserver_into_the_service_maps() {
    use meshwork_proto::apiserver::v1 as api;
    use meshwork_proto::apiserver::v1::export_client::ExportClient;

    let etcd = EtcdServer::start().unwrap();
    let (addr, server) =
        tokio::task::block_in_place(|| apiserver(&etcd, "127.0.0.1:0".parse().unwrap()));
    let lab = LabNet::new().unwrap();
    let node = lab.netns("pub-svc").unwrap();
    let pod = lab.netns("pub-svc-pod").unwrap();
    node.veth_to("lxc1", &pod, "eth0").unwrap();
    let bpf = BpfRoot::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let options = publishing_agent(dir.path(), &bpf, addr, "10.214.8.0/24");
    let mut agent = AgentProcess::start(&options).unwrap();
    let socket = agent.socket().to_owned();
    let web = pb::Endpoint {
        id: 1,
        interface: "lxc1".to_owned(),
        netns: node.path().display().to_string(),
        ips: vec!["10.214.8.1".to_owned()],
        allowed_identities: vec![2000],
        labels: vec!["k8s:app=web".to_owned()],
        pod_namespace: "default".to_owned(),
        pod_name: "web-1".to_owned(),
        ..pb::Endpoint::default()
    };
    put_endpoint(&socket, web)
        .await
        .unwrap_or_else(|err| panic!("{err:?}; log:\n{}", agent.log_tail()));
    // A service of this cluster only (not shared: no remote cluster ever reads it).
    let declare = |selector: &str| api::PutServiceRequest {
        service: Some(api::Service {
            namespace: "default".to_owned(),
            name: "web".to_owned(),
            frontends: vec!["10.214.250.9".to_owned()],
            ports: vec![api::NamedPort {
                name: "http".to_owned(),
                port: 80,
                protocol: "TCP".to_owned(),
            }],
            selector: vec![selector.to_owned()],
            shared: false,
        }),
    };
    let mut client = ExportClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    client.put_service(declare("k8s:app=web")).await.unwrap();
    let maps = || {
        (
            pinned(&bpf, "cilium_lb4_services_v2"),
            pinned(&bpf, "cilium_lb4_backends_v3"),
        )
    };
    Wait::new("the service's master, its slot and its backend in the maps")
        .timeout(Duration::from_secs(30))
        .until(maps, |m| *m == (2, 1))
        .unwrap_or_else(|err| panic!("{err}; log:\n{}", agent.log_tail()));
    // Its declaration now selects nothing: the slot and the backend go, the master stays
    // with no backends (a connect to it is refused).
    client.put_service(declare("k8s:app=none")).await.unwrap();
    Wait::new("the service without backends")
        .timeout(Duration::from_secs(30))
        .until(maps, |m| *m == (1, 0))
        .unwrap_or_else(|err| panic!("{err}; log:\n{}", agent.log_tail()));
    agent.stop(Duration::from_secs(5));
    server.shutdown_background();
}
