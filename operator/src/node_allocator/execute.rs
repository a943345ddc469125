//! Carrying out a planned mutation through EC2, and recording its result in the cache so the
//! next plan sees it without a describe.

use std::net::Ipv4Addr;

use crate::ec2::{CreateEniRequest, Ec2, Ec2Error};
use crate::instances::CacheAccess;
use crate::model::{Eni, PREFIX_SIZE, Tags, prefix_addresses};

use super::plan::{CreateEni, next_free_index};
use super::spec::NodeSpec;

/// Attachment attempts of a new ENI: a taken device index moves to the next free one.
pub const MAX_ATTACH_TRIES: usize = 5;

/// What a mutation achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Addresses assigned to an existing ENI.
    Assigned {
        /// The ENI.
        eni_id: String,
        /// The new addresses.
        addresses: Vec<Ipv4Addr>,
    },
    /// A new ENI, attached and set up, with its addresses.
    Created(Box<Eni>),
}

impl Outcome {
    /// Addresses the mutation added to the node's pool.
    pub fn added(&self) -> usize {
        match self {
            Self::Assigned { addresses, .. } => addresses.len(),
            Self::Created(eni) => eni.addresses.len(),
        }
    }
}

/// A mutation that failed. ENIs the operator created are deleted again; `cleanup` says if
/// that failed too (the ENI then leaks until garbage-collected by its tags).
#[derive(Debug, thiserror::Error)]
pub enum ExecuteError {
    /// AssignPrivateIpAddresses failed.
    #[error("assigning {count} addresses to {eni_id}: {error}")]
    Assign {
        /// The ENI.
        eni_id: String,
        /// How many were asked for.
        count: usize,
        /// EC2's error.
        error: Ec2Error,
    },
    /// CreateNetworkInterface failed.
    #[error("creating an ENI in {subnet_id}: {error}")]
    Create {
        /// The subnet.
        subnet_id: String,
        /// EC2's error.
        error: Ec2Error,
    },
    /// AttachNetworkInterface failed (after retries on taken device indexes).
    #[error("attaching {eni_id} at device index {device_index}: {error}{}", cleanup_note(.cleanup.as_ref()))]
    Attach {
        /// The new ENI.
        eni_id: String,
        /// The last index tried.
        device_index: u32,
        /// EC2's error.
        error: Ec2Error,
        /// The error deleting the ENI again, if that failed.
        cleanup: Option<Ec2Error>,
    },
    /// Marking the attachment delete-on-termination failed.
    #[error("setting delete-on-termination on {eni_id}: {error}{}", cleanup_note(.cleanup.as_ref()))]
    DeleteOnTermination {
        /// The new ENI.
        eni_id: String,
        /// EC2's error.
        error: Ec2Error,
        /// The error detaching or deleting the ENI again, if that failed.
        cleanup: Option<Ec2Error>,
    },
}

fn cleanup_note(cleanup: Option<&Ec2Error>) -> String {
    cleanup.map_or_else(String::new, |err| {
        format!("; the ENI could not be removed: {err}")
    })
}

impl ExecuteError {
    /// The EC2 error behind the failure.
    pub fn ec2(&self) -> &Ec2Error {
        match self {
            Self::Assign { error: source, .. }
            | Self::Create { error: source, .. }
            | Self::Attach { error: source, .. }
            | Self::DeleteOnTermination { error: source, .. } => source,
        }
    }
}

/// Assigns `count` addresses to `eni_id` (as whole /28 prefixes if `prefixes`, falling back
/// to single addresses when the subnet has no free aligned /28) and records them.
pub async fn assign(
    ec2: &Ec2,
    cache: &mut impl CacheAccess,
    spec: &NodeSpec,
    eni_id: &str,
    count: usize,
    prefixes: bool,
) -> Result<Outcome, ExecuteError> {
    let instance_id = spec.eni.instance_id.as_str();
    if prefixes {
        match ec2
            .assign_ipv4_prefixes(eni_id, count.div_ceil(PREFIX_SIZE))
            .await
        {
            Ok(new) => {
                cache.with(|c| c.add_prefixes(instance_id, eni_id, &new));
                return Ok(Outcome::Assigned {
                    eni_id: eni_id.to_owned(),
                    addresses: new.iter().flat_map(|p| prefix_addresses(p)).collect(),
                });
            }
            Err(err) if err.is_subnet_out_of_prefixes() => {
                tracing::warn!(node = %spec.name, eni = %eni_id, %err, "subnet has no free /28; assigning single addresses");
            }
            Err(source) => {
                return Err(ExecuteError::Assign {
                    eni_id: eni_id.to_owned(),
                    count,
                    error: source,
                });
            }
        }
    }
    let addresses = ec2
        .assign_private_ip_addresses(eni_id, count)
        .await
        .map_err(|source| ExecuteError::Assign {
            eni_id: eni_id.to_owned(),
            count,
            error: source,
        })?;
    cache.with(|c| c.add_addresses(instance_id, eni_id, &addresses));
    Ok(Outcome::Assigned {
        eni_id: eni_id.to_owned(),
        addresses,
    })
}

