//! The BPF datapath: the endpoint program (C, `agent-core/bpf/`), the pinned maps it shares
//! with the agent, the actor that writes them and the endpoints that use them.
//!
//! - [`ipcache_map`]: Cilium's ipcache key/value layout and entry checks.
//! - [`maps`]: the pin directory `<bpf-root>/tc/globals`, map creation and opening.
//! - [`ipcache_writer`]: desired content and batched writes (plain state machine).
//! - [`services`], [`tunnel`]: global services as lb4 maps, remote pod CIDRs as the tunnel
//!   map (plain state machines); [`pinned_sync`] writes them, keeping restored entries until
//!   the matching wait.
//! - [`writer_actor`]: the `DatapathWriter` actor.
//! - [`program`]: loading and attaching an endpoint's program.
//! - [`endpoint`]: endpoints, their persistence and the `EndpointManager` actor.
//! - [`drops`]: the drop counters by reason.

pub mod bpf_sys;
pub mod drops;
pub mod endpoint;
pub mod ipcache_map;
pub mod ipcache_writer;
pub mod lb_writer;
pub mod maps;
pub mod pinned_sync;
pub mod program;
pub mod services;
pub mod tunnel;
pub mod writer_actor;
