//! The agent's view of one operator snapshot (`meshwork.ipam.v1.NodeSnapshot`): the node's
//! ENIs, its pool (address → ENI), the release handshake and the watermarks, all of one
//! stored generation. The agent crate converts the proto into it, so this crate knows no
//! gRPC.
//!
//! The operator promises that every pool IP's ENI is in the same snapshot (§7's ordering
//! rule). [`Snapshot::check`] verifies it: a snapshot that breaks the promise, or that the
//! conversion could not fully read, is never allocated from (§11).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use crate::cidr::Ipv4Cidr;

/// One snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The stored generation it was read from (opaque: compared for equality only).
    pub generation: String,
    /// The node's ENIs, by ID.
    pub enis: BTreeMap<String, Eni>,
    /// The pool: address → the ID of its ENI.
    pub pool: BTreeMap<Ipv4Addr, String>,
    /// `status.ipam.release-ips`: address → handshake state.
    pub release: BTreeMap<Ipv4Addr, ReleaseState>,
    /// `spec.ipam`'s watermarks.
    pub watermarks: Watermarks,
    /// `status.ipam.operator-status.error`; empty when allocation is healthy.
    pub operator_error: String,
    /// Entries the conversion could not read (an address that is not IPv4, an ENI without
    /// a subnet CIDR, …), each described; any makes the snapshot inconsistent.
    pub malformed: Vec<String>,
}

/// One ENI, as much of `status.eni.enis[id]` as a pod's interface needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Eni {
    /// `eni-…`.
    pub id: String,
    /// The MAC address.
    pub mac: String,
    /// The device index on the instance.
    pub number: i64,
    /// The subnet's CIDR; its first address is the pods' gateway.
    pub subnet: Ipv4Cidr,
    /// The VPC's CIDRs.
    pub vpc_cidrs: Vec<Ipv4Cidr>,
}

/// `spec.ipam`'s watermarks, as stored (negative values read as 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Watermarks {
    /// `pre-allocate`.
    pub pre_allocate: u32,
    /// `min-allocate`.
    pub min_allocate: u32,
    /// `max-allocate` (0: no limit).
    pub max_allocate: u32,
    /// `max-above-watermark`.
    pub max_above_watermark: u32,
}

impl Watermarks {
    /// The IPs the pool must hold before the agent is ready (Cilium's `required`, §11): the
    /// first non-zero of min-allocate and pre-allocate, else 1. The snapshot carries only
    /// `spec.ipam` (Cilium also reads the deprecated `spec.eni.*` copies), and the agent has
    /// no health-check endpoint, so Cilium's 2 never applies.
    pub fn required(&self) -> u32 {
        [self.min_allocate, self.pre_allocate]
            .into_iter()
            .find(|n| *n != 0)
            .unwrap_or(1)
    }
}

/// A state of the release handshake (`status.ipam.release-ips`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ReleaseState {
    /// The operator wants to release the address.
    MarkedForRelease,
    /// The agent agreed: it will not hand the address out.
    ReadyForRelease,
    /// The agent refused: the address is in use.
    DoNotRelease,
    /// The operator unassigned the address.
    Released,
    /// A state this agent does not know, kept verbatim; treated as in the handshake, so an
    /// address whose fate is unclear is never handed out.
    Other(String),
}

impl ReleaseState {
    /// The state named `text` (Cilium's spelling).
    pub fn from_wire(text: &str) -> Self {
        match text {
            "marked-for-release" => Self::MarkedForRelease,
            "ready-for-release" => Self::ReadyForRelease,
            "do-not-release" => Self::DoNotRelease,
            "released" => Self::Released,
            other => Self::Other(other.to_owned()),
        }
    }

    /// Cilium's spelling.
    pub fn as_str(&self) -> &str {
        match self {
            Self::MarkedForRelease => "marked-for-release",
            Self::ReadyForRelease => "ready-for-release",
            Self::DoNotRelease => "do-not-release",
            Self::Released => "released",
            Self::Other(other) => other,
        }
    }

    /// Whether an address in this state is in a release handshake and so never handed out:
    /// every state but `do-not-release` (which ends the handshake).
    pub fn in_handshake(&self) -> bool {
        !matches!(self, Self::DoNotRelease)
    }
}

/// Why a snapshot is not used.
#[derive(Clone, Debug, Default, PartialEq, Eq, thiserror::Error)]
pub struct Inconsistent {
    /// Pool IPs whose ENI is not in the snapshot, with the ENI they name.
    pub missing: BTreeMap<Ipv4Addr, String>,
    /// What the conversion could not read.
    pub malformed: Vec<String>,
}

