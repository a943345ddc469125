//! The ENI stack the end-to-end tests run: the patched moto with a VPC and one instance, an
//! etcd holding the CiliumNodes, the real `meshwork-operator`, the real `meshwork-agent`
//! (`--ipam eni`, its BPF datapath on) and the plugin, called exactly as a runtime calls it
//! (environment and stdin) from inside a lab namespace that plays the node.

#![allow(dead_code, reason = "each test binary uses part of the helpers")]

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use meshwork_lab::agent::{AgentOptions, AgentProcess};
use meshwork_lab::bpffs::BpfRoot;
use meshwork_lab::eni_scene::EniScene;
use meshwork_lab::etcd::{EtcdOptions, EtcdServer};
use meshwork_lab::moto::MotoServer;
use meshwork_lab::net::{LabNet, Netns};
use meshwork_lab::operator::{OperatorOptions, OperatorProcess};
use meshwork_lab::wait::Wait;
use meshwork_proto::agent::v1 as agent;
use meshwork_proto::agent::v1::ipam_client::IpamClient;
use meshwork_proto::ipam::v1::node_ipam_client::NodeIpamClient;
use serde_json::{Value, json};

/// The node every test drives.
pub const NODE: &str = "node-1";
/// Room for 50 pods, the router and the watermark on one node from device index 1 on: 7
/// ENIs × 29 secondary addresses (m5.xlarge's 3 × 14 would stop at 42).
pub const INSTANCE_TYPE: &str = "m5.4xlarge";
/// How long anything may take.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// The plugin this package builds.
pub fn cni_binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_meshwork-cni"))
}

/// A workspace binary built beside the plugin; panics naming the build to run.
pub fn sibling(name: &str) -> PathBuf {
    let path = cni_binary().with_file_name(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace (cargo build --workspace) before this test",
        path.display()
    );
    path
}

/// A pod: its namespace (`CNI_NETNS`) and container ID.
pub struct Pod {
    pub id: String,
    pub netns: Netns,
}

/// The running stack. Fields drop in order: the agent and the operator stop before what
/// they use (their state dir, the namespaces, moto, etcd) goes.
pub struct Stack {
    pub agent: Option<AgentProcess>,
    pub operator: Option<OperatorProcess>,
    pub dir: tempfile::TempDir,
    pub net: LabNet,
    pub node: Netns,
    pub moto: MotoServer,
    pub scene: EniScene,
    pub etcd: EtcdServer,
    pub operator_options: OperatorOptions,
    operator_starts: u32,
    pub agent_options: AgentOptions,
    pub bpf: BpfRoot,
    pods: u32,
}

impl Stack {
    /// Moto with one `INSTANCE_TYPE` instance, etcd, the operator (`operator_flags` added) and
    /// the agent of [`NODE`] pre-allocating `pre` addresses (`agent_flags` added). The agent
    /// runs; its pool fills after (its gRPC health turns SERVING then).
    pub async fn start(pre: u32, operator_flags: &[&str], agent_flags: &[&str]) -> Self {
        let net = LabNet::new().expect("lab network");
        let node = net.netns("eni-node").expect("node namespace");
        let moto = MotoServer::start().expect("moto");
        let scene = EniScene::create(&moto, "10.213.0.0/20", INSTANCE_TYPE, 1)
            .await
            .expect("moto scene");
        let etcd = EtcdServer::start_with(EtcdOptions {
            data_in_memory: true,
            ..EtcdOptions::default()
        })
        .expect("etcd");
        let dir = tempfile::tempdir().expect("temp dir");
        let operator_options = OperatorOptions::new(
            &sibling("meshwork-operator"),
            &moto.endpoint(),
            &etcd.endpoint(),
            dir.path(),
        )
        .expect("operator options")
        .flags(operator_flags.iter().copied());
        let bpf = BpfRoot::new().expect("bpffs");
        let agent_options = AgentOptions::new(
            &sibling("meshwork-agent"),
            "c1",
            1,
            &dir.path().join("state"),
        )
        .bpf_root(bpf.path())
        .flags(
            [
                "--node-name",
                NODE,
                "--ipam",
                "eni",
                "--operator-addr",
                &operator_options.grpc_url(),
                "--eni-instance-id",
                &scene.instances[0],
                "--eni-instance-type",
                INSTANCE_TYPE,
                "--eni-first-interface-index",
                "1",
                "--ipam-pre-allocate",
                &pre.to_string(),
            ]
            .into_iter()
            .chain(agent_flags.iter().copied())
            .map(str::to_owned)
            .collect::<Vec<_>>(),
        );
        let mut stack = Self {
            dir,
            net,
            node,
            moto,
            scene,
            etcd,
            operator_options,
            operator: None,
            operator_starts: 0,
            agent_options,
            agent: None,
            bpf,
            pods: 0,
        };
        stack.start_operator();
        stack.start_agent();
        stack
    }

