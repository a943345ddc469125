//! The device supervisor: applies the [`PeerTable`]'s plans to a WireGuard device, removes
//! obsolete restored peers once allowed, and notices a device that vanished (recreating it
//! through the userspace fallback and configuring it again from scratch). A plain state
//! machine over a [`Backend`]; the agent's `WireGuard` actor owns its timers.
//!
//! Device calls block (bounded by the backend's I/O timeouts), so whoever drives a device
//! runs on a thread of its own.

use super::LISTEN_PORT;
use super::backend::{Backend, BackendError, DeviceState, DeviceUpdate, PeerUpdate};
use super::key::PrivateKey;
use super::local_node::LocalNode;
use super::peers::PeerTable;
use super::status::{EncryptStatus, PeerStatus, PendingGc};
use super::userspace::{Ensured, Userspace, UserspaceError};

/// Why the device could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The userspace implementation could not be started.
    #[error(transparent)]
    Userspace(#[from] UserspaceError),
    /// The device could not be read or configured.
    #[error(transparent)]
    Device(#[from] BackendError),
}

/// What a failed [`Device::sync`] calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Try again later.
    Retry,
    /// The device vanished: probe it (which recreates it when possible).
    Gone,
}

/// A WireGuard device, the agent's private key on it.
pub struct Device {
    backend: Box<dyn Backend>,
    private_key: PrivateKey,
    userspace: Option<Userspace>,
    up: bool,
    recreations: u64,
    last_error: Option<String>,
}

impl Device {
    /// Brings the device up (starting the userspace fallback if configured), reads its peers
    /// (the restored ones) and sets the private key, and the listen port unless the device
    /// already listens there. Peers stay as they are.
    pub fn open(
        backend: Box<dyn Backend>,
        private_key: PrivateKey,
        mut userspace: Option<Userspace>,
    ) -> Result<(Self, DeviceState), StartError> {
        if let Some(userspace) = &mut userspace
            && userspace.ensure()? == Ensured::Reused
        {
            tracing::info!(
                device = backend.device(),
                "reusing the running userspace WireGuard device"
            );
        }
        let mut device = Self {
            backend,
            private_key,
            userspace,
            up: true,
            recreations: 0,
            last_error: None,
        };
        let restored = device.backend.get()?;
        tracing::info!(
            device = device.backend.device(),
            peers = restored.peers.len(),
            "restored WireGuard peers"
        );
        device.configure(restored.listen_port)?;
        Ok((device, restored))
    }

    /// Sets the private key, and the listen port unless `current_port` is it already:
    /// wireguard-go rebinds its socket on every `listen_port` it is given, losing what
    /// arrives meanwhile, so a restarted agent must not touch a port that is right.
    fn configure(&mut self, current_port: u16) -> Result<(), BackendError> {
        self.backend.set(&DeviceUpdate {
            private_key: Some(self.private_key.secret()),
            listen_port: (current_port != LISTEN_PORT).then_some(LISTEN_PORT),
            peers: Vec::new(),
        })
    }

    /// Applies what changed in `table`, then removes the obsolete restored peers it allows.
    /// Nothing happens while the device is known to be gone.
    pub fn sync(&mut self, table: &mut PeerTable) -> Result<(), Failure> {
        if !self.up {
            return Err(Failure::Gone);
        }
        let applied = self
            .apply(table)
            .and_then(|()| gc_pass(table, self.backend.as_mut()));
        match applied {
            Ok(_) => {
                self.last_error = None;
                Ok(())
            }
            Err(err) => {
                tracing::warn!(%err, "WireGuard device request failed, retrying");
                self.last_error = Some(err.to_string());
                if err.is_gone() {
                    self.up = false;
                    Err(Failure::Gone)
                } else {
                    Err(Failure::Retry)
                }
            }
        }
    }

    fn apply(&mut self, table: &mut PeerTable) -> Result<(), BackendError> {
        if !table.has_changes() {
            return Ok(());
        }
        let plan = table.plan();
        match self.backend.set(&plan.update) {
            Ok(()) => {
                table.commit(plan);
                Ok(())
            }
            Err(err) => {
                table.fail(plan);
                Err(err)
            }
        }
    }

