//! The transport wiring: a tonic server on a unix socket, reached through `connect_unix`.

use std::io;

mod common;

use common::FakeAgent;
use meshwork_proto::agent::v1::StatusRequest;
use meshwork_proto::agent::v1::agent_client::AgentClient;
use meshwork_proto::agent::v1::agent_server::AgentServer;
use meshwork_proto::{ConnectError, connect_unix};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

#[tokio::test]
async fn status_over_a_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.sock");
    // Bound before the server task starts, so the client can't race it.
    let listener = UnixListener::bind(&path).unwrap();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AgentServer::new(FakeAgent))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );

    let channel = connect_unix(&path).await.unwrap();
    let reply = AgentClient::new(channel)
        .status(StatusRequest {})
        .await
        .unwrap()
        .into_inner();
    let mesh = reply.clustermesh.unwrap();
    assert_eq!((mesh.ready, mesh.total), (1, 1));
    assert_eq!(mesh.clusters[0].name, "cluster-2");
    assert_eq!(mesh.clusters[0].cluster_id, 2);
    assert_eq!(mesh.clusters[0].last_error, None);

    server.abort();
}

#[tokio::test]
async fn missing_socket_is_a_socket_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.sock");
    let err = connect_unix(&path).await.unwrap_err();
    assert_socket_error(&err, io::ErrorKind::NotFound);
    assert_eq!(err.path(), path);
}

#[tokio::test]
async fn socket_without_listener_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stale.sock");
    // Dropping the listener leaves the socket file behind with nobody accepting: what a
    // crashed agent leaves.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let err = connect_unix(&path).await.unwrap_err();
    assert_socket_error(&err, io::ErrorKind::ConnectionRefused);
}

fn assert_socket_error(err: &ConnectError, kind: io::ErrorKind) {
    match err {
        ConnectError::Socket { error, .. } => assert_eq!(error.kind(), kind, "{err}"),
        ConnectError::Transport { .. } => panic!("expected a socket error, got {err}"),
    }
}
