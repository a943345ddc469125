//! Kubernetes API stand-ins on kube's tower-test mock: a [`Verifier`] that asserts each
//! expected request in order, and a [`SimulatedApiServer`] that applies every write to an
//! object the way the API server does (status subresource vs main resource, resourceVersion
//! checks) and hands each resulting version to an observer.

use std::collections::BTreeMap;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::json;

use crate::cilium_node::{CiliumNode, CiliumNodeSpec};

/// The mock's server side.
pub type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// How long any single expected request may take to arrive.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(10);

/// The path of CiliumNode `name`.
pub fn node_path(name: &str) -> String {
    format!("/apis/cilium.io/v2/ciliumnodes/{name}")
}

/// A client whose requests arrive at the returned handle.
pub fn mock_client() -> (Client, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, "default"), handle)
}

/// A JSON response.
pub fn respond(code: StatusCode, body: &serde_json::Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .body(Body::from(serde_json::to_vec(body).expect("json")))
        .expect("response")
}

/// A `metav1.Status` failure response.
pub fn failure(code: StatusCode, reason: &str) -> Response<Body> {
    respond(
        code,
        &json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("simulated {reason}"), "reason": reason, "code": code.as_u16()
        }),
    )
}

/// Asserts the requests the store makes, one at a time, in order.
pub struct Verifier {
    handle: Handle,
}

impl Verifier {
    /// Verifies the requests arriving at `handle`.
    pub fn new(handle: Handle) -> Self {
        Self { handle }
    }

    /// Waits for the next request, asserts its method and path, and answers it with what
    /// `answer` makes of its decoded body (`None` for a body-less request).
    pub async fn expect(
        &mut self,
        method: Method,
        path: &str,
        answer: impl FnOnce(Option<CiliumNode>) -> Response<Body>,
    ) {
        let next = tokio::time::timeout(REQUEST_DEADLINE, self.handle.next_request()).await;
        let (request, send) = next
            .unwrap_or_else(|_| panic!("no {method} {path} within {REQUEST_DEADLINE:?}"))
            .unwrap_or_else(|| panic!("client gone before {method} {path}"));
        assert_eq!(request.method(), method, "method of the request to {path}");
        assert_eq!(request.uri().path(), path);
        let bytes = request.into_body().collect_bytes().await.expect("body");
        let body = (!bytes.is_empty()).then(|| serde_json::from_slice(&bytes).expect("CiliumNode"));
        send.send_response(answer(body));
    }

    /// Asserts the client makes no further request (it must have been dropped).
    pub async fn expect_no_more(mut self) {
        let next = tokio::time::timeout(REQUEST_DEADLINE, self.handle.next_request()).await;
        if let Some((request, _)) = next.expect("client not dropped") {
            panic!("unexpected {} {}", request.method(), request.uri().path());
        }
    }
}

/// Sets `node`'s resourceVersion.
pub fn with_version(mut node: CiliumNode, version: u64) -> CiliumNode {
    node.metadata.resource_version = Some(version.to_string());
    node
}

/// An API server holding CiliumNodes in memory. A GET of an unknown node creates it with
/// `spec.eni.instance-id = i-<suffix>` (as an agent would have); PUT on `/status` takes
/// only the status, PUT on the object only the spec; a stale resourceVersion is a 409.
pub struct SimulatedApiServer {
    objects: BTreeMap<String, CiliumNode>,
    version: u64,
}

impl SimulatedApiServer {
    /// An empty server.
    pub fn new() -> Self {
        Self {
            objects: BTreeMap::new(),
            version: 0,
        }
    }

    /// Serves `handle` until the client is dropped, passing every version a write produced
    /// to `observe`.
    pub async fn serve(mut self, mut handle: Handle, mut observe: impl FnMut(&CiliumNode)) {
        while let Some((request, send)) = handle.next_request().await {
            let method = request.method().clone();
            let path = request.uri().path().to_owned();
            let bytes = request.into_body().collect_bytes().await.expect("body");
            let response = self.handle(&method, &path, &bytes, &mut observe);
            send.send_response(response);
        }
    }

    fn handle(
        &mut self,
        method: &Method,
        path: &str,
        body: &[u8],
        observe: &mut impl FnMut(&CiliumNode),
    ) -> Response<Body> {
        let rest = path
            .strip_prefix("/apis/cilium.io/v2/ciliumnodes/")
            .expect("a CiliumNode path");
        let (name, status) = match rest.strip_suffix("/status") {
            Some(name) => (name.to_owned(), true),
            None => (rest.to_owned(), false),
        };
        if *method == Method::GET {
            self.version += 1;
            let version = self.version;
            let node = self.objects.entry(name.clone()).or_insert_with(|| {
                let mut spec = CiliumNodeSpec::default();
                spec.eni.instance_id = name.replacen("node-", "i-", 1);
                with_version(CiliumNode::new(&name, spec), version)
            });
            return respond(StatusCode::OK, &serde_json::to_value(&*node).expect("json"));
        }
        assert_eq!(*method, Method::PUT, "only GET and PUT are expected");
        let sent: CiliumNode = serde_json::from_slice(body).expect("CiliumNode");
        let Some(stored) = self.objects.get_mut(&name) else {
            return failure(StatusCode::NOT_FOUND, "NotFound");
        };
        if sent.metadata.resource_version != stored.metadata.resource_version {
            return failure(StatusCode::CONFLICT, "Conflict");
        }
        if status {
            stored.status = sent.status;
        } else {
            stored.spec = sent.spec;
        }
        self.version += 1;
        stored.metadata.resource_version = Some(self.version.to_string());
        observe(stored);
        respond(
            StatusCode::OK,
            &serde_json::to_value(&*stored).expect("json"),
        )
    }
}