    /// Checks that the device answers. One that vanished is recreated (with the fallback)
    /// and configured again; the table then has everything to apply anew. Answers whether
    /// the device was configured again (a [`Self::sync`] should follow).
    pub fn probe(&mut self, table: &mut PeerTable) -> bool {
        match self.backend.probe() {
            Ok(()) if self.up => return false,
            // It came back empty (someone else recreated it): configure it below.
            Ok(()) => {}
            Err(err) if err.is_gone() => {
                self.up = false;
                let Some(userspace) = &mut self.userspace else {
                    return false;
                };
                if let Err(err) = userspace.ensure() {
                    self.last_error = Some(err.to_string());
                    return false;
                }
            }
            Err(err) => {
                self.last_error = Some(err.to_string());
                return false;
            }
        }
        // A recreated device listens nowhere yet.
        if let Err(err) = self.configure(0) {
            self.last_error = Some(err.to_string());
            return false;
        }
        tracing::warn!(
            device = self.backend.device(),
            "WireGuard device was gone: configured again"
        );
        self.recreations += 1;
        self.up = true;
        table.device_reset();
        true
    }

    /// What `meshctl encrypt status` shows: the device as it reports itself now, and what
    /// the table still keeps for the waits.
    pub fn status(&mut self, table: &PeerTable, local_node: &LocalNode) -> EncryptStatus {
        let device = self.backend.get();
        let rejections = table.rejections();
        let local_node = local_node.node(&self.private_key.public_key());
        let mut status = EncryptStatus {
            device: self.backend.device().to_owned(),
            backend: self.backend.kind().to_owned(),
            public_key: local_node.wireguard_pub_key.clone(),
            local_node,
            device_up: device.is_ok(),
            userspace_pid: self.userspace.as_mut().and_then(Userspace::pid),
            device_recreations: self.recreations,
            rejected_duplicate_keys: rejections.duplicate_keys,
            rejected_malformed_keys: rejections.malformed_keys,
            last_error: self.last_error.clone(),
            pending_gc: table
                .pending_gc()
                .into_iter()
                .map(|(key, wait)| PendingGc {
                    public_key: key.to_base64(),
                    wait: wait.cilium_name().to_owned(),
                })
                .collect(),
            ..EncryptStatus::default()
        };
        match device {
            Ok(device) => {
                status.listen_port = device.listen_port;
                status.peers = device
                    .peers
                    .into_iter()
                    .map(|peer| PeerStatus {
                        public_key: peer.key.to_base64(),
                        node: table.owner(&peer.key),
                        endpoint: peer.endpoint.map(|e| e.to_string()),
                        allowed_ips: peer.allowed_ips.iter().map(ToString::to_string).collect(),
                        last_handshake: peer.last_handshake,
                        rx_bytes: peer.rx_bytes,
                        tx_bytes: peer.tx_bytes,
                    })
                    .collect();
            }
            Err(err) => status.last_error = Some(err.to_string()),
        }
        status
    }
}

