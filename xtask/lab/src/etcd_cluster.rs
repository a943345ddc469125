//! A multi-member etcd cluster on 127.0.0.1 (plain HTTP), for tests that lose a member or
//! the leader while clients write. Members are killed and their data removed on drop.

use std::process::Command;
use std::time::Duration;

use crate::process::{self, LabProcess};
use crate::wait::{self, Wait};
use crate::{LabError, Result, paths};

/// How long a new cluster has to become healthy, and a new leader to be elected.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    process: Option<LabProcess>,
}

impl Member {
    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }
}

/// The running cluster.
pub struct EtcdCluster {
    members: Vec<Member>,
    dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts `size` members (`m0`, `m1`, …) forming one new cluster, and waits until every
    /// member is healthy.
    pub fn start(size: usize) -> Result<Self> {
        let etcd = paths::find_program("etcd")?;
        paths::find_program("etcdctl")?;
        let dir = tempfile::Builder::new()
            .prefix("meshwork-etcd-cluster-")
            .tempdir()
            .map_err(LabError::io("creating the etcd cluster's temp dir"))?;
        let mut members = Vec::with_capacity(size);
        for i in 0..size {
            members.push(Member {
                name: format!("m{i}"),
                client_port: wait::free_port()?,
                peer_port: wait::free_port()?,
                process: None,
            });
        }
        let initial_cluster: Vec<String> = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect();
        let initial_cluster = initial_cluster.join(",");
        // All at once: none is healthy before a quorum has formed.
        for member in &mut members {
            let client_url = member.endpoint();
            let peer_url = format!("http://127.0.0.1:{}", member.peer_port);
            let mut command = Command::new(&etcd);
            command
                .args(["--name", &member.name])
                .arg("--data-dir")
                .arg(dir.path().join(&member.name))
                .args(["--listen-client-urls", &client_url])
                .args(["--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &initial_cluster])
                .args(["--initial-cluster-state", "new"])
                .args(["--initial-cluster-token", "meshwork-lab"])
                .args(["--log-level", "warn"]);
            let log = dir.path().join(format!("{}.log", member.name));
            member.process = Some(LabProcess::spawn(
                &format!("etcd {}", member.name),
                command,
                &log,
            )?);
        }
        let cluster = Self { members, dir };
        Wait::new(format!("{size} etcd members to become healthy"))
            .timeout(READY_TIMEOUT)
            .every(Duration::from_millis(200))
            .until(|| cluster.healthy(), |healthy| *healthy)?;
        Ok(cluster)
    }

    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::endpoint).collect()
    }

    /// The client URLs of the members still running.
    pub fn running_endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .filter(|m| m.process.is_some())
            .map(Member::endpoint)
            .collect()
    }

    /// The index of the current leader, as the running members report it; `None` while
    /// there is none.
    pub fn leader(&self) -> Option<usize> {
        let endpoints = self.running_endpoints().join(",");
        let output = process::run(
            Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .args(["--endpoints", &endpoints])
                .args(["endpoint", "status", "-w", "json", "--command-timeout=1s"]),
        )
        .ok()?;
        let statuses: serde_json::Value = serde_json::from_str(&output).ok()?;
        statuses.as_array()?.iter().find_map(|status| {
            let member = status["Status"]["header"]["member_id"].as_u64()?;
            let leader = status["Status"]["leader"].as_u64()?;
            let endpoint = status["Endpoint"].as_str()?;
            (member == leader)
                .then(|| self.members.iter().position(|m| m.endpoint() == endpoint))
                .flatten()
        })
    }

    /// Waits for a leader among the running members (after a kill, a new one).
    pub fn wait_leader(&self) -> Result<usize> {
        Wait::new("an etcd leader")
            .timeout(READY_TIMEOUT)
            .every(Duration::from_millis(100))
            .some(|| self.leader())
    }

    /// Kills member `index` at once (SIGKILL), as a crash would.
    pub fn kill(&mut self, index: usize) {
        if let Some(mut process) = self.members[index].process.take() {
            process.kill();
        }
    }

    /// Where the members keep their data and logs.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    fn healthy(&self) -> bool {
        self.members.iter().all(|m| {
            wait::port_open(m.client_port)
                && Command::new("etcdctl")
                    .env("ETCDCTL_API", "3")
                    .args(["--endpoints", &m.endpoint()])
                    .args(["endpoint", "health", "--command-timeout=1s"])
                    .output()
                    .is_ok_and(|o| o.status.success())
        })
    }
}
