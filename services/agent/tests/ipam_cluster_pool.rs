//! `--ipam cluster-pool` through the real agent binary: the router IP is the pod CIDR's
//! first host, the Ipam service is in health and reflection, Allocate and Release over the
//! socket are idempotent, a restart keeps every allocation, and a corrupt checkpoint fails
//! the start naming the file.

mod common;

use std::path::Path;
use std::time::Duration;

use meshwork_lab::agent::{AgentOptions, AgentProcess};
use meshwork_lab::wait::eventually_async;
use meshwork_proto::agent::v1 as pb;
use meshwork_proto::agent::v1::ipam_client::IpamClient;
use meshwork_proto::connect_unix;
use meshwork_proto::standard::client::{HealthStatus, health, reflected_services};
use tonic::transport::Channel;

/// Addresses of the lab's range, only handed out as data: nothing is configured with them.
const CIDR: &str = "10.213.250.0/24";

fn options(state: &Path, log: &str) -> AgentOptions {
    AgentOptions::new(common::binaries::agent_binary(), "c1", 1, state)
        .ipam_cluster_pool(CIDR)
        .log_name(log)
        .env("RUST_LOG", "info,meshwork_agent::ipam=debug")
}

async fn client(agent: &AgentProcess) -> (Channel, IpamClient<Channel>) {
    let channel = connect_unix(agent.socket())
        .await
        .expect("the agent's socket");
    (channel.clone(), IpamClient::new(channel))
}

async fn allocate(ipam: &mut IpamClient<Channel>, owner: &str) -> pb::AllocateResponse {
    ipam.allocate(pb::AllocateRequest {
        owner: owner.into(),
        pod: format!("default/{}", owner.replace('/', "-")),
    })
    .await
    .unwrap_or_else(|status| panic!("Allocate {owner}: {status}"))
    .into_inner()
}

async fn release(ipam: &mut IpamClient<Channel>, owner: &str) -> pb::ReleaseResponse {
    ipam.release(pb::ReleaseRequest {
        owner: owner.into(),
    })
    .await
    .unwrap_or_else(|status| panic!("Release {owner}: {status}"))
    .into_inner()
}

async fn status(ipam: &mut IpamClient<Channel>) -> pb::IpamStatusResponse {
    ipam.status(pb::IpamStatusRequest {})
        .await
        .expect("Ipam.Status")
        .into_inner()
}

#[tokio::test(flavor = "multi_thread")]
async fn cluster_pool_hands_out_the_cidr_idempotently_and_keeps_it_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut agent = AgentProcess::start(&options(&state, "agent.log")).unwrap();
    let (channel, mut ipam) = client(&agent).await;

    let s = status(&mut ipam).await;
    assert_eq!(
        (
            s.mode.as_str(),
            s.router_ip.as_str(),
            s.ready,
            s.required,
            s.available,
            s.used
        ),
        ("cluster-pool", "10.213.250.1", true, 1, 254, 1)
    );
    eventually_async(
        "health SERVING",
        || {
            let channel = channel.clone();
            async move { health(channel, "").await.unwrap() }
        },
        |h| *h == HealthStatus::Serving,
    )
    .await;
    assert_eq!(
        health(channel.clone(), "meshwork.agent.v1.Ipam")
            .await
            .unwrap(),
        HealthStatus::Serving
    );
    let reflected = reflected_services(channel.clone()).await.unwrap();
    assert!(
        reflected.iter().any(|s| s == "meshwork.agent.v1.Ipam"),
        "{reflected:?}"
    );

    let a = allocate(&mut ipam, "ca/eth0").await;
    assert_eq!(
        (a.ip.as_str(), a.prefix_len, a.gateway.as_str(), a.existing),
        ("10.213.250.2", 24, "10.213.250.1", false)
    );
    assert!(a.eni_id.is_empty() && a.generation.is_empty());
    let again = allocate(&mut ipam, "ca/eth0").await;
    assert!(again.existing && again.ip == a.ip, "{again:?}");
    let b = allocate(&mut ipam, "cb/eth0").await;
    assert_eq!(b.ip, "10.213.250.3");
    let released = release(&mut ipam, "cb/eth0").await;
    assert_eq!(
        (released.released, released.ip.as_str()),
        (true, "10.213.250.3")
    );
    let released = release(&mut ipam, "cb/eth0").await;
    assert_eq!((released.released, released.ip.as_str()), (false, ""));
    for refused in [
        ipam.release(pb::ReleaseRequest {
            owner: "router".into(),
        })
        .await
        .unwrap_err(),
        ipam.allocate(pb::AllocateRequest::default())
            .await
            .unwrap_err(),
    ] {
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused}");
    }
    let c = allocate(&mut ipam, "cc/eth0").await;
    assert_eq!(c.ip, "10.213.250.4", "a released IP is not reused at once");
    let before = status(&mut ipam).await.allocations;
    let owners: Vec<&str> = before.iter().map(|a| a.owner.as_str()).collect();
    assert_eq!(owners, ["router", "ca/eth0", "cc/eth0"]);
    assert_eq!(before[1].pod, "default/ca-eth0");

    // Restarted, every owner keeps its IP.
    agent.stop(Duration::from_secs(5));
    let agent = AgentProcess::start(&options(&state, "agent-2.log")).unwrap();
    let (_, mut ipam) = client(&agent).await;
    let s = status(&mut ipam).await;
    assert_eq!(s.allocations, before);
    assert_eq!(s.router_ip, "10.213.250.1");
    let a_again = allocate(&mut ipam, "ca/eth0").await;
    assert!(a_again.existing && a_again.ip == a.ip, "{a_again:?}");
    let d = allocate(&mut ipam, "cd/eth0").await;
    assert_eq!(
        d.ip, "10.213.250.5",
        "the search continues after the highest restored"
    );
    drop(agent);

    // A corrupt checkpoint fails the start, naming the file.
    let checkpoint = state.join("ipam.json");
    std::fs::write(&checkpoint, "{\"version\":1,").unwrap();
    let err = AgentProcess::start(&options(&state, "agent-3.log"))
        .expect_err("an agent with a corrupt checkpoint started");
    let log = std::fs::read_to_string(state.join("agent-3.log")).unwrap();
    assert!(
        log.contains(&format!(
            "the IPAM checkpoint {} is corrupt",
            checkpoint.display()
        )),
        "{err}\n{log}"
    );
}
