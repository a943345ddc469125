//! The apiserver's loop against a real etcd, every event under `cilium/` recorded: on a fresh
//! store the canaries come only after every agent that connected within the initial-sync
//! timeout has published, after all their entries; the cluster config carries the sync
//! canaries; a restarted loop is ready at once, and the same publishes show a reader no event
//! but the heartbeat.

use std::net::IpAddr;
use std::time::Duration;

mod common;

use common::{connect, events_since};
use meshwork_apiserver::exporter::{Command, Exporter, Session, Settings};
use meshwork_apiserver::metrics::ApiserverMetrics;
use meshwork_apiserver::state::{EndpointSpec, NodeSpec};
use meshwork_kvstore::EtcdBackend;
use meshwork_lab::etcd::EtcdServer;
use meshwork_types::{Address, AddressType, Label};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

const INITIAL_SYNC_TIMEOUT: Duration = Duration::from_secs(2);

fn settings() -> Settings {
    Settings {
        initial_sync_timeout: INITIAL_SYNC_TIMEOUT,
        ..Settings::new("c1", 1)
    }
}

fn node(name: &str, index: u8) -> NodeSpec {
    NodeSpec {
        name: name.to_owned(),
        addresses: vec![Address {
            address_type: AddressType::InternalIp,
            ip: Some(IpAddr::from([192, 0, 2, index])),
        }],
        ipv4_cidrs: vec![format!("10.1.{index}.0/24").parse().unwrap()],
        ipv6_cidrs: vec![],
        ipv4_health_ip: None,
        ipv6_health_ip: None,
        wireguard_public_key: String::new(),
        encryption_key: 0,
        labels: Default::default(),
        eni_ipam: false,
    }
}

fn session(name: &str) -> Session {
    Session {
        node: name.to_owned(),
        id: 1,
    }
}

/// Publishes `name` with `endpoints` pods, as an agent's session would.
async fn publish(commands: &mpsc::Sender<Command>, name: &str, index: u8, endpoints: u8) {
    let (reply, answer) = oneshot::channel();
    commands
        .send(Command::PublishNode(
            session(name),
            node(name, index),
            reply,
        ))
        .await
        .unwrap();
    answer.await.unwrap().unwrap();
    for i in 1..=endpoints {
        let endpoint = EndpointSpec {
            id: u64::from(i),
            ips: vec![IpAddr::from([10, 1, index, i])],
            labels: vec![Label::parse("k8s:app=web")],
            named_ports: vec![],
            pod_namespace: "default".to_owned(),
            pod_name: format!("{name}-{i}"),
        };
        let (reply, answer) = oneshot::channel();
        let put = Command::PutEndpoints(session(name), vec![endpoint], reply);
        commands.send(put).await.unwrap();
        let answers = answer.await.unwrap();
        assert!(matches!(answers[..], [Ok(_)]), "{answers:?}");
    }
}

/// Says `name` has sent its initial state, without waiting for it to be written.
async fn complete(commands: &mpsc::Sender<Command>, name: &str) {
    let (reply, _written) = oneshot::channel();
    let command = Command::InitialStateComplete(session(name), reply);
    commands.send(command).await.unwrap();
}

async fn start(
    backend: &EtcdBackend,
) -> (
    mpsc::Sender<Command>,
    tokio::sync::watch::Receiver<bool>,
    JoinHandle<()>,
) {
    let (exporter, commands, ready) =
        Exporter::start(backend.clone(), settings(), ApiserverMetrics::default())
            .await
            .unwrap();
    (commands, ready, tokio::spawn(exporter.run()))
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn canaries_wait_for_every_agent_of_the_window_and_a_restart_rewrites_nothing() {
    let server = EtcdServer::start().unwrap();
    let backend = connect(&server).await;
    let (commands, mut ready, task) = start(&backend).await;

    publish(&commands, "n1", 1, 3).await;
    complete(&commands, "n1").await;
    // n2 connects within the window but is slow to finish.
    publish(&commands, "n2", 2, 0).await;
    let early = tokio::time::timeout(INITIAL_SYNC_TIMEOUT * 2, ready.wait_for(|r| *r))
        .await
        .is_ok();
    assert!(!early, "no canaries while n2 is still publishing");
    publish(&commands, "n2", 2, 2).await;
    complete(&commands, "n2").await;
    tokio::time::timeout(Duration::from_secs(10), ready.wait_for(|r| *r))
        .await
        .expect("canaries once n2 is done")
        .unwrap();

    let events = events_since(&backend, 1).await;
    let revision_of = |key: &str| {
        events
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, r)| *r)
            .max()
            .unwrap_or_else(|| panic!("no event for {key}: {events:?}"))
    };
    let canary = revision_of("cilium/synced/c1/cilium/state/ip/v1");
    for key in [
        "cilium/state/ip/v1/default/10.1.2.2",
        "cilium/state/nodes/v1/c1/n2",
        "cilium/state/identities/v1/id/65536",
    ] {
        assert!(
            revision_of(key) < canary,
            "{key} was written after the canaries"
        );
    }
    let (config, _) = backend
        .get("cilium/cluster-config/c1")
        .await
        .unwrap()
        .expect("the cluster config");
    assert!(
        String::from_utf8(config)
            .unwrap()
            .contains("\"syncedCanaries\":true")
    );
    assert!(
        backend
            .get("cilium/.has-cluster-config")
            .await
            .unwrap()
            .is_some()
    );

    // Stopped as by a SIGKILL: nothing revoked, nothing deleted.
    drop(commands);
    task.await.unwrap();
    let before = backend.revision("cilium/").await.unwrap();
    let (commands, ready, task) = start(&backend).await;
    assert!(*ready.borrow(), "the canaries are there: ready at once");
    publish(&commands, "n1", 1, 3).await;
    publish(&commands, "n2", 2, 2).await;
    complete(&commands, "n1").await;
    // The loop ends only after writing what the commands before changed.
    drop(commands);
    task.await.unwrap();
    let events = events_since(&backend, before + 1).await;
    let others: Vec<_> = events
        .iter()
        .filter(|(k, _)| k != "cilium/.heartbeat")
        .collect();
    assert!(others.is_empty(), "a reader saw {others:?}");
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs real etcd: `cargo xtask test` runs it"]
async fn a_changed_or_deleted_cluster_config_is_written_again_at_once() {
    let server = EtcdServer::start().unwrap();
    let backend = connect(&server).await;
    let (commands, _ready, task) = start(&backend).await;
    const KEY: &str = "cilium/cluster-config/c1";
    let written = meshwork_lab::wait::eventually_async(
        "the cluster config",
        || backend.get(KEY),
        |got| matches!(got, Ok(Some(_))),
    )
    .await
    .unwrap()
    .unwrap()
    .0;
    // Another writer changes it, then deletes it: each time it comes back (well within the
    // 5-minute re-check: the watch sees it).
    backend.put(KEY, r#"{"id":9}"#).await.unwrap();
    meshwork_lab::wait::eventually_async(
        "the cluster config rewritten",
        || backend.get(KEY),
        |got| matches!(got, Ok(Some((value, _))) if *value == written),
    )
    .await
    .unwrap();
    backend.delete(KEY).await.unwrap();
    meshwork_lab::wait::eventually_async(
        "the cluster config written again after a delete",
        || backend.get(KEY),
        |got| matches!(got, Ok(Some((value, _))) if *value == written),
    )
    .await
    .unwrap();
    drop(commands);
    task.await.unwrap();
}
