//! Cluster IDs are unique across remote clusters (contract §2).

use std::collections::HashMap;

/// Which remote cluster holds which cluster ID. A plain state machine, owned by the mesh.
#[derive(Debug, Default)]
pub struct ClusterIds {
    by_id: HashMap<u32, String>,
    by_cluster: HashMap<String, u32>,
}

/// A reservation refused because another cluster holds the ID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("clusterID {id} is already used")]
pub struct IdInUse {
    /// The ID asked for.
    pub id: u32,
    /// Who holds it.
    pub holder: String,
}

impl ClusterIds {
    /// Reserves `id` for `cluster`. The cluster's previous ID is released only once the new
    /// one is reserved, so a failed change keeps the old reservation.
    pub fn reserve(&mut self, cluster: &str, id: u32) -> Result<(), IdInUse> {
        match self.by_id.get(&id) {
            Some(holder) if holder == cluster => return Ok(()),
            Some(holder) => {
                return Err(IdInUse {
                    id,
                    holder: holder.clone(),
                });
            }
            None => {}
        }
        self.by_id.insert(id, cluster.to_owned());
        if let Some(old) = self.by_cluster.insert(cluster.to_owned(), id) {
            self.by_id.remove(&old);
        }
        Ok(())
    }

    /// Releases whatever `cluster` holds.
    pub fn release(&mut self, cluster: &str) {
        if let Some(id) = self.by_cluster.remove(cluster) {
            self.by_id.remove(&id);
        }
    }

    /// The ID `cluster` holds.
    pub fn get(&self, cluster: &str) -> Option<u32> {
        self.by_cluster.get(cluster).copied()
    }

    /// Every reservation, by ID.
    pub fn reserved(&self) -> std::collections::BTreeMap<u32, String> {
        self.by_id
            .iter()
            .map(|(id, cluster)| (*id, cluster.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_released_after_a_new_reservation() {
        let mut ids = ClusterIds::default();
        ids.reserve("c1", 1).unwrap();
        ids.reserve("c1", 1).unwrap();
        let err = ids.reserve("c2", 1).unwrap_err();
        assert_eq!(err.to_string(), "clusterID 1 is already used");
        ids.reserve("c2", 2).unwrap();
        // c1 moves to 3: 1 becomes free only now.
        assert!(ids.reserve("c1", 2).is_err());
        assert_eq!(ids.get("c1"), Some(1));
        ids.reserve("c1", 3).unwrap();
        ids.reserve("c3", 1).unwrap();
        ids.release("c2");
        ids.reserve("c4", 2).unwrap();
    }
}

/// Asks the mesh to reserve `id` for `cluster`.
#[derive(Debug, Clone, actix::Message)]
#[rtype(result = "Result<(), ReserveError>")]
pub struct ReserveClusterId {
    /// The remote cluster (incarnation) asking.
    pub cluster: crate::events::ClusterRef,
    /// The ID from its config.
    pub id: u32,
}

/// Why a reservation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReserveError {
    /// Another remote cluster holds the ID.
    #[error(transparent)]
    InUse(#[from] IdInUse),
    /// The asking incarnation is no longer configured (its loop is being stopped).
    #[error("remote cluster {0} is no longer configured")]
    NotConfigured(String),
}
