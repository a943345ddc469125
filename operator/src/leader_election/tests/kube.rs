//! The exact requests the election makes to the Kubernetes API (kube's tower-test mock,
//! each request asserted in order and answered by hand), in paused time.

use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::timing;
use crate::leader_election::{
    Elector, Ended, KubeLease, LEASE_NAME, LeaseApi, LeaseError, Role, run,
};

const NAMESPACE: &str = "meshwork-system";

/// Longer than any wait of the election (paused time: it costs nothing).
const REQUEST_DEADLINE: Duration = Duration::from_secs(120);

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

fn collection() -> String {
    format!("/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases")
}

fn object() -> String {
    format!("{}/{LEASE_NAME}", collection())
}

fn lease_api() -> (KubeLease, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    (KubeLease::new(client, NAMESPACE, LEASE_NAME), handle)
}

fn respond(code: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .body(Body::from(serde_json::to_vec(body).expect("json")))
        .expect("response")
}

fn failure(code: StatusCode, reason: &str) -> Response<Body> {
    respond(
        code,
        &json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("simulated {reason}"), "reason": reason, "code": code.as_u16()
        }),
    )
}

/// What was sent, stored at `version`.
fn stored(mut sent: Value, version: u64) -> Value {
    sent["metadata"]["resourceVersion"] = json!(version.to_string());
    sent
}

/// A Lease held by `holder`, renewed `lease_duration` seconds long, at `version`.
fn held_by(holder: &str, version: u64, transitions: i32) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": LEASE_NAME, "namespace": NAMESPACE, "resourceVersion": version.to_string()},
        "spec": {
            "holderIdentity": holder, "leaseDurationSeconds": 15,
            "acquireTime": "2026-12-01T00:00:00.000000Z", "renewTime": "2026-12-01T00:00:10.000000Z",
            "leaseTransitions": transitions
        }
    })
}

/// Asserts the requests, one at a time, in order.
struct Verifier(Handle);

impl Verifier {
    /// The next request must be `method path`; answers it with `answer(body)` and returns
    /// the body it carried.
    async fn expect(
        &mut self,
        method: Method,
        path: &str,
        answer: impl FnOnce(Option<&Value>) -> Response<Body>,
    ) -> Option<Value> {
        let next = tokio::time::timeout(REQUEST_DEADLINE, self.0.next_request()).await;
        let (request, send) = next
            .unwrap_or_else(|_| panic!("no {method} {path} within {REQUEST_DEADLINE:?}"))
            .unwrap_or_else(|| panic!("client gone before {method} {path}"));
        assert_eq!(
            (request.method(), request.uri().path()),
            (&method, path),
            "the next request"
        );
        let bytes = request.into_body().collect_bytes().await.expect("body");
        let body: Option<Value> =
            (!bytes.is_empty()).then(|| serde_json::from_slice(&bytes).expect("JSON body"));
        send.send_response(answer(body.as_ref()));
        body
    }
}

fn spec(body: &Value) -> &Value {
    &body["spec"]
}

#[tokio::test(start_paused = true)]
async fn acquire_renew_and_release_are_get_post_get_put_get_put() {
    let (api, handle) = lease_api();
    let mut verifier = Verifier(handle);
    let (sender, mut role) = watch::channel(Role::Candidate { holder: None });
    let stop = CancellationToken::new();
    let token = stop.clone();
    let driver = tokio::spawn(async move {
        let mut elector = Elector::new("operator-0_uuid", timing());
        run(&api, &mut elector, &token, &sender).await
    });

    // No lease: created, naming this candidate.
    verifier
        .expect(Method::GET, &object(), |_| {
            failure(StatusCode::NOT_FOUND, "NotFound")
        })
        .await;
    let created = verifier
        .expect(Method::POST, &collection(), |sent| {
            respond(
                StatusCode::CREATED,
                &stored(sent.expect("a body").clone(), 1),
            )
        })
        .await
        .expect("a body");
    assert_eq!(created["metadata"]["name"], LEASE_NAME);
    assert!(
        created["metadata"].get("resourceVersion").is_none(),
        "a create is unguarded"
    );
    assert_eq!(spec(&created)["holderIdentity"], "operator-0_uuid");
    assert_eq!(spec(&created)["leaseDurationSeconds"], 15);
    assert_eq!(spec(&created)["leaseTransitions"], 0);
    assert_eq!(spec(&created)["acquireTime"], spec(&created)["renewTime"]);
    role.wait_for(|role| *role == Role::Leader)
        .await
        .expect("leading");

    // A retry period later: read, then renew guarded by the version read.
    let read_again = stored(created.clone(), 1);
    verifier
        .expect(Method::GET, &object(), |_| {
            respond(StatusCode::OK, &read_again)
        })
        .await;
    let renewed = verifier
        .expect(Method::PUT, &object(), |sent| {
            respond(StatusCode::OK, &stored(sent.expect("a body").clone(), 2))
        })
        .await
        .expect("a body");
    assert_eq!(renewed["metadata"]["resourceVersion"], "1");
    assert_eq!(spec(&renewed)["holderIdentity"], "operator-0_uuid");
    assert_eq!(spec(&renewed)["acquireTime"], spec(&created)["acquireTime"]);
    assert_eq!(spec(&renewed)["leaseTransitions"], 0);

    // Stopped while leading: read, then give it up (empty holder, one second).
    stop.cancel();
    let current = stored(renewed.clone(), 2);
    verifier
        .expect(Method::GET, &object(), |_| {
            respond(StatusCode::OK, &current)
        })
        .await;
    let released = verifier
        .expect(Method::PUT, &object(), |sent| {
            respond(StatusCode::OK, &stored(sent.expect("a body").clone(), 3))
        })
        .await
        .expect("a body");
    assert_eq!(released["metadata"]["resourceVersion"], "2");
    assert_eq!(spec(&released)["holderIdentity"], "");
    assert_eq!(spec(&released)["leaseDurationSeconds"], 1);
    assert_eq!(driver.await.expect("driver"), Ended::Stopped);
}

