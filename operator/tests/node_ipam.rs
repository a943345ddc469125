//! The `meshwork.ipam.v1.NodeIpam` service end to end, in kvstore mode: moto as EC2, a real
//! etcd holding the CiliumNodes, the operator's actors learning nodes from an etcd watch, and
//! the service on 127.0.0.1 with a real gRPC client. A node registered through the service is
//! allocated for; its watchers get the first snapshot and every newer generation, each one
//! naming only ENIs it carries; its reports land in `status.ipam.used` and drive the release
//! handshake; bad requests get their code and write nothing.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use common::Lab;
use meshwork_kvstore::{EtcdBackend, EtcdConfig, WatchStoreOptions};
use meshwork_lab::etcd::{EtcdOptions, EtcdServer};
use meshwork_operator::cilium_node::CiliumNode;
use meshwork_operator::grpc::NodeIpamService;
use meshwork_operator::instances::shared;
use meshwork_operator::manager::{
    self, InstancesConfig, LimitsCache, ManagerConfig, PassDeps, ReleaseConfig, watch,
};
use meshwork_operator::node_allocator::release::{
    DO_NOT_RELEASE, MARKED_FOR_RELEASE, READY_FOR_RELEASE, RELEASED,
};
use meshwork_operator::node_store::EtcdStore;
use meshwork_operator::node_store::etcd::{decode, key};
use meshwork_proto::ipam::v1::node_ipam_client::NodeIpamClient;
use meshwork_proto::ipam::v1::{
    NodeSnapshot, RegisterNodeRequest, ReportUsageRequest, UsedIp, WatchNodeRequest,
};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic::{Code, Streaming};

const DEADLINE: Duration = Duration::from_secs(60);

struct Running {
    lab: Lab,
    _etcd: EtcdServer,
    etcd: EtcdBackend,
    client: NodeIpamClient<Channel>,
    _operator: manager::Operator<EtcdStore>,
    stop: CancellationToken,
    server: Option<tokio::task::JoinHandle<Result<(), tonic::transport::Error>>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Moto, etcd, the operator's actors and the service on a free port of 127.0.0.1.
async fn start(release: ReleaseConfig) -> Running {
    let lab = Lab::start("10.213.0.0/24").await;
    let etcd_server = EtcdServer::start_with(EtcdOptions {
        data_in_memory: true,
        ..EtcdOptions::default()
    })
    .expect("etcd");
    let etcd = EtcdBackend::connect(
        &EtcdConfig::new([etcd_server.endpoint()]),
        Duration::from_secs(10),
    )
    .await
    .expect("connect");
    let store = EtcdStore::new(etcd.clone());
    let deps = PassDeps {
        ec2: lab.ec2.clone(),
        cache: shared(),
        limits: Arc::new(LimitsCache::default()),
        store: store.clone(),
        release,
    };
    let operator = manager::start(deps, &ManagerConfig::default(), InstancesConfig::default());
    tokio::spawn(watch::watch_etcd(
        etcd.clone(),
        operator.nodes.clone().recipient(),
        WatchStoreOptions::new("lab"),
    ));
    let stop = CancellationToken::new();
    let service =
        NodeIpamService::new(&operator.nodes, store, lab.ec2.clone()).stop_on(stop.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service.into_server())
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                stop.clone().cancelled_owned(),
            ),
    );
    let client = NodeIpamClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    Running {
        lab,
        _etcd: etcd_server,
        etcd,
        client,
        _operator: operator,
        stop,
        server: Some(server),
    }
}

/// Registers `node` for `instance` of `instance_type`: ENIs from device 1, pre-allocate `pre`.
fn registration(node: &str, instance: &str, instance_type: &str, pre: i32) -> RegisterNodeRequest {
    RegisterNodeRequest {
        node: node.to_owned(),
        instance_id: instance.to_owned(),
        instance_type: instance_type.to_owned(),
        first_interface_index: Some(1),
        pre_allocate: Some(pre),
        ..RegisterNodeRequest::default()
    }
}

/// The stored object, read straight from etcd.
async fn stored(etcd: &EtcdBackend, name: &str) -> Option<CiliumNode> {
    let key = key(name);
    let value = etcd.get(&key).await.expect("get");
    value.map(|(value, revision)| decode(&key, &value, revision).expect("decode"))
}

/// A node's snapshot stream, and every snapshot it delivered.
struct Watcher {
    stream: Streaming<NodeSnapshot>,
    seen: Vec<NodeSnapshot>,
}

