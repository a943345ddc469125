//! Pods through the plugin against the real operator, the patched moto and the real agent
//! (`--ipam eni`): the rule this project exists for — an IP is handed out only from a
//! snapshot that carries its ENI — checked on every allocation against what the operator
//! published; a snapshot that breaks it is waited out; a restart keeps every pod's IP; the
//! operator's death does not stop the agent, and nothing leaks when it returns; the release
//! handshake keeps an address the operator did not know was in use and lets the rest go.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{DEADLINE, NODE, Stack};
use meshwork_lab::wait::Wait;
use meshwork_proto::agent::v1 as agent;

/// How the operator's test hook marks the generation of its broken snapshot.
const INCONSISTENT_SUFFIX: &str = "-test-hook-inconsistent";

/// ADD, retried while the plugin says "try again later" (11: the pool is empty until the
/// operator attaches more), as a kubelet retries a sandbox.
fn add_retrying(stack: &Stack, pod: &common::Pod) -> String {
    let result = Wait::new(format!("ADD of {}", pod.netns.name()))
        .timeout(DEADLINE)
        .every(Duration::from_millis(100))
        .until(
            || stack.cni("ADD", pod),
            |result| match result {
                Ok(_) => true,
                Err(error) => error["code"] != 11,
            },
        )
        .unwrap_or_else(|err| panic!("{err}"));
    let result = result.unwrap_or_else(|err| panic!("ADD failed: {err}"));
    let address = result["ips"][0]["address"].as_str().expect("an address");
    address.split('/').next().unwrap_or_default().to_owned()
}

/// Why `allocation` breaks the rule against the operator's stored version of its generation:
/// no such version, or that version's status lacks its ENI, or the ENI lacks the IP, or the
/// pool does not name that ENI for it.
fn violation(stack: &Stack, allocation: &agent::IpAllocation, generation: &str) -> Option<String> {
    let node = match stack.stored_at(generation) {
        Ok(node) => node,
        Err(why) => return Some(why),
    };
    let (ip, eni) = (allocation.ip.as_str(), allocation.eni_id.as_str());
    let Some(entry) = node["status"]["eni"]["enis"].get(eni) else {
        return Some(format!("{ip}: generation {generation} has no ENI {eni}"));
    };
    let held = entry["addresses"]
        .as_array()
        .is_some_and(|a| a.iter().any(|a| a == ip));
    if !held {
        return Some(format!(
            "{ip}: ENI {eni} of generation {generation} does not hold it"
        ));
    }
    (node["spec"]["ipam"]["pool"][ip]["resource"] != eni)
        .then(|| format!("{ip}: the pool of generation {generation} does not name {eni}"))
}

