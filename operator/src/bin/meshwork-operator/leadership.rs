//! The operator's side of leader election (`--kube` only): the election runs in its own task
//! from the start; the operator starts allocating and serving once it leads, and stops (and
//! exits non-zero, to be restarted as a candidate) if it loses.

use anyhow::{Context as _, bail};
use meshwork_operator::leader_election::{
    self, Elector, Ended, KubeLease, LEASE_NAME, LeaderElectionArgs, Role,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The running election.
pub struct Leadership {
    role: watch::Receiver<Role>,
    stop: CancellationToken,
    task: JoinHandle<Ended>,
}

impl Leadership {
    /// Starts campaigning for the Lease in `--k8s-namespace` (else the client's namespace).
    pub fn start(client: &kube::Client, args: &LeaderElectionArgs) -> Self {
        let namespace = args
            .k8s_namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_owned());
        let lease = KubeLease::new(client.clone(), &namespace, LEASE_NAME);
        let mut elector = Elector::new(leader_election::identity(), args.timing());
        tracing::info!(%namespace, lease = LEASE_NAME, identity = elector.identity(),
            "leader election: campaigning");
        let (sender, role) = watch::channel(Role::Candidate { holder: None });
        let stop = CancellationToken::new();
        let token = stop.clone();
        let task = tokio::spawn(async move {
            leader_election::run(&lease, &mut elector, &token, &sender).await
        });
        Self { role, stop, task }
    }

    /// Waits until this replica leads.
    pub async fn leading(&mut self) -> anyhow::Result<()> {
        let role = self
            .role
            .wait_for(|role| matches!(role, Role::Leader | Role::Lost))
            .await
            .context("the leader election ended")?;
        if *role == Role::Lost {
            bail!("leader election lost before leading");
        }
        Ok(())
    }

    /// Resolves once leadership is lost.
    pub async fn lost(&mut self) {
        if self
            .role
            .wait_for(|role| *role == Role::Lost)
            .await
            .is_err()
        {
            // The election task ended without losing (stopped): never resolves.
            std::future::pending::<()>().await;
        }
    }

    /// Stops campaigning, giving the lease up if this replica holds it.
    pub async fn stop(self) {
        self.stop.cancel();
        match self.task.await {
            Ok(Ended::Stopped | Ended::Lost) => {}
            Err(err) => tracing::warn!(%err, "leader election task failed"),
        }
    }
}
