//! Meshwork's BPF datapath: the endpoint and socket-LB programs (C, `bpf/`, built by clang in the build
//! script), the pinned maps it shares with the agent, and the plain state machines that keep
//! them. No actors here: the agent's actors are shells over these.
//!
//! - [`ipcache_map`]: Cilium's ipcache key/value layout and entry checks.
//! - [`maps`]: the pin directory `<bpf-root>/tc/globals`, map creation and opening.
//! - [`ipcache_writer`]: desired ipcache content by owner, and batched writes.
//! - [`services`], [`tunnel`]: global services as lb4 maps, remote pod CIDRs as the tunnel
//!   map; [`remote_maps`] keeps both, and [`pinned_sync`] writes them, keeping restored
//!   entries until the matching wait.
//! - [`writer`]: everything the agent writes, in one place.
//! - [`program`]: loading and attaching an endpoint's program.
//! - [`socket_lb`]: the socket-LB programs (`bpf/sock_lb.c`) on a cgroup, their links pinned;
//!   [`socket_lb_stats`]: their counters (translations by hook, refusals).
//! - [`endpoint`]: endpoints, their persistence and their regeneration jobs.
//! - [`drops`]: the drop counters by reason.

mod bpf_sys;
pub use bpf_sys::BatchError;
pub mod drops;
pub mod endpoint;
mod flush_thread;
pub mod ipcache_map;
pub mod ipcache_writer;
pub mod maps;
pub mod pinned_sync;
pub mod program;
pub mod remote_maps;
pub mod services;
pub mod socket_lb;
pub mod socket_lb_stats;
pub mod tunnel;
pub mod writer;