/// Every allocation's violation against its own generation.
fn violations(stack: &Stack, status: &agent::IpamStatusResponse) -> Vec<String> {
    status
        .allocations
        .iter()
        .filter_map(|a| violation(stack, a, &a.generation))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the patched moto server, real etcd, root, bpffs and network namespaces: `cargo xtask test` runs it"]
async fn fifty_pods_get_ips_only_from_snapshots_that_carry_their_enis() {
    let mut stack = Stack::start(8, &[], &[]).await;
    let mut pods = Vec::new();
    for _ in 0..50 {
        let pod = stack.new_pod();
        let ip = add_retrying(&stack, &pod);
        pods.push((pod, ip));
    }
    let status = stack.ipam_status().await;
    let pod_allocations: Vec<_> = status
        .allocations
        .iter()
        .filter(|a| a.owner != "router")
        .collect();
    assert_eq!(pod_allocations.len(), 50, "{status:?}");
    assert_eq!(violations(&stack, &status), Vec::<String>::new());
    // The check can fail: the operator attached ENIs during the run, so the first generation
    // the agent used lacks the ENI of some allocation — checked against it, those violate.
    let enis: BTreeSet<&str> = status
        .allocations
        .iter()
        .map(|a| a.eni_id.as_str())
        .collect();
    assert!(enis.len() >= 2, "50 pods on one ENI? {enis:?}");
    let first = status
        .allocations
        .iter()
        .filter_map(|a| a.generation.parse::<i64>().ok())
        .min()
        .expect("a generation")
        .to_string();
    let against_first = status
        .allocations
        .iter()
        .filter(|a| violation(&stack, a, &first).is_some())
        .count();
    assert!(against_first > 0, "every ENI was there from the start");
    // The pods' addresses are those the agent recorded, all distinct.
    let ips: BTreeSet<&str> = pods.iter().map(|(_, ip)| ip.as_str()).collect();
    assert_eq!(ips.len(), 50);
    for (pod, ip) in &pods {
        assert!(
            status
                .allocations
                .iter()
                .any(|a| &a.ip == ip && a.owner.starts_with(&pod.id)),
            "{ip} of {} is not the agent's record",
            pod.id
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the patched moto server, real etcd, root, bpffs and network namespaces: `cargo xtask test` runs it"]
async fn a_snapshot_naming_an_eni_it_lacks_is_waited_out_and_never_used() {
    let mut stack = Stack::start(4, &["--test-hook-inconsistent-snapshot", NODE], &[]).await;
    let status = stack
        .wait_status("the agent to count the inconsistent snapshot", |s| {
            // The broken snapshot comes first: ready only once the real one followed.
            s.inconsistent_snapshots >= 1 && s.ready
        })
        .await;
    assert!(status.ready, "{status:?}");
    let mut pods = Vec::new();
    for _ in 0..6 {
        let pod = stack.new_pod();
        add_retrying(&stack, &pod);
        pods.push(pod);
    }
    // The agent was the node's first watcher: the hook's broken copy went to it.
    let broken = stack
        .operator_log()
        .contains("test hook: sending an inconsistent snapshot");
    assert!(broken, "the hook sent nothing");
    let status = stack.ipam_status().await;
    for allocation in &status.allocations {
        assert!(
            !allocation.generation.ends_with(INCONSISTENT_SUFFIX),
            "{allocation:?} came from the inconsistent snapshot"
        );
    }
    assert_eq!(violations(&stack, &status), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the patched moto server, real etcd, root, bpffs and network namespaces: `cargo xtask test` runs it"]
async fn a_restarted_agent_keeps_every_pods_ip_and_leaks_none() {
    let mut stack = Stack::start(8, &[], &[]).await;
    let mut pods = Vec::new();
    for _ in 0..5 {
        let pod = stack.new_pod();
        let ip = add_retrying(&stack, &pod);
        pods.push((pod, ip));
    }
    let before = allocations(&stack.ipam_status().await);
    assert_eq!(before.len(), 6, "5 pods and the router: {before:?}");

    stack
        .agent
        .as_mut()
        .expect("agent")
        .stop(Duration::from_secs(10));
    stack.start_agent();
    let after = allocations(&stack.ipam_status().await);
    assert_eq!(after, before, "the restart changed the allocations");
    // A runtime repeating ADD gets the same address; CHECK passes.
    for (pod, ip) in &pods {
        let again = stack.cni("ADD", pod).expect("repeated ADD");
        assert_eq!(
            again["ips"][0]["address"]
                .as_str()
                .map(|a| a.split('/').next()),
            Some(Some(ip.as_str()))
        );
        stack
            .check(pod, &again)
            .unwrap_or_else(|err| panic!("CHECK: {err}"));
    }
    // A new pod gets a fresh address.
    let new = stack.new_pod();
    let ip = add_retrying(&stack, &new);
    assert!(!before.contains_key(&ip), "{ip} was handed out twice");
    // Every pod deleted (twice: DEL is idempotent): only the router's address is left.
    for (pod, _) in pods.iter().chain([(new, ip)].iter()) {
        stack
            .cni("DEL", pod)
            .unwrap_or_else(|err| panic!("DEL: {err}"));
        stack
            .cni("DEL", pod)
            .unwrap_or_else(|err| panic!("second DEL: {err}"));
    }
    let left = allocations(&stack.ipam_status().await);
    assert_eq!(left.values().collect::<Vec<_>>(), ["router"], "{left:?}");
    // And the operator heard it: status.ipam.used holds the router's address only.
    let used = stack
        .wait_stored("status.ipam.used to hold only the router", |node| {
            node["status"]["ipam"]["used"]
                .as_object()
                .is_some_and(|u| u.len() == 1)
        })
        .await;
    assert!(
        used["status"]["ipam"]["used"]
            .as_object()
            .unwrap()
            .contains_key(left.keys().next().unwrap())
    );
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the patched moto server, real etcd, root, bpffs and network namespaces: `cargo xtask test` runs it"]
async fn the_agent_serves_while_the_operator_is_gone_and_reports_when_it_returns() {
    let mut stack = Stack::start(8, &[], &[]).await;
    let mut ips = BTreeSet::new();
    // Below the watermark: the operator starts attaching a second ENI, and dies meanwhile.
    for _ in 0..6 {
        let pod = stack.new_pod();
        ips.insert(add_retrying(&stack, &pod));
    }
    stack.operator.as_mut().expect("operator").process().kill();
    stack
        .wait_status("the agent to see the operator gone", |s| {
            !s.operator_connected
        })
        .await;
    // 7 of the pool's 8 (at least) are handed out: one more comes from the last snapshot.
    let pod = stack.new_pod();
    ips.insert(add_retrying(&stack, &pod));
    stack.start_operator();
    stack
        .wait_status("the agent to reconnect", |s| s.operator_connected)
        .await;
    // Usage reported on return: every address handed out, the outage's included.
    let stored = stack
        .wait_stored("status.ipam.used to hold every pod's address", |node| {
            node["status"]["ipam"]["used"]
                .as_object()
                .is_some_and(|used| ips.iter().all(|ip| used.contains_key(ip)))
        })
        .await;
    // No ENI leaks: EC2's ENIs of the instance are exactly those in the published status.
    let published_enis = |node: &serde_json::Value| -> Vec<String> {
        node["status"]["eni"]["enis"]
            .as_object()
            .map(|e| e.keys().cloned().collect())
            .unwrap_or_default()
    };
    let ec2 = Wait::new("EC2's ENIs to match the published ones")
        .timeout(DEADLINE)
        .some_async(|| async {
            let ec2 = stack.ec2_enis().await;
            let node = stack.stored_node().await;
            (ec2 == published_enis(&node)).then_some(ec2)
        })
        .await
        .unwrap_or_else(|err| panic!("{err}: stored {stored}"));
    assert!(ec2.len() >= 2, "eth0 and the pods' ENI at least: {ec2:?}");
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the patched moto server, real etcd, root, bpffs and network namespaces: `cargo xtask test` runs it"]
async fn the_release_handshake_keeps_the_address_in_use_and_releases_the_others() {
    // Pre-allocate 2: eight pods grow the pool, and once seven are gone the rest is excess.
    let mut stack = Stack::start(2, &[], &[]).await;
    let mut pods = Vec::new();
    for _ in 0..8 {
        let pod = stack.new_pod();
        let ip = add_retrying(&stack, &pod);
        pods.push((pod, ip));
    }
    for (pod, _) in &pods[1..] {
        stack
            .cni("DEL", pod)
            .unwrap_or_else(|err| panic!("DEL: {err}"));
    }
    stack
        .wait_stored("status.ipam.used to hold the router and one pod", |node| {
            ipam_keys(node, "status", "used").len() == 2
        })
        .await;

    // The operator goes; the agent hands out one more address that it cannot report, and
    // stops too. The stored usage now lacks an address in use.
    drop(stack.operator.take());
    stack
        .wait_status("the agent to see the operator gone", |s| {
            !s.operator_connected
        })
        .await;
    let pod = stack.new_pod();
    let in_use = add_retrying(&stack, &pod);
    stack
        .agent
        .as_mut()
        .expect("agent")
        .stop(Duration::from_secs(10));
    let stored = stack.stored_node().await;
    assert!(
        !ipam_keys(&stored, "status", "used").contains(&in_use),
        "{in_use} was reported: the operator would not mark it"
    );

    // Back with release on and no delay, the operator marks the excess — the unreported
    // address among it, as the lowest free one of its ENI.
    stack
        .operator_options
        .flags
        .extend(["--aws-release-excess-ips", "--excess-ip-release-delay", "0"].map(str::to_owned));
    stack.start_operator();
    let marked = stack
        .wait_stored("the unreported address to be marked for release", |node| {
            node["status"]["ipam"]["release-ips"][&in_use] == "marked-for-release"
        })
        .await;
    let marked: BTreeSet<String> = ipam_keys(&marked, "status", "release-ips");
    assert!(marked.len() >= 2, "one address marked alone: {marked:?}");
    let pool_before = ipam_keys(&stack.stored_node().await, "spec", "pool");
    let before_agent = stack.revision();

    // The agent returns: do-not-release for its pod's address, ready-for-release for the
    // rest; the operator unassigns those and the agent closes the handshake.
    stack.start_agent();
    let done = stack
        .wait_stored(
            "the handshake to end with released addresses gone",
            |node| {
                let pool = ipam_keys(node, "spec", "pool");
                ipam_keys(node, "status", "release-ips").is_empty()
                    && pool.contains(&in_use)
                    && pool.len() < pool_before.len()
            },
        )
        .await;
    // The answers as the agent wrote them, read from etcd's history: its report lands
    // them in the same write as the usage, before the operator's next pass acts on either.
    let answers: BTreeMap<String, BTreeSet<String>> = stack
        .versions_after(before_agent)
        .iter()
        .flat_map(|node| {
            node["status"]["ipam"]["release-ips"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(ip, state)| (ip.clone(), state.as_str().unwrap_or_default().to_owned()))
                .collect::<Vec<_>>()
        })
        .fold(BTreeMap::new(), |mut seen, (ip, state)| {
            seen.entry(ip).or_default().insert(state);
            seen
        });
    assert!(
        answers[&in_use].contains("do-not-release"),
        "the agent never answered do-not-release for {in_use}: {answers:?}"
    );
    for ip in marked.iter().filter(|ip| **ip != in_use) {
        assert!(
            answers
                .get(ip)
                .is_some_and(|s| s.contains("ready-for-release") && !s.contains("do-not-release")),
            "{ip} is free, yet: {answers:?}"
        );
    }
    let pool_after = ipam_keys(&done, "spec", "pool");
    let released: BTreeSet<String> = pool_before.difference(&pool_after).cloned().collect();
    assert!(
        released.is_subset(&marked) && !released.contains(&in_use),
        "released {released:?}, marked {marked:?}, in use {in_use}"
    );
    let ec2 = stack.ec2_addresses().await;
    assert!(ec2.contains(&in_use), "EC2 lost {in_use}: {ec2:?}");
    assert!(
        released.is_disjoint(&ec2),
        "released yet still on an ENI: {:?}",
        released.intersection(&ec2).collect::<Vec<_>>()
    );
    // The pod kept its address, and no released one is handed out again.
    let held = allocations(&stack.ipam_status().await);
    assert_eq!(
        held.get(&in_use),
        Some(&format!("{}/eth0", pod.id)),
        "{held:?}"
    );
    let next = stack.new_pod();
    let ip = add_retrying(&stack, &next);
    assert!(
        !released.contains(&ip),
        "{ip} was released, then handed out"
    );
}

/// The keys of the CiliumNode's `<part>.ipam.<field>` object (addresses).
fn ipam_keys(node: &serde_json::Value, part: &str, field: &str) -> BTreeSet<String> {
    node[part]["ipam"][field]
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

/// ip → owner.
fn allocations(status: &agent::IpamStatusResponse) -> BTreeMap<String, String> {
    status
        .allocations
        .iter()
        .map(|a| (a.ip.clone(), a.owner.clone()))
        .collect()
}