impl std::fmt::Display for Inconsistent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.missing.is_empty() {
            let n = self.missing.len();
            let s = if n == 1 { "" } else { "s" };
            write!(f, "the snapshot lacks the ENI of {n} pool IP{s}: ")?;
            // A few examples are enough for a log line.
            for (i, (ip, eni)) in self.missing.iter().take(3).enumerate() {
                write!(f, "{}{ip} → {eni}", if i == 0 { "" } else { ", " })?;
            }
            if n > 3 {
                f.write_str(", …")?;
            }
        }
        if !self.malformed.is_empty() {
            if !self.missing.is_empty() {
                f.write_str("; ")?;
            }
            write!(f, "unreadable: {}", self.malformed.join("; "))?;
        }
        Ok(())
    }
}

impl Snapshot {
    /// Pool IPs naming an ENI the snapshot lacks, with that ENI.
    pub fn missing_enis(&self) -> BTreeMap<Ipv4Addr, String> {
        self.pool
            .iter()
            .filter(|(_, eni)| !self.enis.contains_key(*eni))
            .map(|(ip, eni)| (*ip, eni.clone()))
            .collect()
    }

    /// `Ok` when every pool IP's ENI is in the snapshot and the conversion read everything.
    pub fn check(&self) -> Result<(), Inconsistent> {
        let missing = self.missing_enis();
        if missing.is_empty() && self.malformed.is_empty() {
            return Ok(());
        }
        Err(Inconsistent {
            missing,
            malformed: self.malformed.clone(),
        })
    }

    /// Whether `ip` is in a release handshake (never handed out).
    pub fn in_handshake(&self, ip: Ipv4Addr) -> bool {
        self.release
            .get(&ip)
            .is_some_and(ReleaseState::in_handshake)
    }

    /// Pool IPs the agent may hand out: the pool minus those in a release handshake.
    pub fn available(&self) -> usize {
        self.pool
            .keys()
            .filter(|ip| !self.in_handshake(**ip))
            .count()
    }

    /// Addresses the operator marked for release.
    pub fn marked_for_release(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.release
            .iter()
            .filter(|(_, state)| **state == ReleaseState::MarkedForRelease)
            .map(|(ip, _)| *ip)
    }

    /// Addresses the operator released that have left the pool: their handshake is over once
    /// a report of this generation reaches the operator.
    pub fn released_gone(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.release
            .iter()
            .filter(|(ip, state)| **state == ReleaseState::Released && !self.pool.contains_key(ip))
            .map(|(ip, _)| *ip)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn required_is_the_first_non_zero_of_min_and_pre_allocate_else_1() {
        // (pre, min, max → required)
        for (pre, min, max, required) in [
            (0, 0, 0, 1),
            (8, 0, 0, 8),
            (0, 16, 0, 16),
            (8, 16, 0, 16),
            (16, 8, 0, 8),
            (8, 4, 6, 4),
            (0, 0, 4, 1),
        ] {
            let watermarks = Watermarks {
                pre_allocate: pre,
                min_allocate: min,
                max_allocate: max,
                max_above_watermark: 0,
            };
            assert_eq!(
                watermarks.required(),
                required,
                "pre {pre} min {min} max {max}"
            );
        }
    }

    #[test]
    fn check_names_the_pool_ips_whose_eni_is_missing() {
        let eni = Eni {
            id: "eni-1".into(),
            mac: "02:00:00:00:00:01".into(),
            number: 1,
            subnet: "10.0.1.0/24".parse().unwrap(),
            vpc_cidrs: vec!["10.0.0.0/16".parse().unwrap()],
        };
        let mut snapshot = Snapshot {
            generation: "7".into(),
            enis: BTreeMap::from([("eni-1".into(), eni)]),
            pool: BTreeMap::from([
                ("10.0.1.10".parse().unwrap(), "eni-1".into()),
                ("10.0.2.10".parse().unwrap(), "eni-2".into()),
            ]),
            ..Snapshot::default()
        };
        let err = snapshot.check().unwrap_err();
        assert_eq!(
            err.missing,
            BTreeMap::from([("10.0.2.10".parse().unwrap(), "eni-2".to_owned())])
        );
        assert_eq!(
            err.to_string(),
            "the snapshot lacks the ENI of 1 pool IP: 10.0.2.10 → eni-2"
        );
        snapshot.pool.retain(|_, eni| eni == "eni-1");
        assert_eq!(snapshot.check(), Ok(()));
        snapshot.malformed.push("pool IP \"x\" is not IPv4".into());
        assert!(
            snapshot
                .check()
                .unwrap_err()
                .to_string()
                .contains("unreadable")
        );
    }

    #[test]
    fn every_handshake_state_but_do_not_release_keeps_an_ip_from_being_handed_out() {
        for (text, in_handshake) in [
            ("marked-for-release", true),
            ("ready-for-release", true),
            ("released", true),
            ("do-not-release", false),
            ("something-new", true),
        ] {
            let state = ReleaseState::from_wire(text);
            assert_eq!(state.as_str(), text);
            assert_eq!(state.in_handshake(), in_handshake, "{text}");
        }
    }
}
