//! Shared helpers of the agent's tests: the in-process agent (the binary's own wiring, through
//! [`AgentBuilder`]) against real etcd servers started by the lab, and a recorder of what its
//! consumers see.

#![allow(dead_code, missing_docs)]

pub mod binaries;
pub mod prometheus;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, Addr, Context, Handler, Message, MessageResult};
use clap::Parser as _;
use meshwork_agent::{Agent, AgentBuilder, Args};
use meshwork_clustermesh::config_dir::{ClusterConfigEvent, RemoteClusterConfig};
use meshwork_clustermesh::events::RemoteEvents;
use meshwork_clustermesh::identity_actor::GetRegisteredIdentities;
use meshwork_clustermesh::mesh::{GetMeshStatus, GetReservedIds};
use meshwork_clustermesh::status::ClusterStatus;
use meshwork_clustermesh::{SyncKind, WaitError, WaitOutcome};
use meshwork_kvstore::{EtcdBackend, EtcdConfig, KvstoreError};
use meshwork_lab::cilium::Cluster;
use meshwork_lab::etcd::EtcdServer;
use meshwork_lab::wait::Wait;
use meshwork_types::{Change, RemoteEvent};

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                "meshwork_agent=debug,meshwork_clustermesh=debug,meshwork_kvstore=info".into()
            }),
        )
        .with_test_writer()
        .try_init();
}

pub async fn connect(server: &EtcdServer) -> EtcdBackend {
    EtcdBackend::connect(
        &EtcdConfig::new([server.endpoint()]),
        Duration::from_secs(10),
    )
    .await
    .expect("connect to the lab etcd")
}

/// Writes the cluster config, the state and the canaries of `cluster`.
pub async fn load(backend: &EtcdBackend, cluster: &Cluster) -> Result<(), KvstoreError> {
    let (key, value) = cluster.config();
    backend.put(&key, value).await?;
    backend.put_many(cluster.state(), 100).await?;
    backend.put_many(cluster.canaries(), 100).await?;
    Ok(())
}

/// A small remote cluster c2 (ID 2): 2 nodes, 1 service, 3 identities, 10 ipcache entries.
pub fn small_c2() -> Cluster {
    Cluster {
        name: "c2".to_owned(),
        id: 2,
        sizes: meshwork_lab::cilium::Sizes {
            nodes: 2,
            services: 1,
            identities: 3,
            ipcache: 10,
        },
    }
}

/// [`load`] for a test without a runtime of its own.
pub fn load_blocking(server: &EtcdServer, cluster: &Cluster) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async { load(&connect(server).await, cluster).await.unwrap() });
}

/// A node of remote cluster c2 (ID 2) in Cilium's layout, with its WireGuard public `key`:
/// InternalIP `ip`, pod CIDR `<pod_net>.0/24` (CiliumInternalIP `<pod_net>.1`).
pub fn c2_node(name: &str, ip: &str, pod_net: &str, key: &str) -> (String, Vec<u8>) {
    let value = serde_json::json!({
        "Name": name, "Cluster": "c2",
        "IPAddresses": [
            {"Type": "CiliumInternalIP", "IP": format!("{pod_net}.1")},
            {"Type": "InternalIP", "IP": ip},
        ],
        "IPv4AllocCIDR": {"IP": format!("{pod_net}.0"), "Mask": "////AA=="},
        "ClusterID": 2, "Source": "custom-resource", "WireguardPubKey": key,
    });
    (
        format!("{}/c2/{name}", meshwork_kvstore::keys::NODES_PREFIX),
        value.to_string().into_bytes(),
    )
}

/// What one cluster contributed, as a consumer sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Contribution {
    /// Nodes.
    pub nodes: usize,
    /// Global services.
    pub services: usize,
    /// ipcache entries.
    pub ipcache: usize,
}

/// One event of `cluster` as text: `node-`, `svc+`, `ip+` … followed by the cluster and the
/// entry; list-dones are not described.
pub fn describe(cluster: &str, event: &RemoteEvent) -> Option<String> {
    fn sign<V>(change: &Change<V>) -> char {
        if change.is_upsert() { '+' } else { '-' }
    }
    Some(match event {
        RemoteEvent::Node { change } => {
            format!("node{} {cluster} {}", sign(change), change.value().name)
        }
        RemoteEvent::Service { change } => {
            let s = change.value();
            format!("svc{} {cluster} {}/{}", sign(change), s.namespace, s.name)
        }
        RemoteEvent::IpCache { change, .. } => {
            format!("ip{} {cluster} {}", sign(change), change.value().key_name())
        }
        RemoteEvent::ListDone(_) => return None,
    })
}