impl Watcher {
    async fn open(client: &mut NodeIpamClient<Channel>, node: &str) -> Self {
        let stream = client
            .watch_node(WatchNodeRequest {
                node: node.to_owned(),
            })
            .await
            .expect("WatchNode")
            .into_inner();
        Self {
            stream,
            seen: Vec::new(),
        }
    }

    /// The next snapshot, within `within`.
    async fn next_within(&mut self, within: Duration) -> NodeSnapshot {
        let snapshot = tokio::time::timeout(within, self.stream.message())
            .await
            .unwrap_or_else(|_| panic!("no snapshot within {within:?}"))
            .expect("the stream failed")
            .expect("the stream ended");
        self.seen.push(snapshot.clone());
        snapshot
    }

    /// Reads snapshots until one satisfies `check`, within [`DEADLINE`] in all.
    async fn until(&mut self, what: &str, check: impl Fn(&NodeSnapshot) -> bool) -> NodeSnapshot {
        let wait = async {
            loop {
                let snapshot = self.next_within(DEADLINE).await;
                if check(&snapshot) {
                    return snapshot;
                }
            }
        };
        tokio::time::timeout(DEADLINE, wait)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{what}: not within {DEADLINE:?}; last seen {:?}",
                    self.seen.last()
                )
            })
    }

    /// Every snapshot seen whose pool names an ENI the snapshot does not carry.
    fn inconsistent(&self) -> Vec<String> {
        self.seen
            .iter()
            .filter_map(|snapshot| {
                let enis: BTreeSet<&str> = snapshot.enis.iter().map(|e| e.id.as_str()).collect();
                let missing: Vec<&str> = snapshot
                    .pool
                    .iter()
                    .filter(|ip| !enis.contains(ip.resource.as_str()))
                    .map(|ip| ip.ip.as_str())
                    .collect();
                (!missing.is_empty())
                    .then(|| format!("generation {}: {missing:?}", snapshot.generation))
            })
            .collect()
    }
}

fn used(ips: &[&str], owner: &str) -> Vec<UsedIp> {
    ips.iter()
        .map(|ip| UsedIp {
            ip: (*ip).to_owned(),
            owner: owner.to_owned(),
            resource: String::new(),
        })
        .collect()
}

#[actix_rt::test]
#[ignore = "needs the patched moto server and real etcd: `cargo xtask test` runs it"]
async fn watchers_get_the_first_snapshot_then_each_generation_every_one_naming_its_enis() {
    let mut run = Box::pin(start(ReleaseConfig::default())).await;
    let instance = run.lab.instance("m5.xlarge").await;
    let created = run
        .client
        .register_node(registration("node-a", &instance, "m5.xlarge", 8))
        .await
        .expect("RegisterNode")
        .into_inner();
    assert!(created.created);
    // Registered means driven: the watch is accepted at once, before anything is published.
    let mut watcher = Watcher::open(&mut run.client, "node-a").await;
    let first = watcher.until("a pool of 8", |s| s.pool.len() == 8).await;
    assert_eq!(first.enis.len(), 2, "eth0 and one new ENI");
    assert_eq!(first.pre_allocate, 8);

    // A late watcher gets the latest snapshot at once.
    let mut late = Watcher::open(&mut run.client, "node-a").await;
    let at_once = late.next_within(Duration::from_secs(5)).await;
    assert_eq!(at_once.generation, first.generation);

    // More allocation attaches a second and a third ENI (m5.xlarge: 14 addresses each from
    // device 1); each published generation reaches the watcher.
    let mut generations = vec![first.generation.clone()];
    for (pre, pool, enis) in [(20, 20, 3), (35, 35, 4)] {
        run.client
            .register_node(registration("node-a", &instance, "m5.xlarge", pre))
            .await
            .expect("RegisterNode");
        let grown = watcher
            .until(&format!("a pool of {pool}"), |s| s.pool.len() == pool)
            .await;
        assert_eq!(grown.enis.len(), enis, "{grown:?}");
        assert_eq!(grown.pre_allocate, pre);
        generations.push(grown.generation.clone());
    }
    let distinct: BTreeSet<&String> = generations.iter().collect();
    assert_eq!(distinct.len(), generations.len(), "{generations:?}");
    assert!(watcher.seen.len() >= 3, "{} snapshots", watcher.seen.len());
    assert!(
        watcher.inconsistent().is_empty(),
        "{:?}",
        watcher.inconsistent()
    );
    // Generations only move forward (etcd revisions).
    let numbers: Vec<u64> = watcher
        .seen
        .iter()
        .map(|s| s.generation.parse().expect("a revision"))
        .collect();
    assert!(numbers.windows(2).all(|w| w[0] < w[1]), "{numbers:?}");

    // Shutting down ends the open watches with UNAVAILABLE, so the server's graceful stop
    // does not wait on them.
    run.stop.cancel();
    for open in [&mut watcher, &mut late] {
        // The late watcher has not read what came after its first snapshot.
        let end = async {
            loop {
                match open.stream.message().await {
                    Ok(Some(_)) => {}
                    Ok(None) => panic!("ended without a status"),
                    Err(status) => return status,
                }
            }
        };
        let status = tokio::time::timeout(Duration::from_secs(5), end)
            .await
            .expect("the watch ended at once");
        assert_eq!(status.code(), Code::Unavailable, "{status}");
        assert!(status.message().contains("shutting down"), "{status}");
    }
    let server = run.server.take().expect("the server task");
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("the server stopped at once")
        .expect("joined")
        .expect("served");
}