    /// Starts (or restarts) the operator.
    pub fn start_operator(&mut self) {
        self.operator_starts += 1;
        self.operator = Some(
            OperatorProcess::start(&self.operator_options, self.operator_starts)
                .expect("start the operator"),
        );
    }

    /// Starts (or restarts) the agent; it is up once its pool holds what it requires.
    pub fn start_agent(&mut self) {
        let starts = self.agent.is_some() as u32;
        let options = self
            .agent_options
            .clone()
            .log_name(&format!("agent-{starts}.log"));
        self.agent = Some(AgentProcess::start(&options).unwrap_or_else(|err| {
            panic!(
                "start the agent: {err}; operator log:\n{}",
                self.operator
                    .as_ref()
                    .map(|o| o.log_tail())
                    .unwrap_or_default()
            )
        }));
    }

    /// The current operator's whole log.
    pub fn operator_log(&mut self) -> String {
        self.operator
            .as_mut()
            .map(|o| std::fs::read_to_string(o.process().log()).unwrap_or_default())
            .unwrap_or_default()
    }

    /// The agent's socket.
    pub fn socket(&self) -> PathBuf {
        self.agent_options.socket()
    }

    /// The agent's IPAM status.
    pub async fn ipam_status(&self) -> agent::IpamStatusResponse {
        let channel = meshwork_proto::connect_unix(&self.socket())
            .await
            .expect("agent socket");
        IpamClient::new(channel)
            .status(agent::IpamStatusRequest {})
            .await
            .expect("Ipam/Status")
            .into_inner()
    }

    /// The operator's gRPC client.
    pub async fn operator_client(&self) -> NodeIpamClient<tonic::transport::Channel> {
        NodeIpamClient::connect(self.operator_options.grpc_url())
            .await
            .expect("connect to the operator")
    }

    /// A new pod namespace with a fresh container ID.
    pub fn new_pod(&mut self) -> Pod {
        self.pods += 1;
        Pod {
            id: format!("{:064x}", 0xc0de_0000_u64 + u64::from(self.pods)),
            netns: self
                .net
                .netns(&format!("eni-pod{}", self.pods))
                .expect("pod namespace"),
        }
    }

    /// The network configuration the runtime passes.
    pub fn netconf(&self) -> Value {
        json!({
            "cniVersion": "1.0.0",
            "name": "meshwork",
            "type": "meshwork-cni",
            "agent-socket": self.socket(),
            "host-netns": self.node.path(),
            "identity": 2000,
        })
    }

    /// Runs the plugin's `command` for `pod` from inside the node namespace, as a runtime
    /// does: its JSON stdout, `Ok` when it exited 0.
    pub fn cni(&self, command: &str, pod: &Pod) -> Result<Value, Value> {
        self.cni_with(command, pod, &self.netconf())
    }

