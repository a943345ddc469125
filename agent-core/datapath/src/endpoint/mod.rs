//! Local endpoints: their persisted specs, the regeneration plan after a restart, and the
//! table of endpoints with the device work they need.

pub mod endpoints;
pub mod plan;
pub mod spec;
pub mod store;

pub use endpoints::{EndpointState, EndpointStatus, Endpoints, Job};
pub use spec::EndpointSpec;
pub use store::EndpointStore;
