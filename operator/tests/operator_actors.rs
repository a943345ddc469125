//! The operator's actors end to end, in kvstore mode: moto as EC2, a real etcd holding the
//! CiliumNode keys, the node manager learning nodes from an etcd watch. Every version the
//! operator publishes is observed through a second watch and checked: no pool IP without its
//! ENI in status, and no empty pool published over a non-empty one.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use common::Lab;
use meshwork_kvstore::{EtcdBackend, EtcdConfig, WatchEvent, WatchStoreOptions};
use meshwork_lab::etcd::{EtcdOptions, EtcdServer};
use meshwork_lab::wait::Wait;
use meshwork_operator::cilium_node::{AllocationIp, CiliumNode, CiliumNodeSpec};
use meshwork_operator::instances::shared;
use meshwork_operator::manager::{
    self, GetNodes, InstancesConfig, LimitsCache, ManagerConfig, PassDeps, ReleaseConfig, watch,
};
use meshwork_operator::model::Tags;
use meshwork_operator::node_store::etcd::{decode, key};
use meshwork_operator::node_store::{EtcdStore, KEY_PREFIX};

const DEADLINE: Duration = Duration::from_secs(60);

/// What the observer saw of every published version.
#[derive(Debug, Default)]
struct Seen {
    versions: usize,
    violations: Vec<String>,
    /// Node → largest pool published so far.
    largest: BTreeMap<String, usize>,
}

/// Opens the observer's watch (before the operator starts, so it sees every version).
async fn observe(backend: &EtcdBackend) -> Arc<Mutex<Seen>> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let tally = Arc::clone(&seen);
    let mut watch = backend.watch(KEY_PREFIX, 0).await.expect("observer watch");
    tokio::spawn(async move {
        while let Ok(Some(events)) = watch.next().await {
            for event in events {
                let WatchEvent::Put {
                    key,
                    value,
                    mod_revision,
                } = event
                else {
                    continue;
                };
                let key = String::from_utf8(key).expect("UTF-8 key");
                let node = decode(&key, &value, mod_revision).expect("decodable");
                let name = node.metadata.name.clone().unwrap_or_default();
                let pool = node.spec.ipam.pool.len();
                let mut seen = tally.lock().unwrap_or_else(PoisonError::into_inner);
                seen.versions += 1;
                if !node.pool_ips_without_eni().is_empty() {
                    seen.violations
                        .push(format!("{name}: {:?}", node.pool_ips_without_eni()));
                }
                let largest = seen.largest.get(&name).copied().unwrap_or(0);
                if pool == 0 && largest > 0 {
                    seen.violations
                        .push(format!("{name}: empty pool published"));
                }
                seen.largest.insert(name, largest.max(pool));
            }
        }
    });
    seen
}

fn cilium_node(name: &str, instance: &str, instance_type: &str, lab: &Lab) -> CiliumNode {
    let mut spec = CiliumNodeSpec::default();
    spec.eni.instance_id = instance.to_owned();
    spec.eni.instance_type = instance_type.to_owned();
    spec.eni.first_interface_index = Some(1);
    spec.eni.vpc_id.clone_from(&lab.vpc);
    spec.eni.availability_zone = common::ZONE.to_owned();
    spec.ipam.pre_allocate = 8;
    CiliumNode::new(name, spec)
}

async fn put(backend: &EtcdBackend, node: &CiliumNode) {
    let mut node = node.clone();
    node.metadata.resource_version = None;
    let name = node.metadata.name.clone().expect("name");
    backend
        .put(&key(&name), serde_json::to_vec(&node).expect("json"))
        .await
        .expect("put");
}

async fn get(backend: &EtcdBackend, name: &str) -> Option<CiliumNode> {
    let key = key(name);
    let stored = backend.get(&key).await.expect("get");
    stored.map(|(value, revision)| decode(&key, &value, revision).expect("decode"))
}