/// An observer of the agent's remote events: records each (described) and what each cluster
/// contributes now.
#[derive(Default)]
pub struct Recorder {
    seen: Vec<String>,
    nodes: HashMap<(Arc<str>, String), ()>,
    services: HashMap<(Arc<str>, String), ()>,
    ipcache: HashMap<Arc<str>, usize>,
}

impl Actor for Recorder {
    type Context = Context<Self>;
}

impl Handler<RemoteEvents> for Recorder {
    type Result = ();

    fn handle(&mut self, batch: RemoteEvents, _: &mut Context<Self>) {
        let cluster = &batch.cluster.name;
        for event in batch.events.iter() {
            self.seen.extend(describe(cluster, event));
            match event {
                RemoteEvent::Node { change } => {
                    let key = (Arc::clone(cluster), change.value().name.clone());
                    apply(&mut self.nodes, key, change);
                }
                RemoteEvent::Service { change } => {
                    let s = change.value();
                    let key = (Arc::clone(cluster), format!("{}/{}", s.namespace, s.name));
                    apply(&mut self.services, key, change);
                }
                RemoteEvent::IpCache { created, change } => {
                    let count = self.ipcache.entry(Arc::clone(cluster)).or_default();
                    match change {
                        Change::Upsert(_) if *created => *count += 1,
                        Change::Upsert(_) => {}
                        Change::Delete(_) => *count = count.saturating_sub(1),
                    }
                }
                RemoteEvent::ListDone(_) => {}
            }
        }
    }
}

fn apply<K: std::hash::Hash + Eq, V>(map: &mut HashMap<K, ()>, key: K, change: &Change<V>) {
    match change {
        Change::Upsert(_) => map.insert(key, ()),
        Change::Delete(_) => map.remove(&key),
    };
}

/// Every event recorded so far (answered after every batch queued before the question).
#[derive(Message)]
#[rtype(result = "Vec<String>")]
pub struct Seen;

impl Handler<Seen> for Recorder {
    type Result = MessageResult<Seen>;

    fn handle(&mut self, _: Seen, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.seen.clone())
    }
}

/// What a cluster contributes now.
#[derive(Message)]
#[rtype(result = "Contribution")]
pub struct GetContribution(pub String);

impl Handler<GetContribution> for Recorder {
    type Result = MessageResult<GetContribution>;

    fn handle(
        &mut self,
        GetContribution(cluster): GetContribution,
        _: &mut Context<Self>,
    ) -> Self::Result {
        let of = |map: &HashMap<(Arc<str>, String), ()>| {
            map.keys().filter(|(c, _)| **c == *cluster).count()
        };
        MessageResult(Contribution {
            nodes: of(&self.nodes),
            services: of(&self.services),
            ipcache: self.ipcache.get(cluster.as_str()).copied().unwrap_or(0),
        })
    }
}

/// An in-process agent with a recorder of its remote events, its state in a temp dir.
pub struct Mesh {
    pub agent: Agent,
    pub recorder: Addr<Recorder>,
    pub dir: tempfile::TempDir,
}

/// How a test's agent runs.
pub struct Options {
    /// `--cluster-name`.
    pub local: String,
    /// `--cluster-id`.
    pub local_id: u32,
    /// `--clustermesh-sync-timeout`.
    pub breaker: Duration,
    /// More flags.
    pub flags: Vec<String>,
    /// `--state-dir` (default: the agent's own temp dir).
    pub state_dir: Option<std::path::PathBuf>,
}

impl Options {
    pub fn new(local: &str, local_id: u32, breaker: Duration) -> Self {
        Self {
            local: local.to_owned(),
            local_id,
            breaker,
            flags: Vec::new(),
            state_dir: None,
        }
    }

    pub fn state_dir(mut self, dir: &std::path::Path) -> Self {
        self.state_dir = Some(dir.to_owned());
        self
    }

    pub fn flag(mut self, flag: impl Into<String>) -> Self {
        self.flags.push(flag.into());
        self
    }
}

impl Mesh {
    /// An agent of `local`/`local_id` without datapath or metrics (call inside an actix
    /// system), retrying remote connections quickly.
    pub async fn start(local: &str, local_id: u32, breaker: Duration) -> Self {
        Self::start_with(Options::new(local, local_id, breaker).flag("--enable-bpf-datapath=false"))
            .await
    }

