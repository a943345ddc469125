//! Local endpoints: their persisted specs, the regeneration plan after a restart and the
//! `EndpointManager` actor.

pub mod manager;
pub mod plan;
pub mod spec;
pub mod store;

pub use manager::{EndpointManager, EndpointState, EndpointStatus};
pub use spec::EndpointSpec;
pub use store::EndpointStore;
