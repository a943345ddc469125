//! WireGuard wiring: flags, the `WireGuard` actor's start, and the `meshwork.agent.v1.Encrypt`
//! service.

use std::path::PathBuf;
use std::time::UNIX_EPOCH;

use actix::Addr;
use anyhow::Context as _;
use meshwork_agent_core::clustermesh::barrier_actor::SyncBarrierActor;
use meshwork_agent_core::clustermesh::remote_state::RemoteStateActor;
use meshwork_agent_core::wireguard::actor::{ArmGc, GetEncryptStatus, WireGuard, WireGuardConfig};
use meshwork_agent_core::wireguard::backend::Backend;
use meshwork_agent_core::wireguard::key::PrivateKey;
use meshwork_agent_core::wireguard::local_node::LocalNode;
use meshwork_agent_core::wireguard::metrics::WireguardMetrics;
use meshwork_agent_core::wireguard::netlink::{KernelBackend, kernel_has_wireguard};
use meshwork_agent_core::wireguard::status::EncryptStatus;
use meshwork_agent_core::wireguard::uapi::UapiBackend;
use meshwork_agent_core::wireguard::userspace::Userspace;
use meshwork_agent_core::wireguard::{DEFAULT_DEVICE, PRIVATE_KEY_FILE};
use meshwork_proto::agent::v1 as pb;
use prometheus_client::registry::Registry;
use tonic::{Request, Response, Status};

/// The WireGuard flags (Cilium's names).
#[derive(Debug, Clone, clap::Args)]
pub struct WireguardArgs {
    /// Encrypt traffic to remote nodes with WireGuard (one peer per remote node).
    #[arg(long)]
    pub enable_wireguard: bool,

    /// The WireGuard device.
    #[arg(long, default_value = DEFAULT_DEVICE, value_name = "NAME")]
    pub wireguard_device: String,

    /// Without WireGuard in the kernel, run and supervise a userspace implementation for the
    /// device (reused across agent restarts, recreated when it vanishes).
    #[arg(long)]
    pub wireguard_userspace_fallback: bool,

    /// The userspace implementation to run (default: `wireguard-go` from PATH); called as
    /// `BIN -f DEVICE`.
    #[arg(long, value_name = "PATH", requires = "wireguard_userspace_fallback")]
    pub wireguard_userspace_bin: Option<PathBuf>,

    /// Also encrypt node-to-node traffic: node IPs become allowed IPs of their peers.
    #[arg(long)]
    pub encrypt_node: bool,
}

/// Starts the `WireGuard` actor when enabled: the device comes up (or is reused) with its
/// peers restored, before any remote event arrives. Its metrics go into `registry`.
pub fn start(
    args: &WireguardArgs,
    state_dir: &std::path::Path,
    local_node: LocalNode,
    registry: &mut Registry,
) -> anyhow::Result<Option<Addr<WireGuard>>> {
    if !args.enable_wireguard {
        return Ok(None);
    }
    let device = args.wireguard_device.as_str();
    let private_key = PrivateKey::load_or_create(&state_dir.join(PRIVATE_KEY_FILE))?;
    let uapi = UapiBackend::new(device);
    let (backend, userspace): (Box<dyn Backend>, _) =
        if args.wireguard_userspace_fallback && !kernel_has_wireguard() {
            let userspace = Userspace::new(args.wireguard_userspace_bin.clone(), device);
            (Box::new(uapi), Some(userspace))
        } else if uapi.is_up() {
            // A userspace device someone else runs.
            (Box::new(uapi), None)
        } else if kernel_has_wireguard() {
            (Box::new(KernelBackend::new(device)), None)
        } else {
            anyhow::bail!(
                "--enable-wireguard: the kernel has no WireGuard and no userspace device {device} \
             answers; add --wireguard-userspace-fallback"
            );
        };
    let actor = WireGuard::new(WireGuardConfig {
        backend,
        private_key: private_key.clone(),
        encrypt_node: args.encrypt_node,
        userspace,
        metrics: WireguardMetrics::register(registry),
        local_node,
    })
    .with_context(|| format!("setting up the WireGuard device {device}"))?;
    tracing::info!(device, public_key = %private_key.public_key(), "WireGuard enabled");
    Ok(Some(actor.start_own_arbiter()))
}

/// Adds the actor as a subscriber of remote events.
pub fn subscribe(state: RemoteStateActor, wireguard: Option<&Addr<WireGuard>>) -> RemoteStateActor {
    match wireguard {
        Some(wireguard) => state.with_subscriber(wireguard.clone().recipient()),
        None => state,
    }
}

/// Once every configured cluster is known to the barrier: start the waits that gate GC.
pub fn arm(wireguard: Option<&Addr<WireGuard>>, barrier: &Addr<SyncBarrierActor>) {
    if let Some(wireguard) = wireguard {
        wireguard.do_send(ArmGc(barrier.clone().recipient()));
    }
}

/// Serves `meshwork.agent.v1.Encrypt`.
pub struct EncryptApi(pub Option<Addr<WireGuard>>);

#[tonic::async_trait]
impl pb::encrypt_server::Encrypt for EncryptApi {
    async fn status(
        &self,
        _: Request<pb::EncryptStatusRequest>,
    ) -> Result<Response<pb::EncryptStatusResponse>, Status> {
        let Some(wireguard) = &self.0 else {
            return Err(Status::failed_precondition(
                "WireGuard is not enabled (--enable-wireguard)",
            ));
        };
        let status = wireguard
            .send(GetEncryptStatus)
            .await
            .map_err(|_| Status::unavailable("the agent is shutting down"))?;
        Ok(Response::new(to_proto(status)))
    }
}

fn to_proto(s: EncryptStatus) -> pb::EncryptStatusResponse {
    pb::EncryptStatusResponse {
        device: s.device,
        backend: s.backend,
        public_key: s.public_key,
        listen_port: u32::from(s.listen_port),
        device_up: s.device_up,
        userspace_pid: s.userspace_pid.unwrap_or(0),
        device_recreations: s.device_recreations,
        peers: s
            .peers
            .into_iter()
            .map(|p| pb::WireguardPeer {
                public_key: p.public_key,
                node: p.node.unwrap_or_default(),
                endpoint: p.endpoint.unwrap_or_default(),
                allowed_ips: p.allowed_ips,
                last_handshake_unix: p
                    .last_handshake
                    .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                    .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX)),
                rx_bytes: p.rx_bytes,
                tx_bytes: p.tx_bytes,
            })
            .collect(),
        pending_gc: s
            .pending_gc
            .into_iter()
            .map(|p| pb::PendingGc {
                public_key: p.public_key,
                wait: p.wait,
            })
            .collect(),
        rejected_duplicate_keys: s.rejected_duplicate_keys,
        rejected_malformed_keys: s.rejected_malformed_keys,
        last_error: s.last_error,
        local_node_json: String::from_utf8(s.local_node.to_json()).unwrap_or_default(),
    }
}
