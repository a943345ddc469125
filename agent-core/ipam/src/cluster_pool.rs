//! Host-local allocation from the node's pod CIDR (`--ipam cluster-pool`,
//! `--ipv4-alloc-cidr`), as Cilium's cluster-pool agent side hands them out.
//!
//! The network and broadcast addresses are never handed out; the first host address is the
//! router IP, held only by [`ROUTER_OWNER`]; pods get the others, next-fit from the last one
//! handed out (wrapping), so a released address is not reused at once. Allocations share the
//! ENI pool's checkpoint (in `cluster-pool` mode): restored, every owner keeps its IP. A
//! restored IP that is not a host address of the current CIDR (the flag changed) is kept
//! for its owner and listed by [`ClusterPool::orphans`]; it is never handed out again.

use std::net::Ipv4Addr;

use crate::allocation::{Allocated, Allocation, Mode, ROUTER_OWNER};
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::cidr::Ipv4Cidr;
use crate::error::{AllocateError, ReleaseError};
use crate::ledger::Ledger;

/// Why a cluster pool could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ClusterPoolError {
    /// The CIDR has no room for a router IP and a pod.
    #[error(
        "--ipv4-alloc-cidr {0}: too small (at most /30: the network, the router IP, a pod, the broadcast)"
    )]
    TooSmall(Ipv4Cidr),
    /// The checkpoint could not be read.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

/// The node's pod CIDR and its allocations.
#[derive(Debug)]
pub struct ClusterPool {
    cidr: Ipv4Cidr,
    ledger: Ledger,
    /// The last IP handed out to a pod: the next search starts after it.
    cursor: Ipv4Addr,
}

impl ClusterPool {
    /// The pool of `cidr` with the allocations `checkpoint` holds. The search for free IPs
    /// starts after the highest restored one.
    pub fn restore(cidr: Ipv4Cidr, checkpoint: Checkpoint) -> Result<Self, ClusterPoolError> {
        if cidr.hosts() < 2 {
            return Err(ClusterPoolError::TooSmall(cidr));
        }
        let ledger = Ledger::restore(checkpoint, Mode::ClusterPool)?;
        let cursor = ledger
            .by_ip()
            .map(|a| a.ip)
            .filter(|ip| cidr.is_host(*ip))
            .max()
            .unwrap_or_else(|| cidr.first_host());
        Ok(Self {
            cidr,
            ledger,
            cursor,
        })
    }

    /// The CIDR.
    pub fn cidr(&self) -> Ipv4Cidr {
        self.cidr
    }

    /// The checkpoint.
    pub fn checkpoint(&self) -> &Checkpoint {
        self.ledger.checkpoint()
    }

    /// The router IP: the CIDR's first host address.
    pub fn router_ip(&self) -> Ipv4Addr {
        self.cidr.first_host()
    }

    /// Whether the router IP is allocated (the pool is ready).
    pub fn has_router(&self) -> bool {
        self.ledger.get(ROUTER_OWNER).is_some()
    }

    /// Host addresses of the CIDR (the router IP included).
    pub fn capacity(&self) -> u32 {
        self.cidr.hosts()
    }

    /// IPs handed out (orphans included).
    pub fn used(&self) -> usize {
        self.ledger.len()
    }

    /// Every allocation, by IP.
    pub fn allocations(&self) -> impl Iterator<Item = &Allocation> {
        self.ledger.by_ip()
    }

    /// `owner`'s allocation.
    pub fn allocation(&self, owner: &str) -> Option<&Allocation> {
        self.ledger.get(owner)
    }

    /// Restored IPs that are not host addresses of the CIDR.
    pub fn orphans(&self) -> impl Iterator<Item = &Allocation> {
        self.ledger.by_ip().filter(|a| !self.cidr.is_host(a.ip))
    }