#[actix_rt::test]
#[ignore = "needs the patched moto server and real etcd: `cargo xtask test` runs it"]
async fn reports_write_the_usage_and_drive_the_release_handshake() {
    let mut run = Box::pin(start(ReleaseConfig {
        enabled: true,
        delay: Duration::ZERO,
    }))
    .await;
    let instance = run.lab.instance("m5.large").await;
    run.client
        .register_node(registration("node-a", &instance, "m5.large", 8))
        .await
        .expect("RegisterNode");
    let mut watcher = Watcher::open(&mut run.client, "node-a").await;
    let first = watcher.until("a pool of 8", |s| s.pool.len() == 8).await;
    let pool: Vec<String> = first.pool.iter().map(|ip| ip.ip.clone()).collect();
    let router = pool[0].clone();

    let reported = run
        .client
        .report_usage(ReportUsageRequest {
            node: "node-a".to_owned(),
            generation: first.generation.clone(),
            used: used(&[&router], "router"),
            release_answers: Default::default(),
        })
        .await
        .expect("ReportUsage")
        .into_inner();
    let node = stored(&run.etcd, "node-a").await.expect("stored");
    assert_eq!(
        node.metadata.resource_version.as_deref(),
        Some(reported.generation.as_str())
    );
    let status = node.status.expect("status");
    assert_eq!(status.ipam.used.keys().collect::<Vec<_>>(), [&router]);
    assert_eq!(status.ipam.used[&router].owner, "router");

    // Pre-allocate 2 with 1 used: 8 − 1 − 2 = 5 addresses in excess, marked for release.
    run.client
        .register_node(registration("node-a", &instance, "m5.large", 2))
        .await
        .expect("RegisterNode");
    let marked = watcher
        .until("5 marked for release", |s| {
            s.release_ips
                .values()
                .filter(|v| *v == MARKED_FOR_RELEASE)
                .count()
                == 5
        })
        .await;
    assert!(!marked.release_ips.contains_key(&router), "a used IP stays");
    let mut answers: Vec<String> = marked.release_ips.keys().cloned().collect();
    answers.sort();
    let kept = answers.remove(0);
    assert_eq!(
        run.lab.call_count("UnassignPrivateIpAddresses"),
        0,
        "nothing released before the agent answers"
    );

    // The agent hands one out meanwhile (do-not-release) and lets the others go.
    let mut release_answers: BTreeMap<String, String> = answers
        .iter()
        .map(|ip| (ip.clone(), READY_FOR_RELEASE.to_owned()))
        .collect();
    release_answers.insert(kept.clone(), DO_NOT_RELEASE.to_owned());
    let answered = run
        .client
        .report_usage(ReportUsageRequest {
            node: "node-a".to_owned(),
            generation: marked.generation.clone(),
            used: used(&[&router, &kept], "default/pod"),
            release_answers: release_answers.into_iter().collect(),
        })
        .await
        .expect("ReportUsage")
        .into_inner();
    assert_eq!(answered.answers_applied, 5);

    let released = watcher
        .until("4 released and gone from the pool", |s| {
            s.release_ips.values().filter(|v| *v == RELEASED).count() == 4
                && answers.iter().all(|ip| s.pool.iter().all(|p| &p.ip != ip))
        })
        .await;
    assert!(
        released.pool.iter().any(|ip| ip.ip == kept),
        "the refused address stays in the pool"
    );
    assert!(
        !released.release_ips.contains_key(&kept),
        "and left the handshake"
    );
    let on_ec2: BTreeSet<String> = run
        .lab
        .cache()
        .await
        .enis(&instance)
        .flat_map(|eni| eni.addresses.iter().map(ToString::to_string))
        .collect();
    assert!(
        on_ec2.contains(&kept) && on_ec2.contains(&router),
        "{on_ec2:?}"
    );
    assert!(answers.iter().all(|ip| !on_ec2.contains(ip)), "{on_ec2:?}");

    // The next report acknowledges the released addresses: the handshake is over.
    run.client
        .report_usage(ReportUsageRequest {
            node: "node-a".to_owned(),
            generation: released.generation.clone(),
            used: used(&[&router, &kept], "default/pod"),
            release_answers: Default::default(),
        })
        .await
        .expect("ReportUsage");
    let done = watcher
        .until("no release entry left", |s| s.release_ips.is_empty())
        .await;
    assert_eq!(done.pool.len(), 4, "8 − 4 released");
    let node = stored(&run.etcd, "node-a").await.expect("stored");
    let status = node.status.expect("status");
    assert!(
        status.ipam.release_ips.is_empty(),
        "{:?}",
        status.ipam.release_ips
    );
    assert_eq!(status.ipam.used.len(), 2);
    assert!(
        watcher.inconsistent().is_empty(),
        "{:?}",
        watcher.inconsistent()
    );
}

