//! The apiserver on a 3-member etcd whose leader is killed while 10 agents publish: nothing
//! is lost (every endpoint's ipcache key is in etcd at the end), and every agent's writes land
//! again within 10 s of the new leader.

mod common;

use std::time::Duration;

use common::apiserver::{Agent, start};
use meshwork_kvstore::{EtcdBackend, EtcdConfig};
use meshwork_lab::etcd_cluster::EtcdCluster;
use tokio::time::Instant;

const AGENTS: u8 = 10;
/// Endpoints each agent publishes before the leader dies, and after.
const BEFORE: u8 = 20;
const AFTER: u8 = 20;
const RESUME_WITHIN: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a real 3-member etcd: `cargo xtask test` runs it"]
async fn ten_agents_lose_nothing_when_the_etcd_leader_dies() {
    let mut cluster = EtcdCluster::start(3).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let apiserver = start(&cluster.endpoints().join(","), dir.path(), None);
    let port = apiserver.grpc;

    let mut agents = Vec::new();
    for k in 1..=AGENTS {
        let mut agent = Agent::open(port, &format!("n{k}"), k).await.unwrap();
        agent.finish_range(1, BEFORE).await.unwrap();
        agents.push(agent);
    }

    let leader = cluster.leader().expect("a leader");
    cluster.kill(leader);
    let killed = Instant::now();
    // Everyone publishes on while the cluster elects a new leader.
    let publishing: Vec<_> = agents
        .into_iter()
        .map(|mut agent| {
            tokio::spawn(async move {
                agent
                    .finish_range(BEFORE + 1, BEFORE + AFTER)
                    .await
                    .map(|()| Instant::now())
            })
        })
        .collect();
    let new_leader = tokio::task::spawn_blocking(move || {
        let new_leader = cluster.wait_leader().unwrap();
        (cluster, new_leader, Instant::now())
    });
    let (cluster, new_leader, elected) = new_leader.await.unwrap();
    assert_ne!(new_leader, leader);
    let mut last = elected;
    for task in publishing {
        let written = task.await.unwrap().expect("the agent's writes landed");
        last = last.max(written);
    }
    println!(
        "leader m{leader} killed; m{new_leader} elected after {:?}; every agent's writes landed {:?} after that",
        elected - killed,
        last.saturating_duration_since(elected)
    );
    assert!(
        last.saturating_duration_since(elected) <= RESUME_WITHIN,
        "the last agent's writes landed {:?} after the new leader ({:?} after the kill)",
        last.saturating_duration_since(elected),
        last - killed
    );

    let survivor = EtcdBackend::connect(
        &EtcdConfig::new(cluster.running_endpoints()),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    let mut missing = Vec::new();
    for k in 1..=AGENTS {
        for i in 1..=(BEFORE + AFTER) {
            let key = format!("cilium/state/ip/v1/default/10.1.{k}.{i}");
            if survivor.get(&key).await.unwrap().is_none() {
                missing.push(key);
            }
        }
    }
    assert!(missing.is_empty(), "lost: {missing:?}");
}
