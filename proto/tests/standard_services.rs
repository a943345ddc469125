//! Health and reflection as every Meshwork server adds them: the health of each served
//! service follows the component's readiness (NOT_SERVING, SERVING, NOT_SERVING for good once
//! it stops), and reflection lists exactly the services served, with their documentation.

mod common;

use common::FakeAgent;
use futures::StreamExt as _;
use meshwork_proto::agent::v1::agent_server::{self, AgentServer};
use meshwork_proto::standard::client::{HealthStatus, health, reflected_services, watch_health};
use meshwork_proto::{StandardServices, connect_unix};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::Code;
use tonic_reflection::pb::v1alpha::ServerReflectionRequest;
use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;

const AGENT: &str = agent_server::SERVICE_NAME;

#[tokio::test]
async fn health_follows_readiness_and_reflection_lists_what_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let (standard, readiness) = StandardServices::new(&[AGENT]).await;
    let router = tonic::transport::Server::builder().add_service(AgentServer::new(FakeAgent));
    let server = tokio::spawn(
        standard
            .add_to(router)
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    let channel = connect_unix(&path).await.unwrap();

    for service in ["", AGENT] {
        assert_eq!(
            health(channel.clone(), service).await.unwrap(),
            HealthStatus::NotServing,
            "{service:?} before ready"
        );
    }
    let unknown = health(channel.clone(), "meshwork.agent.v1.Datapath").await;
    assert_eq!(
        unknown.unwrap_err().code(),
        Code::NotFound,
        "a service not served"
    );

    let mut watch = watch_health(channel.clone(), "").await.unwrap();
    assert_eq!(
        watch.next().await.unwrap().unwrap(),
        HealthStatus::NotServing
    );
    readiness.ready().await;
    assert_eq!(watch.next().await.unwrap().unwrap(), HealthStatus::Serving);
    assert_eq!(
        health(channel.clone(), AGENT).await.unwrap(),
        HealthStatus::Serving
    );
    readiness.shutting_down().await;
    assert_eq!(
        watch.next().await.unwrap().unwrap(),
        HealthStatus::NotServing
    );
    // A late "ready" (a start-up wait returning during the stop) changes nothing.
    readiness.ready().await;
    for service in ["", AGENT] {
        assert_eq!(
            health(channel.clone(), service).await.unwrap(),
            HealthStatus::NotServing,
            "{service:?} while stopping"
        );
    }

    assert_eq!(
        reflected_services(channel.clone()).await.unwrap(),
        [
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection",
            AGENT,
        ],
        "exactly the services served (not Datapath, Encrypt or NodeIpam)"
    );
    // v1alpha, which older tools use, serves the file with its comments.
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::FileContainingSymbol(AGENT.to_owned())),
    };
    let mut replies = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::once(request))
        .await
        .unwrap()
        .into_inner();
    let Some(MessageResponse::FileDescriptorResponse(files)) =
        replies.message().await.unwrap().unwrap().message_response
    else {
        panic!("no file descriptor for {AGENT}");
    };
    let file = files
        .file_descriptor_proto
        .iter()
        .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
        .find(|text| text.contains("meshwork/agent/v1/agent.proto"))
        .expect("agent.proto among the files");
    assert!(
        file.contains("Waits until the remote clusters have synced the given kinds"),
        "the descriptor carries the .proto comments"
    );
    server.abort();
}
