//! The endpoint manager's restore path against real BPF programs attached in lab network
//! namespaces and the real barrier actor: restored endpoints wait (bounded) for remote
//! clusters, an endpoint deleted during the wait aborts only itself, and with IPsec the host
//! endpoint regenerates at once while the wait is capped.

mod common;

use std::time::{Duration, Instant};

use actix::Addr;
use common::{Mesh, Options};
use meshwork_agent::datapath::endpoint_manager::{DeleteEndpoint, EndpointManager, ListEndpoints};
use meshwork_datapath::endpoint::{EndpointSpec, EndpointState, EndpointStore};
use meshwork_lab::bpffs::BpfRoot;
use meshwork_lab::net::{LabNet, Netns};
use meshwork_lab::wait::Wait;

struct Fixture {
    _lab: LabNet,
    node: Netns,
    _pods: Vec<Netns>,
    root: BpfRoot,
    state: tempfile::TempDir,
}

/// A node namespace with `count` pod veths (`lxc1`, `lxc2`, …), nothing attached yet.
fn fixture(count: u64) -> Fixture {
    let lab = LabNet::new().unwrap();
    let node = lab.netns("epm-node").unwrap();
    let mut pods = Vec::new();
    for i in 1..=count {
        let pod = lab.netns(&format!("epm-pod{i}")).unwrap();
        node.veth_to(&format!("lxc{i}"), &pod, "eth0").unwrap();
        pods.push(pod);
    }
    Fixture {
        _lab: lab,
        node,
        _pods: pods,
        root: BpfRoot::new().unwrap(),
        state: tempfile::tempdir().unwrap(),
    }
}

fn spec(f: &Fixture, id: u64, host: bool) -> EndpointSpec {
    EndpointSpec {
        id,
        interface: format!("lxc{id}"),
        netns: Some(f.node.path().to_owned()),
        ips: vec![format!("10.214.7.{id}").parse().unwrap()],
        identity: 1000 + u32::try_from(id).unwrap(),
        allowed_identities: vec![2000],
        host,
        labels: Vec::new(),
        pod: None,
    }
}

/// Starts the agent with its BPF datapath and one remote cluster that never syncs (its etcd
/// refuses connections).
async fn start(f: &Fixture, timeout: Duration, ipsec: bool) -> (Mesh, Addr<EndpointManager>) {
    let config = f.state.path().join("clustermesh");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("late"), "endpoints:\n- http://127.0.0.1:1\n").unwrap();
    let mut options = Options::new("local", 9, Duration::from_secs(600))
        .state_dir(f.state.path())
        .flag(format!("--bpf-root={}", f.root.path().display()))
        .flag(format!("--clustermesh-config={}", config.display()))
        .flag(format!(
            "--clustermesh-ip-identities-sync-timeout={}ms",
            timeout.as_millis()
        ));
    if ipsec {
        options = options.flag("--enable-ipsec");
    }
    let mesh = Mesh::start_with(options).await;
    let manager = mesh
        .agent
        .datapath()
        .and_then(|d| d.endpoints.clone())
        .expect("the datapath runs its endpoint manager");
    (mesh, manager)
}

async fn states(manager: &Addr<EndpointManager>) -> Vec<(u64, EndpointState, u64)> {
    manager
        .send(ListEndpoints)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.spec.id, e.state, e.generation))
        .collect()
}

async fn until_ready(manager: &Addr<EndpointManager>, id: u64, within: Duration) {
    Wait::new(format!("endpoint {id} ready"))
        .timeout(within)
        .until_async(
            || states(manager),
            |now| {
                now.iter()
                    .any(|(i, s, _)| *i == id && *s == EndpointState::Ready)
            },
        )
        .await
        .unwrap_or_else(|err| panic!("{err}"));
}

#[actix_rt::test]
#[ignore = "needs root, network namespaces and bpffs: `cargo xtask test` runs it"]
async fn an_endpoint_deleted_during_the_wait_aborts_only_itself() {
    let f = fixture(2);
    let store = EndpointStore::new(f.state.path());
    store.save(&spec(&f, 1, false)).unwrap();
    store.save(&spec(&f, 2, false)).unwrap();
    let started = Instant::now();
    let (_mesh, manager) = start(&f, Duration::from_secs(2), false).await;

    let waiting = states(&manager).await;
    assert_eq!(
        waiting,
        vec![
            (1, EndpointState::WaitingForSync, 0),
            (2, EndpointState::WaitingForSync, 0)
        ]
    );
    assert!(manager.send(DeleteEndpoint(2)).await.unwrap().unwrap());

    until_ready(&manager, 1, Duration::from_secs(10)).await;
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "regenerated before the bounded wait ended ({:?})",
        started.elapsed()
    );
    assert_eq!(states(&manager).await, vec![(1, EndpointState::Ready, 1)]);
    assert!(
        store.load_all().0.iter().all(|s| s.id == 1),
        "endpoint 2's file is gone"
    );
    let filters = f
        .node
        .run("tc", &["filter", "show", "dev", "lxc1", "ingress"])
        .unwrap();
    assert!(filters.contains("meshwork_endpoint"), "{filters}");
}

#[actix_rt::test]
#[ignore = "needs root, network namespaces and bpffs: `cargo xtask test` runs it"]
async fn with_ipsec_the_host_endpoint_regenerates_first_and_the_wait_is_capped() {
    let f = fixture(2);
    let store = EndpointStore::new(f.state.path());
    store.save(&spec(&f, 1, true)).unwrap();
    store.save(&spec(&f, 2, false)).unwrap();
    let started = Instant::now();
    let (_mesh, manager) = start(&f, Duration::from_secs(600), true).await;

    let now = states(&manager).await;
    assert_eq!(
        now[0],
        (1, EndpointState::Ready, 1),
        "host endpoint at once: {now:?}"
    );
    assert_eq!(now[1], (2, EndpointState::WaitingForSync, 0));
    until_ready(&manager, 2, Duration::from_secs(15)).await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(5) && waited < Duration::from_secs(15),
        "the wait is capped at 5 s with IPsec, not the 600 s timeout: {waited:?}"
    );
}