/// Removes obsolete restored peers one at a time; the first error stops the pass (the rest
/// wait for the retry). Returns how many were removed.
pub fn gc_pass(table: &mut PeerTable, backend: &mut dyn Backend) -> Result<usize, BackendError> {
    let mut removed = 0;
    while let Some(key) = table.next_gc() {
        backend.set(&DeviceUpdate {
            peers: vec![PeerUpdate::remove(key)],
            ..DeviceUpdate::default()
        })?;
        tracing::info!(peer = %key, "removed obsolete restored WireGuard peer");
        table.gc_done(&key);
        removed += 1;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::PeerState;
    use crate::key::Key;

    /// A device that fails the `fail_at`-th request.
    struct Flaky {
        state: DeviceState,
        requests: usize,
        fail_at: usize,
    }

    impl Backend for Flaky {
        fn device(&self) -> &str {
            "flaky"
        }
        fn kind(&self) -> &'static str {
            "test"
        }
        fn get(&mut self) -> Result<DeviceState, BackendError> {
            Ok(self.state.clone())
        }
        fn set(&mut self, update: &DeviceUpdate) -> Result<(), BackendError> {
            self.requests += 1;
            if self.requests == self.fail_at {
                return Err(BackendError::Refused {
                    device: "flaky".into(),
                    errno: -5,
                });
            }
            for peer in &update.peers {
                assert!(peer.remove);
                self.state.peers.retain(|p| p.key != peer.key);
            }
            Ok(())
        }
    }

    fn peer(n: u8) -> PeerState {
        PeerState {
            key: Key([n; 32]),
            endpoint: None,
            allowed_ips: Vec::new(),
            last_handshake: None,
            rx_bytes: 0,
            tx_bytes: 0,
        }
    }

    #[test]
    fn a_removal_error_stops_the_pass_and_the_retry_finishes_it() {
        let mut backend = Flaky {
            state: DeviceState {
                peers: vec![peer(1), peer(2), peer(3)],
                ..DeviceState::default()
            },
            requests: 0,
            fail_at: 2,
        };
        let mut table = PeerTable::new(false);
        table.restore(&backend.state);
        assert_eq!(
            gc_pass(&mut table, &mut backend).unwrap(),
            0,
            "not before NodesSynced"
        );
        table.nodes_synced();
        assert!(gc_pass(&mut table, &mut backend).is_err());
        assert_eq!(backend.state.peers.len(), 2, "stopped at the error");
        assert_eq!(backend.requests, 2);
        assert_eq!(gc_pass(&mut table, &mut backend).unwrap(), 2);
        assert!(backend.state.peers.is_empty());
        assert!(table.pending_gc().is_empty());
    }

    #[test]
    fn a_failed_sync_asks_for_a_retry_and_keeps_the_error() {
        let backend = Flaky {
            state: DeviceState {
                peers: vec![peer(1)],
                ..DeviceState::default()
            },
            requests: 0,
            // Request 1 configures the device at open; request 2 is the GC.
            fail_at: 2,
        };
        let (mut device, restored) =
            Device::open(Box::new(backend), PrivateKey::generate(), None).unwrap();
        let mut table = PeerTable::new(false);
        table.restore(&restored);
        table.nodes_synced();
        assert_eq!(device.sync(&mut table), Err(Failure::Retry));
        let status = device.status(&table, &LocalNode::default());
        assert!(status.last_error.is_some_and(|e| e.contains("errno=-5")));
        assert_eq!(device.sync(&mut table), Ok(()));
        assert!(table.pending_gc().is_empty());
        assert!(
            !device.probe(&mut table),
            "an answering device needs nothing"
        );
    }

    /// Records every update it is sent.
    struct Recorder {
        state: DeviceState,
        updates: std::sync::Arc<std::sync::Mutex<Vec<DeviceUpdate>>>,
    }

    impl Backend for Recorder {
        fn device(&self) -> &str {
            "recorder"
        }
        fn kind(&self) -> &'static str {
            "test"
        }
        fn get(&mut self) -> Result<DeviceState, BackendError> {
            Ok(self.state.clone())
        }
        fn set(&mut self, update: &DeviceUpdate) -> Result<(), BackendError> {
            self.updates.lock().unwrap().push(update.clone());
            Ok(())
        }
    }

    #[test]
    fn a_reused_device_on_the_right_port_is_not_rebound() {
        for (port, expected) in [
            (LISTEN_PORT, None),
            (0, Some(LISTEN_PORT)),
            (51820, Some(LISTEN_PORT)),
        ] {
            let updates = std::sync::Arc::default();
            let backend = Recorder {
                state: DeviceState {
                    listen_port: port,
                    has_private_key: port != 0,
                    peers: vec![peer(1)],
                },
                updates: std::sync::Arc::clone(&updates),
            };
            let key = PrivateKey::generate();
            let (_device, restored) = Device::open(Box::new(backend), key.clone(), None).unwrap();
            assert_eq!(restored.peers.len(), 1);
            let updates = updates.lock().unwrap();
            assert_eq!(updates.len(), 1, "one configuring request at open");
            assert_eq!(updates[0].listen_port, expected, "device on port {port}");
            assert_eq!(updates[0].private_key, Some(key.secret()));
            assert!(updates[0].peers.is_empty(), "restored peers stay");
        }
    }
}
