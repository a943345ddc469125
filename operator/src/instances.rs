//! The describe cache: VPCs, subnets, security groups and the ENIs of every instance, as
//! last described by EC2 plus what the operator itself changed since.
//!
//! A resync is split in three so an actor can describe without holding the cache:
//! [`InstanceCache::begin_resync`] notes the cache generation, [`fetch`] describes
//! everything (paginated), [`InstanceCache::apply_resync`] swaps the answer in. Two rules
//! protect what gets published from it:
//! - a failed describe changes nothing, and an answer with no subnets or no ENIs never
//!   replaces a cache that had some (cilium#11052: an empty EC2 answer published as empty
//!   node state);
//! - an ENI the operator created or changed after the resync began is kept as the operator
//!   knows it, since the describe may have run before the change (cilium#46513).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use crate::ec2::{Ec2, Ec2Error, SubnetFilter};
use crate::model::{
    Eni, PREFIX_SIZE, SecurityGroup, Subnet, Tags, Vpc, prefix_addresses, tags_match,
};

mod shared;

pub use shared::{CacheAccess, SharedCache, shared};

/// A resync that could not be applied; the previous cache stays in place.
#[derive(Debug, thiserror::Error)]
pub enum ResyncError {
    /// A describe call failed.
    #[error("describe failed, keeping the previous cache: {0}")]
    Describe(Ec2Error),
    /// EC2 answered with nothing where the cache had something.
    #[error("EC2 described no {what} although {known} were known; keeping the previous cache")]
    EmptyAnswer {
        /// `subnets` or `ENIs`.
        what: &'static str,
        /// How many the cache held.
        known: usize,
    },
}

// The cause is in the message: converting does not also make it the error's source, so no
// chain prints it twice.
impl From<Ec2Error> for ResyncError {
    fn from(error: Ec2Error) -> Self {
        Self::Describe(error)
    }
}

/// Everything one resync described.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// All VPCs.
    pub vpcs: Vec<Vpc>,
    /// The subnets the filter admits.
    pub subnets: Vec<Subnet>,
    /// All security groups.
    pub security_groups: Vec<SecurityGroup>,
    /// All ENIs, with the instance each is attached to.
    pub enis: Vec<(Option<String>, Eni)>,
}

/// Describes everything a resync needs, one paginated describe per kind.
pub async fn fetch(ec2: &Ec2, subnet_filter: &SubnetFilter) -> Result<Snapshot, Ec2Error> {
    fetch_filtered(ec2, subnet_filter, &Tags::new()).await
}

/// [`fetch`], keeping only the ENIs of instances carrying all `instance_tags`
/// (`--instance-tags-filter`; every instance if empty) and unattached ones.
///
/// The instances are described after the ENIs, so an instance created in between is
/// admitted (its ENIs just show up at the next resync) rather than dropped.
pub async fn fetch_filtered(
    ec2: &Ec2,
    subnet_filter: &SubnetFilter,
    instance_tags: &Tags,
) -> Result<Snapshot, Ec2Error> {
    let mut snapshot = Snapshot {
        vpcs: ec2.describe_vpcs().await?,
        subnets: ec2.describe_subnets(subnet_filter).await?,
        security_groups: ec2.describe_security_groups().await?,
        enis: ec2.describe_network_interfaces(Vec::new()).await?,
    };
    if !instance_tags.is_empty() {
        let admitted = ec2.describe_instance_ids(instance_tags).await?;
        snapshot
            .enis
            .retain(|(instance, _)| instance.as_ref().is_none_or(|id| admitted.contains(id)));
    }
    Ok(snapshot)
}

/// The cache generation a resync started at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResyncTicket(u64);

/// The cache itself.
#[derive(Debug, Clone, Default)]
pub struct InstanceCache {
    vpcs: BTreeMap<String, Vpc>,
    subnets: BTreeMap<String, Subnet>,
    security_groups: BTreeMap<String, SecurityGroup>,
    /// instance ID → ENI ID → ENI.
    instances: BTreeMap<String, BTreeMap<String, Eni>>,
    /// Bumped by every local change.
    generation: u64,
    /// ENI ID → (instance, generation of its last local change).
    changed: BTreeMap<String, (String, u64)>,
    /// ENIs attached to nothing, as last described (candidates for garbage collection).
    unattached: Vec<Eni>,
}