#[tokio::test(start_paused = true)]
async fn a_lease_held_by_another_is_only_read_until_it_expires_then_a_409_keeps_it_theirs() {
    let (api, handle) = lease_api();
    let mut verifier = Verifier(handle);
    let (sender, role) = watch::channel(Role::Candidate { holder: None });
    let stop = CancellationToken::new();
    let token = stop.clone();
    let driver = tokio::spawn(async move {
        let mut elector = Elector::new("operator-1_uuid", timing());
        run(&api, &mut elector, &token, &sender).await
    });

    let theirs = held_by("operator-0_other", 41, 2);
    let started = tokio::time::Instant::now();
    // Unchanged for a lease duration: every request until then is a read (a write would
    // fail the method assertion).
    // One read every retry period: at 0, 2, …, 14 s.
    for _ in 0..8 {
        verifier
            .expect(Method::GET, &object(), |_| respond(StatusCode::OK, &theirs))
            .await;
    }
    let elapsed = started.elapsed();
    assert!(elapsed < timing().lease_duration, "{elapsed:?}");
    assert_eq!(
        *role.borrow(),
        Role::Candidate {
            holder: Some("operator-0_other".to_owned())
        }
    );

    // Expired: the takeover is a PUT guarded by the version read; the holder renewed in
    // between (409), so this candidate stays one and reads again.
    verifier
        .expect(Method::GET, &object(), |_| respond(StatusCode::OK, &theirs))
        .await;
    let takeover = verifier
        .expect(Method::PUT, &object(), |_| {
            failure(StatusCode::CONFLICT, "Conflict")
        })
        .await
        .expect("a body");
    assert_eq!(takeover["metadata"]["resourceVersion"], "41");
    assert_eq!(spec(&takeover)["holderIdentity"], "operator-1_uuid");
    assert_eq!(spec(&takeover)["leaseTransitions"], 3);
    let renewed_by_them = held_by("operator-0_other", 42, 2);
    verifier
        .expect(Method::GET, &object(), |_| {
            respond(StatusCode::OK, &renewed_by_them)
        })
        .await;
    assert_ne!(*role.borrow(), Role::Leader);
    stop.cancel();
    assert_eq!(driver.await.expect("driver"), Ended::Stopped);
}

#[tokio::test]
async fn conflicts_and_other_failures_are_told_apart() {
    let (api, handle) = lease_api();
    let mut verifier = Verifier(handle);
    let record = crate::leader_election::lease::from_spec(None);
    let client = tokio::spawn(async move {
        let conflict = api.update(&record, "1").await;
        let exists = api.create(&record).await;
        let refused = api.get().await;
        (conflict, exists, refused)
    });
    verifier
        .expect(Method::PUT, &object(), |_| {
            failure(StatusCode::CONFLICT, "Conflict")
        })
        .await;
    verifier
        .expect(Method::POST, &collection(), |_| {
            failure(StatusCode::CONFLICT, "AlreadyExists")
        })
        .await;
    verifier
        .expect(Method::GET, &object(), |_| {
            failure(StatusCode::FORBIDDEN, "Forbidden")
        })
        .await;
    let (conflict, exists, refused) = client.await.expect("client");
    assert!(
        matches!(conflict, Err(LeaseError::Conflict)),
        "{conflict:?}"
    );
    assert!(matches!(exists, Err(LeaseError::Conflict)), "{exists:?}");
    assert!(matches!(refused, Err(LeaseError::Kube(_))), "{refused:?}");
}