/// A wait of at most [`DEADLINE`], looking every `every`.
fn wait(what: impl Into<String>, every: Duration) -> Wait {
    Wait::new(what).timeout(DEADLINE).every(every)
}

/// Waits (polling the store, with a deadline) until `check` holds for the node.
async fn wait_for(
    backend: &EtcdBackend,
    name: &str,
    what: &str,
    check: impl Fn(&CiliumNode) -> bool,
) -> CiliumNode {
    wait(format!("{name}: {what}"), Duration::from_millis(100))
        .until_async(
            || get(backend, name),
            |node| node.as_ref().is_some_and(&check),
        )
        .await
        .unwrap_or_else(|err| panic!("{err}"))
        .expect("checked present")
}

fn eni_count(node: &CiliumNode) -> usize {
    node.status
        .as_ref()
        .map_or(0, |status| status.eni.enis.len())
}

struct Running {
    lab: Lab,
    _etcd: EtcdServer,
    client: EtcdBackend,
    operator: manager::Operator<EtcdStore>,
    seen: Arc<Mutex<Seen>>,
}

async fn start(instances: InstancesConfig, config: ManagerConfig) -> Running {
    start_in("10.213.0.0/24", instances, config).await
}

async fn start_in(subnet: &str, instances: InstancesConfig, config: ManagerConfig) -> Running {
    let lab = Lab::start(subnet).await;
    let etcd = EtcdServer::start_with(EtcdOptions {
        data_in_memory: true,
        ..EtcdOptions::default()
    })
    .expect("etcd");
    let client = EtcdBackend::connect(&EtcdConfig::new([etcd.endpoint()]), Duration::from_secs(10))
        .await
        .expect("connect");
    let seen = observe(&client).await;
    let deps = PassDeps {
        ec2: lab.ec2.clone(),
        cache: shared(),
        limits: Arc::new(LimitsCache::default()),
        store: EtcdStore::new(client.clone()),
        release: ReleaseConfig::default(),
    };
    let operator = manager::start(deps, &config, instances);
    tokio::spawn(watch::watch_etcd(
        client.clone(),
        operator.nodes.clone().recipient(),
        WatchStoreOptions::new("lab"),
    ));
    Running {
        lab,
        _etcd: etcd,
        client,
        operator,
        seen,
    }
}

fn assert_clean(seen: &Arc<Mutex<Seen>>) {
    let seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
    assert!(seen.versions > 0);
    assert!(seen.violations.is_empty(), "{:?}", seen.violations);
}

/// The NodeIpam service streams node-a's published snapshot: every pool IP's ENI included.
async fn check_grpc(run: &Running) {
    use meshwork_operator::grpc::NodeIpamService;
    use meshwork_proto::ipam::v1::WatchNodeRequest;
    use meshwork_proto::ipam::v1::node_ipam_client::NodeIpamClient;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let store = EtcdStore::new(run.client.clone());
    let service = NodeIpamService::new(&run.operator.nodes, store, run.lab.ec2.clone());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service.into_server())
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let mut client = NodeIpamClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    let mut stream = client
        .watch_node(WatchNodeRequest {
            node: "node-a".to_owned(),
        })
        .await
        .expect("node-a")
        .into_inner();
    // Published already: the first snapshot comes at once.
    let snapshot = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("at once")
        .expect("a stream")
        .expect("a snapshot");
    assert_eq!(snapshot.pool.len(), 8);
    let enis: BTreeSet<&str> = snapshot.enis.iter().map(|e| e.id.as_str()).collect();
    assert!(
        snapshot
            .pool
            .iter()
            .all(|ip| enis.contains(ip.resource.as_str())),
        "{snapshot:?}"
    );
    assert!(!snapshot.generation.is_empty());
    let missing = client
        .watch_node(WatchNodeRequest {
            node: "nope".to_owned(),
        })
        .await
        .expect_err("unknown node");
    assert_eq!(missing.code(), tonic::Code::NotFound);
}