    /// Hands out an IP to `owner` (the router IP to [`ROUTER_OWNER`]); an owner that holds
    /// one gets it back with `existing`.
    pub fn allocate(&mut self, owner: &str, pod: &str) -> Result<Allocated, AllocateError> {
        if owner.is_empty() {
            return Err(AllocateError::InvalidOwner);
        }
        if let Some(allocation) = self.ledger.get(owner) {
            return Ok(Allocated {
                allocation: allocation.clone(),
                existing: true,
            });
        }
        let router = self.router_ip();
        let ip = if owner == ROUTER_OWNER {
            if let Some(holder) = self.ledger.holder(router) {
                return Err(AllocateError::RouterIpTaken {
                    ip: router,
                    holder: holder.to_owned(),
                });
            }
            router
        } else {
            self.next_free().ok_or_else(|| AllocateError::Exhausted {
                pool: usize::try_from(self.capacity()).unwrap_or(usize::MAX),
                in_use: self
                    .ledger
                    .by_ip()
                    .filter(|a| self.cidr.is_host(a.ip))
                    .count(),
                in_handshake: 0,
            })?
        };
        let allocation = Allocation {
            owner: owner.to_owned(),
            pod: pod.to_owned(),
            ip,
            prefix_len: self.cidr.prefix_len(),
            gateway: router,
            eni: None,
            generation: String::new(),
        };
        self.ledger.insert(allocation.clone())?;
        if ip != router {
            self.cursor = ip;
        }
        Ok(Allocated {
            allocation,
            existing: false,
        })
    }

    /// The first free pod address after the cursor, wrapping; never the router IP.
    fn next_free(&self) -> Option<Ipv4Addr> {
        let first = u32::from(self.router_ip()) + 1;
        let last = u32::from(self.cidr.broadcast()) - 1;
        let start = u32::from(self.cursor).clamp(first - 1, last);
        (start + 1..=last)
            .chain(first..=start)
            .map(Ipv4Addr::from)
            .find(|ip| !self.ledger.holds(*ip))
    }

