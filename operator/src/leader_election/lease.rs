//! The Lease object (`coordination.k8s.io/v1`) the election runs on, behind [`LeaseApi`]:
//! [`KubeLease`] is one named Lease in one namespace, read with GET and written with POST
//! (create) or PUT (update, guarded by the resourceVersion read).

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};

use super::state::{Observed, Record};

/// Why a Lease request failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Another writer changed (or created) the Lease since it was read: read it again.
    #[error("the lease changed since it was read")]
    Conflict,
    /// The Kubernetes API refused or could not be reached.
    #[error("kubernetes: {0}")]
    Kube(#[source] kube::Error),
    /// The Lease read has no resourceVersion, so it cannot be written safely.
    #[error("the lease has no resourceVersion")]
    NoResourceVersion,
}

impl From<kube::Error> for LeaseError {
    fn from(err: kube::Error) -> Self {
        match &err {
            kube::Error::Api(status) if status.is_conflict() || status.is_already_exists() => {
                Self::Conflict
            }
            _ => Self::Kube(err),
        }
    }
}

/// The lock the election reads and writes.
pub trait LeaseApi: Send + Sync {
    /// The Lease as it is now; `None` if there is none.
    fn get(&self) -> impl Future<Output = Result<Option<Observed>, LeaseError>> + Send;

    /// Creates the Lease holding `record`.
    fn create(&self, record: &Record) -> impl Future<Output = Result<(), LeaseError>> + Send;

    /// Replaces the Lease's record with `record`, if it is still at `resource_version`.
    fn update(
        &self,
        record: &Record,
        resource_version: &str,
    ) -> impl Future<Output = Result<(), LeaseError>> + Send;
}

/// One Lease in the Kubernetes API.
#[derive(Clone)]
pub struct KubeLease {
    api: Api<Lease>,
    name: String,
}

impl std::fmt::Debug for KubeLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeLease")
            .field("name", &self.name)
            .finish()
    }
}

impl KubeLease {
    /// Lease `name` in `namespace`, through `client`.
    pub fn new(client: Client, namespace: &str, name: impl Into<String>) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.into(),
        }
    }

    fn object(&self, record: &Record, resource_version: Option<&str>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                resource_version: resource_version.map(str::to_owned),
                ..ObjectMeta::default()
            },
            spec: Some(to_spec(record)),
        }
    }
}

impl LeaseApi for KubeLease {
    async fn get(&self) -> Result<Option<Observed>, LeaseError> {
        let Some(lease) = self.api.get_opt(&self.name).await? else {
            return Ok(None);
        };
        let resource_version = lease
            .metadata
            .resource_version
            .clone()
            .ok_or(LeaseError::NoResourceVersion)?;
        Ok(Some(Observed {
            record: from_spec(lease.spec.as_ref()),
            resource_version,
        }))
    }

    async fn create(&self, record: &Record) -> Result<(), LeaseError> {
        let lease = self.object(record, None);
        self.api.create(&PostParams::default(), &lease).await?;
        Ok(())
    }

    async fn update(&self, record: &Record, resource_version: &str) -> Result<(), LeaseError> {
        let lease = self.object(record, Some(resource_version));
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await?;
        Ok(())
    }
}

/// The record a Lease spec carries (a missing spec or field reads as empty or zero).
pub fn from_spec(spec: Option<&LeaseSpec>) -> Record {
    let Some(spec) = spec else {
        return Record {
            holder: String::new(),
            lease_duration_seconds: 0,
            acquire_time: None,
            renew_time: None,
            transitions: 0,
        };
    };
    Record {
        holder: spec.holder_identity.clone().unwrap_or_default(),
        lease_duration_seconds: spec.lease_duration_seconds.unwrap_or(0),
        acquire_time: spec.acquire_time.as_ref().map(|time| time.0),
        renew_time: spec.renew_time.as_ref().map(|time| time.0),
        transitions: spec.lease_transitions.unwrap_or(0),
    }
}

/// The Lease spec carrying `record` (an empty holder is written as `""`, as client-go
/// writes a released lease).
pub fn to_spec(record: &Record) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(record.holder.clone()),
        lease_duration_seconds: Some(record.lease_duration_seconds),
        acquire_time: record.acquire_time.map(MicroTime),
        renew_time: record.renew_time.map(MicroTime),
        lease_transitions: Some(record.transitions),
        ..LeaseSpec::default()
    }
}