#[actix_rt::test]
#[ignore = "needs the patched moto server and real etcd: `cargo xtask test` runs it"]
async fn nodes_are_learnt_from_etcd_allocated_and_dropped_on_delete() {
    let run = start(InstancesConfig::default(), ManagerConfig::default()).await;
    let (lab, client) = (&run.lab, &run.client);
    let first = lab.instance("m5.large").await;
    let second = lab.instance("m5.large").await;
    put(client, &cilium_node("node-a", &first, "m5.large", lab)).await;
    put(client, &cilium_node("node-b", &second, "m5.large", lab)).await;

    for name in ["node-a", "node-b"] {
        let node = wait_for(client, name, "a pool of 8", |n| n.spec.ipam.pool.len() == 8).await;
        assert_eq!(eni_count(&node), 2, "eth0 and one new ENI");
    }

    check_grpc(&run).await;

    // The agent of node-a uses 7: pre-allocate 8 brings the pool to 15.
    let mut node_a = get(client, "node-a").await.expect("node-a");
    let used: BTreeMap<String, AllocationIp> = node_a
        .spec
        .ipam
        .pool
        .keys()
        .take(7)
        .map(|ip| {
            (
                ip.clone(),
                AllocationIp {
                    owner: "pod".to_owned(),
                    resource: String::new(),
                },
            )
        })
        .collect();
    node_a.status.get_or_insert_default().ipam.used = used;
    put(client, &node_a).await;
    wait_for(client, "node-a", "a pool of 15", |n| {
        n.spec.ipam.pool.len() == 15
    })
    .await;

    // node-b goes: its allocator stops, and nothing of it is released.
    lab.clear_calls();
    assert!(client.delete(&key("node-b")).await.expect("delete"));
    let nodes = &run.operator.nodes;
    wait("node-b no longer driven", Duration::from_millis(50))
        .until_async(
            || async move { nodes.send(GetNodes).await.expect("nodes") },
            |names| *names == ["node-a"],
        )
        .await
        .unwrap_or_else(|err| panic!("{err}"));
    for action in [
        "UnassignPrivateIpAddresses",
        "DetachNetworkInterface",
        "DeleteNetworkInterface",
    ] {
        assert_eq!(lab.call_count(action), 0, "{action} after deleting node-b");
    }
    assert!(get(client, "node-b").await.is_none(), "not recreated");
    let enis = lab.cache().await.enis(&second).count();
    assert_eq!(enis, 2, "node-b's ENIs are left to its instance");
    assert_clean(&run.seen);
}

#[actix_rt::test]
#[ignore = "needs the patched moto server and real etcd: `cargo xtask test` runs it"]
async fn allocation_converges_through_ec2_faults_without_leaks() {
    let run = start(InstancesConfig::default(), ManagerConfig::default()).await;
    let (lab, client) = (&run.lab, &run.client);
    let instances: Vec<String> =
        futures::future::join_all((0..3).map(|_| lab.instance("m5.large"))).await;
    // Throttling, 500s and a slow answer beyond what the SDK's retries absorb in one go.
    lab.moto
        .set_faults(
            r#"{"rules":[
                {"action":"CreateNetworkInterface","error":"RequestLimitExceeded","status":503,"count":4},
                {"action":"AttachNetworkInterface","error":"InternalError","status":500,"count":4},
                {"action":"DescribeNetworkInterfaces","error":"Unavailable","status":503,"count":2},
                {"action":"ModifyNetworkInterfaceAttribute","delay_ms":300,"count":2}
            ]}"#,
        )
        .expect("faults");
    for (index, instance) in instances.iter().enumerate() {
        put(
            client,
            &cilium_node(&format!("node-{index}"), instance, "m5.large", lab),
        )
        .await;
    }
    for index in 0..3 {
        let node = wait_for(client, &format!("node-{index}"), "a pool of 8", |n| {
            n.spec.ipam.pool.len() == 8
        })
        .await;
        assert_eq!(eni_count(&node), 2);
    }
    let described = lab.cache().await;
    assert!(
        described.unattached().is_empty(),
        "no ENI leaked: {:?}",
        described.unattached()
    );
    for instance in &instances {
        assert_eq!(
            described.enis(instance).count(),
            2,
            "one ENI each, no extras"
        );
    }
    assert_clean(&run.seen);
}