    /// Gives `owner`'s IP back; `None` when it held none (nothing is written then).
    pub fn release(&mut self, owner: &str) -> Result<Option<Allocation>, ReleaseError> {
        if owner.is_empty() {
            return Err(ReleaseError::InvalidOwner);
        }
        Ok(self.ledger.remove(owner)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> Ipv4Addr {
        text.parse().unwrap()
    }

    fn pool(dir: &tempfile::TempDir, cidr: &str) -> ClusterPool {
        ClusterPool::restore(cidr.parse().unwrap(), Checkpoint::in_dir(dir.path())).unwrap()
    }

    #[test]
    fn the_router_gets_the_first_host_and_pods_the_rest_never_network_or_broadcast() {
        let dir = tempfile::tempdir().unwrap();
        let mut pool = pool(&dir, "10.213.7.0/29");
        assert_eq!(pool.capacity(), 6);
        let pods: Vec<Ipv4Addr> = (0..5)
            .map(|i| {
                pool.allocate(&format!("c{i}/eth0"), "")
                    .unwrap()
                    .allocation
                    .ip
            })
            .collect();
        assert_eq!(
            pods,
            [
                "10.213.7.2",
                "10.213.7.3",
                "10.213.7.4",
                "10.213.7.5",
                "10.213.7.6"
            ]
            .map(ip)
        );
        let err = pool.allocate("c5/eth0", "").unwrap_err();
        assert!(
            matches!(
                err,
                AllocateError::Exhausted {
                    pool: 6,
                    in_use: 5,
                    ..
                }
            ),
            "{err}"
        );
        let router = pool.allocate(ROUTER_OWNER, "").unwrap().allocation;
        assert_eq!(
            (router.ip, router.gateway, router.prefix_len),
            (ip("10.213.7.1"), ip("10.213.7.1"), 29)
        );
        assert!(pool.has_router());
        let pod = pool.allocation("c0/eth0").unwrap();
        assert_eq!((pod.gateway, pod.prefix_len), (ip("10.213.7.1"), 29));
    }

    #[test]
    fn allocation_is_idempotent_and_a_released_ip_is_not_reused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut pool = pool(&dir, "10.213.7.0/24");
        let a = pool.allocate("a", "default/a").unwrap();
        let again = pool.allocate("a", "").unwrap();
        assert!(again.existing && again.allocation == a.allocation);
        assert_eq!(pool.release("a").unwrap().unwrap().ip, ip("10.213.7.2"));
        assert_eq!(pool.release("a").unwrap(), None);
        assert_eq!(
            pool.allocate("b", "").unwrap().allocation.ip,
            ip("10.213.7.3")
        );
        assert!(matches!(
            pool.allocate("", ""),
            Err(AllocateError::InvalidOwner)
        ));
    }

    #[test]
    fn next_fit_wraps_to_the_freed_addresses() {
        let dir = tempfile::tempdir().unwrap();
        let mut pool = pool(&dir, "10.213.7.0/30");
        assert_eq!(
            pool.allocate("a", "").unwrap().allocation.ip,
            ip("10.213.7.2")
        );
        assert!(pool.allocate("b", "").is_err());
        pool.release("a").unwrap();
        assert_eq!(
            pool.allocate("b", "").unwrap().allocation.ip,
            ip("10.213.7.2")
        );
    }

    #[test]
    fn a_restart_keeps_every_owner_and_continues_after_the_highest() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut pool = pool(&dir, "10.213.7.0/24");
            pool.allocate(ROUTER_OWNER, "").unwrap();
            for owner in ["a", "b", "c"] {
                pool.allocate(owner, "").unwrap();
            }
            pool.release("a").unwrap();
        }
        let mut pool = pool(&dir, "10.213.7.0/24");
        assert!(pool.has_router());
        assert_eq!(pool.allocation("b").unwrap().ip, ip("10.213.7.3"));
        assert!(pool.allocate("c", "").unwrap().existing);
        assert_eq!(
            pool.allocate("d", "").unwrap().allocation.ip,
            ip("10.213.7.5")
        );
    }

    #[test]
    fn a_restored_ip_outside_a_changed_cidr_is_kept_as_an_orphan() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut pool = pool(&dir, "10.213.7.0/24");
            pool.allocate(ROUTER_OWNER, "").unwrap();
            for owner in ["a", "b"] {
                pool.allocate(owner, "").unwrap();
            }
        }
        let mut pool = pool(&dir, "10.213.8.0/24");
        let orphans: Vec<&str> = pool.orphans().map(|a| a.owner.as_str()).collect();
        assert_eq!(orphans, ["router", "a", "b"]);
        // The owners keep their old IPs; new ones come from the new CIDR.
        assert_eq!(
            pool.allocate("a", "").unwrap().allocation.ip,
            ip("10.213.7.2")
        );
        assert_eq!(
            pool.allocate("c", "").unwrap().allocation.ip,
            ip("10.213.8.2")
        );
    }

    #[test]
    fn a_cidr_without_room_for_a_router_and_a_pod_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for cidr in ["10.0.0.0/31", "10.0.0.1/32"] {
            let err = ClusterPool::restore(cidr.parse().unwrap(), Checkpoint::in_dir(dir.path()))
                .unwrap_err();
            assert!(matches!(err, ClusterPoolError::TooSmall(_)), "{err}");
        }
        // An ENI checkpoint is refused, naming both modes.
        std::fs::write(
            dir.path().join("ipam.json"),
            r#"{"version":1,"mode":"eni","allocations":[]}"#,
        )
        .unwrap();
        let err = ClusterPool::restore(
            "10.0.0.0/24".parse().unwrap(),
            Checkpoint::in_dir(dir.path()),
        )
        .unwrap_err();
        assert!(err.to_string().contains("--ipam eni"), "{err}");
    }
}
