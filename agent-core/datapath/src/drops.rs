//! Drop counters by reason, summed over CPUs. Keep the codes in step with `bpf/endpoint.c`.

use super::maps::{DROPS_MAP, MapsError, PinDir, counter_sum};

/// Why the endpoint program dropped a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// The destination is in no ipcache entry.
    UnknownDestination = 1,
    /// The destination's identity is not allowed by the endpoint's policy.
    PolicyDenied = 2,
    /// The packet is too short for its headers.
    Malformed = 3,
}

impl DropReason {
    /// Every reason.
    pub const ALL: [Self; 3] = [
        Self::UnknownDestination,
        Self::PolicyDenied,
        Self::Malformed,
    ];

    /// The label used in status and metrics.
    pub fn label(self) -> &'static str {
        match self {
            Self::UnknownDestination => "unknown_destination",
            Self::PolicyDenied => "policy_denied",
            Self::Malformed => "malformed",
        }
    }
}

/// Reads the pinned counters: (reason, packets) for every reason.
pub fn read(pins: &PinDir) -> Result<Vec<(DropReason, u64)>, MapsError> {
    let map = pins.open_drops()?;
    DropReason::ALL
        .iter()
        .map(|&reason| Ok((reason, counter_sum(&map, DROPS_MAP, reason as u32)?)))
        .collect()
}

/// The total of all reasons.
pub fn total(counts: &[(DropReason, u64)]) -> u64 {
    counts.iter().map(|(_, n)| n).sum()
}