    /// [`Stack::cni`] with another network configuration.
    pub fn cni_with(&self, command: &str, pod: &Pod, conf: &Value) -> Result<Value, Value> {
        let mut child = self
            .node
            .command(cni_binary())
            .env_clear()
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", &pod.id)
            .env("CNI_NETNS", pod.netns.path())
            .env("CNI_IFNAME", "eth0")
            .env(
                "CNI_ARGS",
                format!(
                    "K8S_POD_NAMESPACE=default;K8S_POD_NAME={}",
                    pod.netns.name()
                ),
            )
            .env("CNI_PATH", cni_binary().parent().expect("bin dir"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run meshwork-cni");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(conf.to_string().as_bytes())
            .expect("write the config");
        drop(stdin);
        let out = child.wait_with_output().expect("meshwork-cni output");
        let text = String::from_utf8_lossy(&out.stdout);
        let value = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|err| {
                panic!(
                    "meshwork-cni printed no JSON ({err}): {text:?}; stderr {}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })
        };
        if out.status.success() {
            Ok(value)
        } else {
            Err(value)
        }
    }

    /// CHECK with `prev` (ADD's result) as `prevResult`, as a runtime sends it.
    pub fn check(&self, pod: &Pod, prev: &Value) -> Result<Value, Value> {
        let mut conf = self.netconf();
        conf["prevResult"] = prev.clone();
        self.cni_with("CHECK", pod, &conf)
    }

    /// ADD, which must succeed; the pod's address.
    pub fn add(&self, pod: &Pod) -> String {
        let result = self.cni("ADD", pod).unwrap_or_else(|err| {
            panic!(
                "ADD failed: {err}; agent log:\n{}",
                self.agent
                    .as_ref()
                    .map(|a| a.log_tail())
                    .unwrap_or_default()
            )
        });
        let address = result["ips"][0]["address"]
            .as_str()
            .unwrap_or_else(|| panic!("no address in {result}"));
        address.split('/').next().unwrap_or_default().to_owned()
    }

    /// The instance's ENIs as EC2 describes them now.
    async fn described_enis(&self) -> Vec<aws_sdk_ec2::types::NetworkInterface> {
        self.scene
            .sdk
            .describe_network_interfaces()
            .filters(
                aws_sdk_ec2::types::Filter::builder()
                    .name("attachment.instance-id")
                    .values(&self.scene.instances[0])
                    .build(),
            )
            .send()
            .await
            .expect("DescribeNetworkInterfaces")
            .network_interfaces
            .unwrap_or_default()
    }

    /// The ENIs EC2 has attached to the instance now.
    pub async fn ec2_enis(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .described_enis()
            .await
            .iter()
            .filter_map(|eni| eni.network_interface_id().map(str::to_owned))
            .collect();
        ids.sort();
        ids
    }

    /// Every private address EC2 has on the instance's ENIs now.
    pub async fn ec2_addresses(&self) -> BTreeSet<String> {
        self.described_enis()
            .await
            .iter()
            .flat_map(|eni| eni.private_ip_addresses())
            .filter_map(|address| address.private_ip_address().map(str::to_owned))
            .collect()
    }

    /// The node's CiliumNode as stored.
    pub async fn stored_node(&self) -> Value {
        let out = self
            .etcd
            .ctl(&[
                "get",
                &format!("meshwork/ciliumnodes/v1/{NODE}"),
                "--print-value-only",
            ])
            .expect("etcdctl get");
        serde_json::from_str(out.trim()).unwrap_or_else(|err| panic!("{err}: {out:?}"))
    }

    /// Waits until `check` holds for the stored CiliumNode; returns it.
    pub async fn wait_stored(&self, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        let mut last = Value::Null;
        let found = Wait::new(what.to_owned())
            .timeout(DEADLINE)
            .some_async(|| {
                let node = self.stored_node_now();
                let ok = node.as_ref().is_some_and(&check);
                if let Some(node) = &node {
                    last.clone_from(node);
                }
                async move { ok.then_some(()) }
            })
            .await;
        match found {
            Ok(()) => last,
            Err(err) => panic!("{err}: stored {last}"),
        }
    }

    /// The node's CiliumNode as the operator stored it at `generation` (its etcd mod
    /// revision), or why there is none of that revision.
    pub fn stored_at(&self, generation: &str) -> Result<Value, String> {
        let revision: i64 = generation
            .parse()
            .map_err(|_| format!("generation {generation:?} is no etcd revision"))?;
        let out = self
            .etcd
            .ctl(&[
                "get",
                &format!("meshwork/ciliumnodes/v1/{NODE}"),
                &format!("--rev={revision}"),
                "-w",
                "json",
            ])
            .map_err(|err| err.to_string())?;
        let reply: Value = serde_json::from_str(&out).map_err(|err| err.to_string())?;
        let kv = &reply["kvs"][0];
        if kv["mod_revision"].as_i64() != Some(revision) {
            return Err(format!(
                "no write of the node at revision {revision}: {reply}"
            ));
        }
        let value = kv["value"].as_str().ok_or("no value")?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(value)
            .map_err(|err| format!("value is not base64: {err}"))?;
        serde_json::from_slice(&bytes).map_err(|err| err.to_string())
    }

    /// etcd's current revision.
    pub fn revision(&self) -> i64 {
        let out = self
            .etcd
            .ctl(&[
                "get",
                &format!("meshwork/ciliumnodes/v1/{NODE}"),
                "-w",
                "json",
            ])
            .expect("etcdctl get");
        let reply: Value = serde_json::from_str(&out).unwrap_or_else(|err| panic!("{err}: {out}"));
        reply["header"]["revision"]
            .as_i64()
            .unwrap_or_else(|| panic!("no revision in {reply}"))
    }

    /// Every version of the node's CiliumNode written after etcd revision `after`, oldest
    /// first (the tests' etcd is never compacted).
    pub fn versions_after(&self, after: i64) -> Vec<Value> {
        (after + 1..=self.revision())
            .filter_map(|revision| self.stored_at(&revision.to_string()).ok())
            .collect()
    }

    fn stored_node_now(&self) -> Option<Value> {
        let out = self
            .etcd
            .ctl(&[
                "get",
                &format!("meshwork/ciliumnodes/v1/{NODE}"),
                "--print-value-only",
            ])
            .ok()?;
        serde_json::from_str(out.trim()).ok()
    }

    /// Waits until `check` holds for the agent's IPAM status.
    pub async fn wait_status(
        &self,
        what: &str,
        check: impl Fn(&agent::IpamStatusResponse) -> bool,
    ) -> agent::IpamStatusResponse {
        let socket = self.socket();
        Wait::new(what.to_owned())
            .timeout(DEADLINE)
            .some_async(|| {
                let socket = socket.clone();
                let check = &check;
                async move {
                    let channel = meshwork_proto::connect_unix(&socket).await.ok()?;
                    let status = IpamClient::new(channel)
                        .status(agent::IpamStatusRequest {})
                        .await
                        .ok()?
                        .into_inner();
                    check(&status).then_some(status)
                }
            })
            .await
            .unwrap_or_else(|err| panic!("{err}"))
    }
}