impl InstanceCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Describes and applies in one go (for callers that own the cache exclusively).
    pub async fn resync(
        &mut self,
        ec2: &Ec2,
        subnet_filter: &SubnetFilter,
    ) -> Result<(), ResyncError> {
        let ticket = self.begin_resync();
        let snapshot = fetch(ec2, subnet_filter).await?;
        self.apply_resync(ticket, snapshot)
    }

    /// A counter bumped by every local change (what the operator did since a resync).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Notes where a resync starts; pass the ticket to [`Self::apply_resync`].
    pub fn begin_resync(&self) -> ResyncTicket {
        ResyncTicket(self.generation)
    }

    /// Replaces the cache with `snapshot`, keeping local changes newer than `ticket`.
    pub fn apply_resync(
        &mut self,
        ticket: ResyncTicket,
        snapshot: Snapshot,
    ) -> Result<(), ResyncError> {
        let known_enis: usize = self.instances.values().map(BTreeMap::len).sum();
        if snapshot.subnets.is_empty() && !self.subnets.is_empty() {
            return Err(ResyncError::EmptyAnswer {
                what: "subnets",
                known: self.subnets.len(),
            });
        }
        if snapshot.enis.is_empty() && known_enis > 0 {
            return Err(ResyncError::EmptyAnswer {
                what: "ENIs",
                known: known_enis,
            });
        }
        let mut instances: BTreeMap<String, BTreeMap<String, Eni>> = BTreeMap::new();
        let mut unattached = Vec::new();
        for (instance, eni) in snapshot.enis {
            // Unattached ENIs belong to no node; nothing allocates from them.
            match instance {
                Some(instance) => {
                    instances
                        .entry(instance)
                        .or_default()
                        .insert(eni.id.clone(), eni);
                }
                None => unattached.push(eni),
            }
        }
        self.unattached = unattached;
        for (eni_id, (instance, generation)) in &self.changed {
            if *generation <= ticket.0 {
                continue;
            }
            match self
                .instances
                .get(instance)
                .and_then(|enis| enis.get(eni_id))
            {
                Some(eni) => {
                    instances
                        .entry(instance.clone())
                        .or_default()
                        .insert(eni_id.clone(), eni.clone());
                }
                // Deleted locally after the describe began: the describe may still list it.
                None => {
                    if let Some(enis) = instances.get_mut(instance) {
                        enis.remove(eni_id);
                    }
                }
            }
        }
        self.vpcs = snapshot
            .vpcs
            .into_iter()
            .map(|v| (v.id.clone(), v))
            .collect();
        self.subnets = snapshot
            .subnets
            .into_iter()
            .map(|s| (s.id.clone(), s))
            .collect();
        self.security_groups = snapshot
            .security_groups
            .into_iter()
            .map(|g| (g.id.clone(), g))
            .collect();
        self.instances = instances;
        let (subnets, vpcs) = (&self.subnets, &self.vpcs);
        for eni in self.instances.values_mut().flat_map(BTreeMap::values_mut) {
            complete(eni, subnets, vpcs);
        }
        // Changes at or before the ticket are in EC2's answer by now.
        self.changed
            .retain(|_, (_, generation)| *generation > ticket.0);
        Ok(())
    }

    fn touch(&mut self, instance: &str, eni_id: &str) {
        self.generation += 1;
        self.changed
            .insert(eni_id.to_owned(), (instance.to_owned(), self.generation));
    }

    /// Records an ENI the operator created (and attached) or changed.
    pub fn upsert_eni(&mut self, instance: &str, mut eni: Eni) {
        complete(&mut eni, &self.subnets, &self.vpcs);
        self.touch(instance, &eni.id);
        self.instances
            .entry(instance.to_owned())
            .or_default()
            .insert(eni.id.clone(), eni);
    }

    /// Records addresses the operator assigned to an ENI; they leave the subnet's free count.
    pub fn add_addresses(&mut self, instance: &str, eni_id: &str, addresses: &[Ipv4Addr]) {
        let Some(eni) = self
            .instances
            .get_mut(instance)
            .and_then(|enis| enis.get_mut(eni_id))
        else {
            return;
        };
        eni.addresses.extend_from_slice(addresses);
        let subnet_id = eni.subnet.id.clone();
        self.take_subnet_addresses(&subnet_id, addresses.len());
        self.touch(instance, eni_id);
    }

    /// Records delegated prefixes the operator assigned to an ENI (16 addresses each).
    pub fn add_prefixes(&mut self, instance: &str, eni_id: &str, prefixes: &[String]) {
        let Some(eni) = self
            .instances
            .get_mut(instance)
            .and_then(|enis| enis.get_mut(eni_id))
        else {
            return;
        };
        eni.prefixes.extend_from_slice(prefixes);
        eni.addresses
            .extend(prefixes.iter().flat_map(|prefix| prefix_addresses(prefix)));
        let subnet_id = eni.subnet.id.clone();
        self.take_subnet_addresses(&subnet_id, prefixes.len() * PREFIX_SIZE);
        self.touch(instance, eni_id);
    }

    /// Records addresses the operator released from an ENI (single addresses, not prefixes);
    /// they return to the subnet's free count.
    pub fn remove_addresses(&mut self, instance: &str, eni_id: &str, addresses: &[Ipv4Addr]) {
        let Some(eni) = self
            .instances
            .get_mut(instance)
            .and_then(|enis| enis.get_mut(eni_id))
        else {
            return;
        };
        let before = eni.addresses.len();
        eni.addresses.retain(|address| !addresses.contains(address));
        let freed = before - eni.addresses.len();
        let subnet_id = eni.subnet.id.clone();
        if let Some(subnet) = self.subnets.get_mut(&subnet_id) {
            subnet.available_addresses += freed;
        }
        self.touch(instance, eni_id);
    }

    /// ENIs attached to nothing, as the last resync described them.
    pub fn unattached(&self) -> &[Eni] {
        &self.unattached
    }

    /// Forgets an unattached ENI the operator deleted.
    pub fn forget_unattached(&mut self, eni_id: &str) {
        self.unattached.retain(|eni| eni.id != eni_id);
    }

    /// Lowers a subnet's free count by what the operator just took from it, until the next
    /// resync reports EC2's figure.
    pub fn take_subnet_addresses(&mut self, subnet_id: &str, count: usize) {
        if let Some(subnet) = self.subnets.get_mut(subnet_id) {
            subnet.available_addresses = subnet.available_addresses.saturating_sub(count);
        }
    }

    /// The ENIs attached to `instance`, by ENI ID.
    pub fn enis(&self, instance: &str) -> impl Iterator<Item = &Eni> {
        self.instances
            .get(instance)
            .into_iter()
            .flat_map(BTreeMap::values)
    }

    /// One ENI of `instance`.
    pub fn eni(&self, instance: &str, eni_id: &str) -> Option<&Eni> {
        self.instances.get(instance)?.get(eni_id)
    }

    /// Instances with at least one ENI.
    pub fn instance_ids(&self) -> impl Iterator<Item = &str> {
        self.instances.keys().map(String::as_str)
    }

    /// A subnet by ID.
    pub fn subnet(&self, id: &str) -> Option<&Subnet> {
        self.subnets.get(id)
    }

    /// All known subnets.
    pub fn subnets(&self) -> impl Iterator<Item = &Subnet> {
        self.subnets.values()
    }

    /// A VPC by ID.
    pub fn vpc(&self, id: &str) -> Option<&Vpc> {
        self.vpcs.get(id)
    }

    /// Among `ids`, the subnet in `vpc_id`/`zone` with the most free addresses.
    pub fn find_subnet_by_ids(&self, vpc_id: &str, zone: &str, ids: &[String]) -> Option<&Subnet> {
        self.best_subnet(vpc_id, zone, |s| ids.contains(&s.id))
    }

    /// Among subnets carrying all `tags`, the one in `vpc_id`/`zone` with the most free
    /// addresses (any subnet there if `tags` is empty).
    pub fn find_subnet_by_tags(&self, vpc_id: &str, zone: &str, tags: &Tags) -> Option<&Subnet> {
        self.best_subnet(vpc_id, zone, |s| tags_match(&s.tags, tags))
    }

    fn best_subnet(
        &self,
        vpc_id: &str,
        zone: &str,
        admit: impl Fn(&Subnet) -> bool,
    ) -> Option<&Subnet> {
        self.subnets
            .values()
            .filter(|s| s.vpc_id == vpc_id && s.availability_zone == zone && admit(s))
            // On a tie the first by ID, so the choice is stable across resyncs.
            .fold(None, |best: Option<&Subnet>, s| match best {
                Some(b) if b.available_addresses >= s.available_addresses => Some(b),
                _ => Some(s),
            })
    }

    /// The security groups of `vpc_id` carrying all `tags`.
    pub fn find_security_groups_by_tags(&self, vpc_id: &str, tags: &Tags) -> Vec<&SecurityGroup> {
        self.security_groups
            .values()
            .filter(|g| g.vpc_id == vpc_id && tags_match(&g.tags, tags))
            .collect()
    }
}

/// Fills what EC2's ENI answer lacks from the subnet and VPC caches (Cilium publishes both).
fn complete(eni: &mut Eni, subnets: &BTreeMap<String, Subnet>, vpcs: &BTreeMap<String, Vpc>) {
    if let Some(subnet) = subnets.get(&eni.subnet.id) {
        eni.subnet.cidr.clone_from(&subnet.cidr);
    }
    if let Some(vpc) = vpcs.get(&eni.vpc.id) {
        eni.vpc.primary_cidr.clone_from(&vpc.primary_cidr);
        eni.vpc.cidrs.clone_from(&vpc.cidrs);
    }
}

#[cfg(test)]
mod tests;