/// Creates an ENI with its addresses, attaches it (moving to the next free index when the
/// planned one turns out taken), marks it delete-on-termination, and records it. An ENI
/// that could not be attached or marked is deleted again.
pub async fn create(
    ec2: &Ec2,
    cache: &mut impl CacheAccess,
    spec: &NodeSpec,
    create: &CreateEni,
    eni_tags: &Tags,
) -> Result<Outcome, ExecuteError> {
    let instance_id = spec.eni.instance_id.as_str();
    let mut request = CreateEniRequest {
        subnet_id: create.subnet_id.clone(),
        security_groups: create.security_groups.clone(),
        description: format!("Meshwork ({instance_id})"),
        count: create.count,
        prefixes: false,
        tags: eni_tags.clone(),
    };
    let mut created = None;
    if create.prefixes {
        let prefix_request = CreateEniRequest {
            count: create.count.div_ceil(PREFIX_SIZE),
            prefixes: true,
            ..request.clone()
        };
        match ec2.create_network_interface(&prefix_request).await {
            Ok(eni) => created = Some(eni),
            Err(err) if err.is_subnet_out_of_prefixes() => {
                tracing::warn!(node = %spec.name, subnet = %create.subnet_id, %err, "subnet has no free /28; creating the ENI with single addresses");
            }
            Err(source) => {
                return Err(ExecuteError::Create {
                    subnet_id: create.subnet_id.clone(),
                    error: source,
                });
            }
        }
    }
    request.prefixes = false;
    let mut eni = match created {
        Some(eni) => eni,
        None => ec2
            .create_network_interface(&request)
            .await
            .map_err(|source| ExecuteError::Create {
                subnet_id: create.subnet_id.clone(),
                error: source,
            })?,
    };
    tracing::info!(node = %spec.name, eni = %eni.id, subnet = %create.subnet_id, addresses = eni.addresses.len(), "created ENI");
    // The subnet lost the primary and the secondaries; reflect it before the next plan.
    let taken = eni.addresses.len() + 1;
    cache.with(|c| c.take_subnet_addresses(&create.subnet_id, taken));

    let mut device_index = create.device_index;
    let mut tries = 0;
    let attachment_id = loop {
        tries += 1;
        match ec2
            .attach_network_interface(&eni.id, instance_id, device_index)
            .await
        {
            Ok(attachment_id) => break attachment_id,
            Err(err) if err.is_attachment_index_conflict() && tries < MAX_ATTACH_TRIES => {
                // Our view of the instance was stale: skip the taken index, not the ENI.
                device_index = cache.with(|c| {
                    let known: Vec<&Eni> = c.enis(instance_id).collect();
                    next_free_index(&known, device_index + 1)
                });
                tracing::info!(eni = %eni.id, device_index, "device index taken; retrying at the next");
            }
            Err(source) => {
                let cleanup = ec2.delete_network_interface(&eni.id).await.err();
                return Err(ExecuteError::Attach {
                    eni_id: eni.id,
                    device_index,
                    error: source,
                    cleanup,
                });
            }
        }
    };
    eni.number = device_index;
    eni.attachment_id = Some(attachment_id.clone());

    if spec.eni.delete_on_termination != Some(false)
        && let Err(source) = ec2.set_delete_on_termination(&eni.id, &attachment_id).await
    {
        // Attached ENIs cannot be deleted: detach first.
        let cleanup = match ec2.detach_network_interface(&attachment_id).await {
            Ok(()) => ec2.delete_network_interface(&eni.id).await.err(),
            Err(err) => Some(err),
        };
        return Err(ExecuteError::DeleteOnTermination {
            eni_id: eni.id,
            error: source,
            cleanup,
        });
    }
    cache.with(|c| c.upsert_eni(instance_id, eni.clone()));
    Ok(Outcome::Created(Box::new(eni)))
}

/// Unassigns `addresses` from `eni_id` (the last step of the release handshake) and records
/// it.
pub async fn release(
    ec2: &Ec2,
    cache: &mut impl CacheAccess,
    spec: &NodeSpec,
    eni_id: &str,
    addresses: &[Ipv4Addr],
) -> Result<(), Ec2Error> {
    ec2.unassign_private_ip_addresses(eni_id, addresses).await?;
    let instance_id = spec.eni.instance_id.as_str();
    cache.with(|c| c.remove_addresses(instance_id, eni_id, addresses));
    tracing::info!(node = %spec.name, eni = %eni_id, released = addresses.len(), "released excess addresses");
    Ok(())
}