#[actix_rt::test]
#[ignore = "needs the patched moto server and real etcd: `cargo xtask test` runs it"]
async fn bad_requests_get_their_code_and_write_nothing() {
    let mut run = Box::pin(start(ReleaseConfig::default())).await;
    let instance = run.lab.instance("m5.large").await;
    run.client
        .register_node(registration("node-a", &instance, "m5.large", 8))
        .await
        .expect("RegisterNode");
    let mut watcher = Watcher::open(&mut run.client, "node-a").await;
    let published = watcher.until("a pool of 8", |s| s.pool.len() == 8).await;
    let before = stored(&run.etcd, "node-a").await.expect("stored");
    assert_eq!(
        before.metadata.resource_version.as_deref(),
        Some(published.generation.as_str())
    );
    let pool_ip = published.pool[0].ip.clone();
    let report = |node: &str, generation: &str, used_ips: &[&str], answers: &[(&str, &str)]| {
        ReportUsageRequest {
            node: node.to_owned(),
            generation: generation.to_owned(),
            used: used(used_ips, "default/pod"),
            release_answers: answers
                .iter()
                .map(|(ip, answer)| ((*ip).to_owned(), (*answer).to_owned()))
                .collect(),
        }
    };
    let generation = published.generation.as_str();
    let cases = [
        (
            "unknown node",
            report("node-b", generation, &[], &[]),
            Code::NotFound,
        ),
        (
            "malformed node",
            report("Node_A", generation, &[], &[]),
            Code::InvalidArgument,
        ),
        (
            "a used IP not in the pool",
            report("node-a", generation, &[&pool_ip, "10.213.0.250"], &[]),
            Code::InvalidArgument,
        ),
        (
            "a malformed used IP",
            report("node-a", generation, &["10.213.0"], &[]),
            Code::InvalidArgument,
        ),
        (
            "a bad answer",
            report("node-a", generation, &[&pool_ip], &[(&pool_ip, "maybe")]),
            Code::InvalidArgument,
        ),
        (
            "a generation never published",
            report("node-a", "1", &[&pool_ip], &[]),
            Code::FailedPrecondition,
        ),
    ];
    for (what, request, code) in cases {
        let status = run.client.report_usage(request).await.expect_err(what);
        assert_eq!(status.code(), code, "{what}: {status}");
        if code == Code::FailedPrecondition {
            assert!(
                status.message().contains(&format!("{generation:?}")),
                "names the latest: {status}"
            );
        }
    }
    for (what, node, code) in [
        ("unknown node", "node-b", Code::NotFound),
        ("malformed node", "Node_A", Code::InvalidArgument),
    ] {
        let status = run
            .client
            .watch_node(WatchNodeRequest {
                node: node.to_owned(),
            })
            .await
            .expect_err(what);
        assert_eq!(status.code(), code, "WatchNode, {what}: {status}");
    }
    let negative = registration("node-a", &instance, "m5.large", -1);
    let mut above = registration("node-a", &instance, "m5.large", 8);
    above.min_allocate = 9;
    above.max_allocate = 4;
    let mut no_instance = registration("node-a", "", "m5.large", 8);
    no_instance.instance_id.clear();
    for (what, request) in [
        ("a negative pre-allocate", negative),
        ("min above max", above),
        ("no instance", no_instance),
    ] {
        let status = run.client.register_node(request).await.expect_err(what);
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status}");
    }
    let after = stored(&run.etcd, "node-a").await.expect("stored");
    assert_eq!(after, before, "nothing was written");
    assert!(
        stored(&run.etcd, "node-b").await.is_none(),
        "nothing created"
    );
}

