//! The standard gRPC services every Meshwork server serves beside its own, so that
//! `grpcurl`, `grpc_health_probe` and Kubernetes' native gRPC probes work against it:
//!
//! - `grpc.health.v1.Health`: the overall status (service `""`) and one status per served
//!   service, all following the component's [`Readiness`];
//! - server reflection, `grpc.reflection.v1` and `grpc.reflection.v1alpha`, over the
//!   descriptors of exactly the services the server has (with the `.proto` comments).

use std::sync::Arc;

use tokio::sync::Mutex;
use tonic::transport::server::Router;
use tonic_health::ServingStatus;
use tonic_health::server::{HealthReporter, HealthService};

/// Every Meshwork `.proto` file, compiled, with its comments (an encoded
/// `google.protobuf.FileDescriptorSet`).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/meshwork_descriptor_set.bin"));

/// The health service's own name.
pub const HEALTH_SERVICE: &str = "grpc.health.v1.Health";

/// The reflection services' names.
pub const REFLECTION_SERVICES: [&str; 2] = [
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
];

/// Whether a component is ready, as its health service reports it: `NOT_SERVING` until
/// [`Readiness::ready`], `SERVING` after, `NOT_SERVING` again from
/// [`Readiness::shutting_down`] on (for good: a late `ready` cannot undo it).
#[derive(Clone)]
pub struct Readiness {
    reporter: HealthReporter,
    services: Arc<[&'static str]>,
    stopping: Arc<Mutex<bool>>,
}

impl Readiness {
    /// Reports the component ready: every service and the server `SERVING`.
    pub async fn ready(&self) {
        let stopping = self.stopping.lock().await;
        if !*stopping {
            self.report(ServingStatus::Serving).await;
        }
    }

    /// Reports the component stopping: every service and the server `NOT_SERVING`, from now on.
    pub async fn shutting_down(&self) {
        let mut stopping = self.stopping.lock().await;
        *stopping = true;
        self.report(ServingStatus::NotServing).await;
    }

    async fn report(&self, status: ServingStatus) {
        self.reporter.set_service_status("", status).await;
        for service in self.services.iter() {
            self.reporter.set_service_status(service, status).await;
        }
    }
}

/// Health and reflection for one server, made by [`StandardServices::new`] and added to its
/// router by [`StandardServices::add_to`].
pub struct StandardServices {
    health: HealthService,
    services: Vec<&'static str>,
}

impl StandardServices {
    /// The standard services of a server that serves `services` (their full names, such as
    /// `meshwork.agent.v1.Agent`); all `NOT_SERVING` until the returned [`Readiness`] says
    /// otherwise.
    pub async fn new(services: &[&'static str]) -> (Self, Readiness) {
        let reporter = HealthReporter::new();
        let readiness = Readiness {
            reporter: reporter.clone(),
            services: services.into(),
            stopping: Arc::new(Mutex::new(false)),
        };
        readiness.report(ServingStatus::NotServing).await;
        let standard = Self {
            health: HealthService::from_health_reporter(reporter),
            services: services.to_vec(),
        };
        (standard, readiness)
    }

    /// Adds health and both reflection versions to `router`.
    pub fn add_to<L>(self, router: Router<L>) -> Router<L> {
        let reflection = || {
            let mut builder = tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
                .with_service_name(HEALTH_SERVICE);
            for name in REFLECTION_SERVICES.iter().chain(&self.services) {
                builder = builder.with_service_name(*name);
            }
            builder
        };
        // The descriptor sets are compiled into the binaries; `descriptors_are_valid` tests them.
        let v1 = reflection()
            .build_v1()
            .expect("the compiled descriptor sets are valid");
        let v1alpha = reflection()
            .build_v1alpha()
            .expect("the compiled descriptor sets are valid");
        router
            .add_service(tonic_health::pb::health_server::HealthServer::new(
                self.health,
            ))
            .add_service(v1)
            .add_service(v1alpha)
    }
}

/// The client side of the standard services, for meshctl and the tests.
pub mod client {
    use tonic::Status;
    use tonic::transport::Channel;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::{HealthCheckRequest, health_check_response};
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    pub use tonic_health::pb::health_check_response::ServingStatus as HealthStatus;

    /// `service`'s status (`""`: the server's), by `grpc.health.v1.Health/Check`.
    pub async fn health(channel: Channel, service: &str) -> Result<HealthStatus, Status> {
        let reply = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await?
            .into_inner();
        Ok(health_check_response::ServingStatus::try_from(reply.status)
            .unwrap_or(HealthStatus::Unknown))
    }

    /// `service`'s statuses as `grpc.health.v1.Health/Watch` streams them: the current
    /// one first, then each change.
    pub async fn watch_health(
        channel: Channel,
        service: &str,
    ) -> Result<impl futures::Stream<Item = Result<HealthStatus, Status>>, Status> {
        let stream = HealthClient::new(channel)
            .watch(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await?
            .into_inner();
        Ok(futures::StreamExt::map(stream, |reply| {
            reply.map(|r| {
                health_check_response::ServingStatus::try_from(r.status)
                    .unwrap_or(HealthStatus::Unknown)
            })
        }))
    }

    /// The services the server lists through `grpc.reflection.v1`, sorted.
    pub async fn reflected_services(channel: Channel) -> Result<Vec<String>, Status> {
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut replies = ServerReflectionClient::new(channel)
            .server_reflection_info(tokio_stream::once(request))
            .await?
            .into_inner();
        match replies.message().await?.and_then(|r| r.message_response) {
            Some(MessageResponse::ListServicesResponse(list)) => {
                let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
                names.sort();
                Ok(names)
            }
            Some(MessageResponse::ErrorResponse(error)) => Err(Status::new(
                tonic::Code::from(error.error_code),
                error.error_message,
            )),
            other => Err(Status::internal(format!(
                "unexpected reflection reply: {other:?}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_are_valid() {
        for build in [
            |b: tonic_reflection::server::Builder<'_>| b.build_v1().map(drop),
            |b: tonic_reflection::server::Builder<'_>| b.build_v1alpha().map(drop),
        ] {
            let builder = tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET);
            build(builder).expect("valid descriptor sets");
        }
    }
}
