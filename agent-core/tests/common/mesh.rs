//! A cluster mesh of real actors for tests: barrier, remote state, identities, mesh.

use std::time::Duration;

use actix::{Actor, Addr};
use meshwork_agent_core::clustermesh::barrier::SyncBarrier;
use meshwork_agent_core::clustermesh::barrier_actor::{GetMeshWait, SyncBarrierActor};
use meshwork_agent_core::clustermesh::config_dir::{ClusterConfigEvent, RemoteClusterConfig};
use meshwork_agent_core::clustermesh::identity_actor::IdentityCacheActor;
use meshwork_agent_core::clustermesh::mesh::{ClusterMesh, GetMeshStatus};
use meshwork_agent_core::clustermesh::remote_cluster::runner::MeshSettings;
use meshwork_agent_core::clustermesh::remote_cluster::stores::Sinks;
use meshwork_agent_core::clustermesh::remote_state::{
    Contribution, GetContribution, RemoteStateActor,
};
use meshwork_agent_core::clustermesh::status::ClusterStatus;
use meshwork_agent_core::clustermesh::{SyncKind, WaitError, WaitOutcome};
use meshwork_agent_core::kvstore::{EtcdBackend, EtcdConfig, KvstoreError, KvstoreMetrics};
use meshwork_lab::cilium::Cluster;
use meshwork_lab::etcd::EtcdServer;

pub struct Mesh {
    pub mesh: Addr<ClusterMesh>,
    pub barrier: Addr<SyncBarrierActor>,
    pub state: Addr<RemoteStateActor>,
    pub metrics: KvstoreMetrics,
}

impl Mesh {
    /// Starts the actors (call inside an actix system) for local cluster `local`/`local_id`.
    pub fn start(local: &str, local_id: u32, breaker: Duration) -> Self {
        let barrier = SyncBarrierActor::new(SyncBarrier::new(breaker)).start();
        let state = RemoteStateActor::new(barrier.clone().recipient()).start();
        let identities = IdentityCacheActor::default().start();
        let metrics = KvstoreMetrics::default();
        let sinks = Sinks {
            barrier: barrier.clone().recipient(),
            state: state.clone().recipient(),
            identities: identities.recipient(),
        };
        let mut settings = MeshSettings::new(local);
        settings.min_retry_delay = Duration::from_millis(100);
        settings.max_retry_delay = Duration::from_secs(1);
        settings.connect_timeout = Duration::from_secs(3);
        let mesh = ClusterMesh::new(settings, local_id, sinks, metrics.clone()).start();
        Self {
            mesh,
            barrier,
            state,
            metrics,
        }
    }

    pub async fn add(&self, name: &str, etcd: EtcdConfig) {
        let config = RemoteClusterConfig {
            name: name.to_owned(),
            etcd,
            hash: 0,
        };
        self.mesh
            .send(ClusterConfigEvent::Upsert {
                name: name.to_owned(),
                config,
            })
            .await
            .unwrap();
    }

    pub async fn add_server(&self, name: &str, server: &EtcdServer) {
        self.add(name, EtcdConfig::new([server.endpoint()])).await;
    }

    pub async fn remove(&self, name: &str) {
        self.mesh
            .send(ClusterConfigEvent::Remove {
                name: name.to_owned(),
            })
            .await
            .unwrap();
    }

    pub async fn status(&self, name: &str) -> ClusterStatus {
        let statuses = self.mesh.send(GetMeshStatus).await.unwrap();
        statuses
            .into_iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no status for {name}"))
    }

    /// Polls the status of `name` until `check` holds; fails with the last status.
    pub async fn status_until(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&ClusterStatus) -> bool,
    ) -> ClusterStatus {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let status = self.status(name).await;
            if check(&status) {
                return status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}; last status {status:#?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn wait(
        &self,
        kind: SyncKind,
        timeout: Option<Duration>,
    ) -> Result<WaitOutcome, WaitError> {
        let wait = self.barrier.send(GetMeshWait(kind)).await.unwrap();
        wait.wait(timeout.map(|t| tokio::time::Instant::now() + t))
            .await
    }

    pub async fn contribution(&self, cluster: &str) -> Contribution {
        self.state
            .send(GetContribution(cluster.to_owned()))
            .await
            .unwrap()
    }
}

/// Writes the cluster config, the state and the canaries of `cluster`.
pub async fn load(backend: &EtcdBackend, cluster: &Cluster) -> Result<(), KvstoreError> {
    let (key, value) = cluster.config();
    backend.put(&key, value).await?;
    backend.put_many(cluster.state(), 100).await?;
    backend.put_many(cluster.canaries(), 100).await?;
    Ok(())
}
