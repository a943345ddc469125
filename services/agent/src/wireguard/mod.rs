//! WireGuard: the flags, the device opened at start, the `WireGuard` actor and the
//! `meshwork.agent.v1.Encrypt` service.

pub mod actor;

use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use actix::{Addr, Recipient};
use meshwork_clustermesh::barrier_actor::BarrierUpdate;
use meshwork_proto::agent::v1 as pb;
use meshwork_wireguard::backend::{Backend, DeviceState};
use meshwork_wireguard::device::{Device, StartError};
use meshwork_wireguard::key::{KeyError, PrivateKey};
use meshwork_wireguard::local_node::LocalNode;
use meshwork_wireguard::metrics::WireguardMetrics;
use meshwork_wireguard::netlink::{KernelBackend, kernel_has_wireguard};
use meshwork_wireguard::status::EncryptStatus;
use meshwork_wireguard::uapi::UapiBackend;
use meshwork_wireguard::userspace::Userspace;
use meshwork_wireguard::{DEFAULT_DEVICE, PRIVATE_KEY_FILE};
use prometheus_client::registry::Registry;
use tonic::{Request, Response, Status};

use self::actor::{GetEncryptStatus, WireGuard};

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

/// Why WireGuard could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum WireguardError {
    /// The private key file could not be read or written.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// No way to drive the device.
    #[error(
        "--enable-wireguard: the kernel has no WireGuard and no userspace device {0} answers; \
         add --wireguard-userspace-fallback"
    )]
    NoDevice(String),
    /// The device could not be brought up or configured.
    #[error("setting up the WireGuard device {device}: {error}")]
    Device {
        /// The device.
        device: String,
        /// Why.
        error: StartError,
    },
}

/// The device, opened (up, key and port set, peers read), not yet driven by an actor.
pub struct OpenDevice {
    public_key: String,
    device: Device,
    restored: DeviceState,
    encrypt_node: bool,
    metrics: WireguardMetrics,
    local_node: LocalNode,
}

/// Opens the device when WireGuard is enabled: it comes up (or is reused) with its peers
/// restored, before any remote event arrives. Its metrics go into `registry`.
pub fn open(
    args: &WireguardArgs,
    state_dir: &Path,
    local_node: LocalNode,
    registry: &mut Registry,
) -> Result<Option<OpenDevice>, WireguardError> {
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
            return Err(WireguardError::NoDevice(device.to_owned()));
        };
    let public_key = private_key.public_key();
    let (opened, restored) =
        Device::open(backend, private_key, userspace).map_err(|source| WireguardError::Device {
            device: device.to_owned(),
            error: source,
        })?;
    tracing::info!(device, public_key = %public_key, "WireGuard enabled");
    Ok(Some(OpenDevice {
        public_key: public_key.to_string(),
        device: opened,
        restored,
        encrypt_node: args.encrypt_node,
        metrics: WireguardMetrics::register(registry),
        local_node,
    }))
}

impl OpenDevice {
    /// The node's public key, base64 (what it publishes as `WireguardPubKey`).
    pub fn public_key(&self) -> &str {
        &self.public_key
    }

    /// Starts the actor driving the device, on its own arbiter, acknowledging to `barrier`.
    pub fn start(self, barrier: Recipient<BarrierUpdate>) -> Addr<WireGuard> {
        WireGuard::new(
            self.device,
            &self.restored,
            self.encrypt_node,
            self.metrics,
            self.local_node,
            barrier,
        )
        .start_own_arbiter()
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
