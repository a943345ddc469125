//! What the socket-LB programs did, from their pinned per-CPU counters
//! (`meshwork_sock_lb_stats`, declared in `bpf/lb4.h`): translations by hook and refusals.
//! The endpoint object creates the map whenever the agent starts, so it can be read with
//! socket-LB off (all zero); pinned, it counts on across agent restarts like the programs.

use super::maps::{MapsError, PinDir, counter_sum};

/// The counters' map name (and pin file name).
pub const SOCKET_LB_STATS_MAP: &str = "meshwork_sock_lb_stats";

/// Index of the refusals in the map. Keep in step with `SOCK_LB_REFUSED` in `bpf/lb4.h`.
const REFUSED: u32 = 4;

/// The socket hook that translated, by Cilium's name for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SocketLbHook {
    /// `connect(2)`: a frontend to a backend.
    Connect4 = 0,
    /// `sendmsg(2)` on an unconnected UDP socket: a frontend to a backend.
    Sendmsg4 = 1,
    /// `recvmsg(2)` on UDP: the backend read back as the frontend.
    Recvmsg4 = 2,
    /// `getpeername(2)`: the backend read back as the frontend.
    Getpeername4 = 3,
}

impl SocketLbHook {
    /// Every hook, in the map's order (the discriminants are the `SOCK_LB_*` indices).
    pub const ALL: [Self; 4] = [
        Self::Connect4,
        Self::Sendmsg4,
        Self::Recvmsg4,
        Self::Getpeername4,
    ];

    /// The label used in metrics.
    pub fn label(self) -> &'static str {
        match self {
            Self::Connect4 => "connect4",
            Self::Sendmsg4 => "sendmsg4",
            Self::Recvmsg4 => "recvmsg4",
            Self::Getpeername4 => "getpeername4",
        }
    }
}

/// The counters, each summed over CPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SocketLbStats {
    /// Translations by hook, in [`SocketLbHook::ALL`]'s order.
    pub translations: Vec<(SocketLbHook, u64)>,
    /// Connects and sends refused: a frontend without backends (`EHOSTUNREACH`), or a
    /// socket's reverse record that could not be written (`ENOMEM`).
    pub refusals: u64,
}

/// Reads the pinned counters.
pub fn read(pins: &PinDir) -> Result<SocketLbStats, MapsError> {
    let map = pins.open_counters(SOCKET_LB_STATS_MAP)?;
    let translations = SocketLbHook::ALL
        .iter()
        .map(|&hook| Ok((hook, counter_sum(&map, SOCKET_LB_STATS_MAP, hook as u32)?)))
        .collect::<Result<_, MapsError>>()?;
    Ok(SocketLbStats {
        translations,
        refusals: counter_sum(&map, SOCKET_LB_STATS_MAP, REFUSED)?,
    })
}