#[actix_rt::test]
#[ignore = "needs the patched moto server and real etcd: `cargo xtask test` runs it"]
async fn registering_creates_the_node_then_updates_only_what_changed() {
    let mut run = Box::pin(start(ReleaseConfig::default())).await;
    let instance = run.lab.instance("m5.large").await;
    let mut request = registration("node-a", &instance, "m5.large", 8);
    request.pre_allocate = None;
    request.subnet_ids = vec![run.lab.subnet.clone()];
    request.security_groups = vec![run.lab.security_group.clone()];
    request.subnet_tags = [("tier".to_owned(), "pods".to_owned())].into();
    request.exclude_interface_tags = [("no-pods".to_owned(), "true".to_owned())].into();
    let created = run
        .client
        .register_node(request.clone())
        .await
        .expect("RegisterNode")
        .into_inner();
    assert!(created.created);
    let node = stored(&run.etcd, "node-a").await.expect("created");
    assert_eq!(
        node.metadata.resource_version.as_deref(),
        Some(created.generation.as_str())
    );
    let eni = &node.spec.eni;
    assert_eq!(
        (eni.instance_id.as_str(), eni.instance_type.as_str()),
        (instance.as_str(), "m5.large")
    );
    assert_eq!(eni.first_interface_index, Some(1));
    assert_eq!(eni.subnet_ids, [run.lab.subnet.clone()]);
    assert_eq!(eni.security_groups, [run.lab.security_group.clone()]);
    assert_eq!(eni.subnet_tags["tier"], "pods");
    assert_eq!(eni.exclude_interface_tags["no-pods"], "true");
    assert_eq!(node.spec.ipam.pre_allocate, 8, "Cilium's default");

    // Driven at once: allocated for, published.
    let mut watcher = Watcher::open(&mut run.client, "node-a").await;
    let published = watcher.until("a pool of 8", |s| s.pool.len() == 8).await;
    let before = stored(&run.etcd, "node-a").await.expect("stored");
    let generation = before
        .metadata
        .resource_version
        .clone()
        .expect("a revision");

    let again = run
        .client
        .register_node(request.clone())
        .await
        .expect("RegisterNode again")
        .into_inner();
    assert!(!again.created);
    assert_eq!(again.generation, generation, "nothing written");
    let unchanged = stored(&run.etcd, "node-a").await.expect("stored");
    assert_eq!(unchanged, before);

    let mut more = request;
    more.pre_allocate = Some(10);
    let changed = run
        .client
        .register_node(more)
        .await
        .expect("RegisterNode with a change")
        .into_inner();
    assert!(!changed.created);
    assert_ne!(changed.generation, generation);
    assert_eq!(published.pool.len(), 8);
    let grown = watcher.until("a pool of 10", |s| s.pool.len() == 10).await;
    assert_eq!(grown.pre_allocate, 10);
    let node = stored(&run.etcd, "node-a").await.expect("stored");
    assert_eq!(
        node.spec.ipam.pool.len(),
        10,
        "the operator's pool kept and grown"
    );

    // Without an instance type the operator asks EC2 for it.
    let second = run.lab.instance("m5.large").await;
    let untyped = registration("node-b", &second, "", 8);
    run.client
        .register_node(untyped)
        .await
        .expect("RegisterNode without a type");
    let node = stored(&run.etcd, "node-b").await.expect("created");
    assert_eq!(node.spec.eni.instance_type, "m5.large");
    let unknown = run
        .client
        .register_node(registration("node-c", "i-00000000deadbeef0", "", 8))
        .await
        .expect_err("an instance EC2 does not know");
    assert_eq!(unknown.code(), Code::InvalidArgument, "{unknown}");
    assert!(stored(&run.etcd, "node-c").await.is_none());
}