#[actix_rt::test]
#[ignore = "needs the patched moto server and real etcd: `cargo xtask test` runs it"]
async fn leaked_enis_carrying_the_eni_tags_are_collected() {
    let tags: Tags = [("meshwork.io/cluster".to_owned(), "c1".to_owned())].into();
    let instances = InstancesConfig {
        interval: Duration::from_millis(300),
        gc_interval: Duration::ZERO,
        ..InstancesConfig::default()
    };
    let config = ManagerConfig {
        eni_tags: tags,
        ..ManagerConfig::default()
    };
    let run = start(instances, config).await;
    let lab = &run.lab;
    let foreign = lab.foreign_eni(0).await;
    let leaked = lab.foreign_eni(0).await;
    lab.tag(&leaked, "meshwork.io/cluster", "c1").await;
    let unattached = || async move {
        lab.cache()
            .await
            .unattached()
            .iter()
            .map(|e| e.id.clone())
            .collect::<BTreeSet<String>>()
    };
    let ids = wait("the leaked ENI collected", Duration::from_millis(200))
        .until_async(unattached, |ids| !ids.contains(&leaked))
        .await
        .unwrap_or_else(|err| panic!("{err}"));
    assert!(
        ids.contains(&foreign),
        "an ENI without our tags is never collected"
    );
    drop(run.operator);
}

#[actix_rt::test]
#[ignore = "needs the patched moto server and real etcd: `cargo xtask test` runs it"]
async fn an_exhausted_subnet_is_published_as_an_error_and_not_retried_in_a_loop() {
    let instances = InstancesConfig {
        interval: Duration::from_millis(300),
        ..InstancesConfig::default()
    };
    // A /28: 11 usable addresses, the instance's primary takes one.
    let run = start_in("10.213.0.0/28", instances, ManagerConfig::default()).await;
    let (lab, client) = (&run.lab, &run.client);
    let instance = lab.instance("m5.large").await;
    let mut node = cilium_node("node-a", &instance, "m5.large", lab);
    node.spec.eni.first_interface_index = Some(0);
    node.spec.ipam.min_allocate = 20;
    put(client, &node).await;

    let published = wait_for(client, "node-a", "an operator error", |n| {
        n.status
            .as_ref()
            .is_some_and(|s| !s.ipam.operator_status.error.is_empty())
    })
    .await;
    let error = published.status.expect("status").ipam.operator_status.error;
    assert!(error.contains("is exhausted"), "{error}");
    assert_eq!(
        published.spec.ipam.pool.len(),
        9,
        "what fitted on eth0 is published"
    );

    // Several resyncs later (each one wakes every node), EC2 saw no further attempt.
    let mutations = |lab: &Lab| {
        ["AssignPrivateIpAddresses", "CreateNetworkInterface"]
            .iter()
            .map(|action| lab.call_count(action))
            .sum::<u64>()
    };
    let before = mutations(lab);
    let resyncs = lab.call_count("DescribeNetworkInterfaces");
    // Async, so the operator's actors on this thread keep running meanwhile.
    wait("three resyncs", Duration::from_millis(100))
        .until_async(
            || async move { lab.call_count("DescribeNetworkInterfaces") },
            |described| *described >= resyncs + 3,
        )
        .await
        .unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(
        mutations(lab),
        before,
        "no retry loop on an exhausted subnet"
    );
    assert_clean(&run.seen);
}