    /// An agent run with `options`.
    pub async fn start_with(options: Options) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut flags = vec![
            "meshwork-agent".to_owned(),
            format!("--cluster-name={}", options.local),
            format!("--cluster-id={}", options.local_id),
            format!(
                "--clustermesh-sync-timeout={}ms",
                options.breaker.as_millis()
            ),
            format!(
                "--state-dir={}",
                options.state_dir.as_deref().unwrap_or(dir.path()).display()
            ),
        ];
        if !options
            .flags
            .iter()
            .any(|f| f.starts_with("--prometheus-serve-addr"))
        {
            flags.push("--prometheus-serve-addr=".to_owned());
        }
        flags.extend(options.flags);
        let args = Args::try_parse_from(&flags).expect("valid test flags");
        let recorder = Recorder::default().start();
        let agent = AgentBuilder::new(args)
            .mesh_settings(|settings| {
                settings.min_retry_delay = Duration::from_millis(100);
                settings.max_retry_delay = Duration::from_secs(1);
                settings.connect_timeout = Duration::from_secs(3);
            })
            .observer(recorder.clone().recipient())
            .start()
            .await
            .expect("the agent starts");
        Self {
            agent,
            recorder,
            dir,
        }
    }

    pub async fn add(&self, name: &str, etcd: EtcdConfig) {
        let config = RemoteClusterConfig {
            name: name.to_owned(),
            etcd,
            hash: 0,
        };
        self.agent
            .configure(ClusterConfigEvent::Upsert {
                name: name.to_owned(),
                config,
            })
            .await;
    }

    pub async fn add_server(&self, name: &str, server: &EtcdServer) {
        self.add(name, EtcdConfig::new([server.endpoint()])).await;
    }

    pub async fn remove(&self, name: &str) {
        self.agent
            .configure(ClusterConfigEvent::Remove {
                name: name.to_owned(),
            })
            .await;
    }

    pub async fn statuses(&self) -> Vec<ClusterStatus> {
        self.agent.mesh().send(GetMeshStatus).await.unwrap()
    }

    pub async fn status(&self, name: &str) -> ClusterStatus {
        self.find_status(name)
            .await
            .unwrap_or_else(|| panic!("no status for {name}"))
    }

    async fn find_status(&self, name: &str) -> Option<ClusterStatus> {
        self.statuses().await.into_iter().find(|s| s.name == name)
    }

    /// Polls the status of `name` until `check` holds; fails with the last status.
    pub async fn status_until(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&ClusterStatus) -> bool,
    ) -> ClusterStatus {
        Wait::new(what)
            .until_async(
                || self.find_status(name),
                |status| status.as_ref().is_some_and(&check),
            )
            .await
            .unwrap_or_else(|err| panic!("{err}"))
            .unwrap_or_else(|| unreachable!("the wait ends with a status"))
    }

    pub async fn wait(
        &self,
        kind: SyncKind,
        timeout: Option<Duration>,
    ) -> Result<WaitOutcome, WaitError> {
        self.agent.wait(kind, timeout).await
    }

    /// What `cluster` contributed, as the agent's consumers were sent it (every batch queued
    /// before the question included).
    pub async fn contribution(&self, cluster: &str) -> Contribution {
        self.recorder
            .send(GetContribution(cluster.to_owned()))
            .await
            .unwrap()
    }

    /// Polls until `cluster` contributes `expected`; fails with the last contribution.
    pub async fn contribution_until(&self, cluster: &str, expected: Contribution) {
        Wait::new(format!("{cluster} to contribute {expected:?}"))
            .until_async(|| self.contribution(cluster), |c| *c == expected)
            .await
            .unwrap_or_else(|err| panic!("{err}"));
    }

    /// Every remote event so far, described (see [`describe`]).
    pub async fn events(&self) -> Vec<String> {
        self.recorder.send(Seen).await.unwrap()
    }

    pub async fn registered_identities(&self, cluster: &str) -> usize {
        self.agent
            .identities()
            .send(GetRegisteredIdentities(cluster.to_owned()))
            .await
            .unwrap()
    }

    /// Every reserved cluster ID, by ID.
    pub async fn reserved_ids(&self) -> std::collections::BTreeMap<u32, String> {
        self.agent.mesh().send(GetReservedIds).await.unwrap()
    }
}
