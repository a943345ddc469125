//! The real `meshwork-apiserver` binary for the tests, and agents played by gRPC clients of
//! `meshwork.apiserver.v1.Export`.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use meshwork_lab::process::LabProcess;
use meshwork_lab::wait::{Wait, free_port};
use meshwork_proto::apiserver::v1 as pb;
use meshwork_proto::apiserver::v1::export_client::ExportClient;
use pb::publish_request::Request as Publish;
use pb::publish_response::Response as Answer;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::Channel;

pub const DEADLINE: Duration = Duration::from_secs(30);
pub const NODE_GC_GRACE: Duration = Duration::from_secs(3);

/// A running apiserver and its ports.
pub struct Apiserver {
    /// The process.
    pub process: LabProcess,
    /// `--grpc-serve-addr`'s port.
    pub grpc: u16,
    /// `--health-serve-addr`'s port.
    pub health: u16,
    /// `--prometheus-serve-addr`'s port.
    pub metrics: u16,
}

impl Apiserver {
    /// SIGKILLs it and waits until it is gone, as a crash would leave things.
    pub fn kill(&mut self) {
        self.process
            .signal(nix::sys::signal::Signal::SIGKILL)
            .unwrap();
        Wait::new("the apiserver to die")
            .timeout(DEADLINE)
            .some(|| self.process.exit_status())
            .unwrap();
    }

    /// Its ports, for a restart on the same ones.
    pub fn ports(&self) -> (u16, u16, u16) {
        (self.grpc, self.health, self.metrics)
    }
}

pub fn start(etcd: &str, dir: &std::path::Path, ports: Option<(u16, u16, u16)>) -> Apiserver {
    start_with(etcd, dir, ports, &[])
}

/// [`start`] with `extra` flags.
pub fn start_with(
    etcd: &str,
    dir: &std::path::Path,
    ports: Option<(u16, u16, u16)>,
    extra: &[String],
) -> Apiserver {
    let (grpc, health, metrics) = ports.unwrap_or_else(|| {
        (
            free_port().unwrap(),
            free_port().unwrap(),
            free_port().unwrap(),
        )
    });
    let mut command = Command::new(env!("CARGO_BIN_EXE_meshwork-apiserver"));
    command
        .args(["--cluster-name", "c1", "--cluster-id", "1"])
        .args(["--kvstore-endpoints", etcd])
        .args(["--initial-sync-timeout", "2s"])
        .args(["--node-gc-grace", &format!("{}s", NODE_GC_GRACE.as_secs())])
        .args(["--grpc-serve-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--health-serve-addr", &format!("127.0.0.1:{health}")])
        .args(["--prometheus-serve-addr", &format!("127.0.0.1:{metrics}")])
        .args(extra);
    // A log of its own per start: a restart must not read the last one's "running".
    static STARTS: AtomicUsize = AtomicUsize::new(0);
    let log: PathBuf = dir.join(format!(
        "apiserver-{}.log",
        STARTS.fetch_add(1, Ordering::Relaxed)
    ));
    let process = LabProcess::spawn("meshwork-apiserver", command, &log).unwrap();
    let apiserver = Apiserver {
        process,
        grpc,
        health,
        metrics,
    };
    let text = Wait::new("the apiserver to run")
        .timeout(DEADLINE)
        .every(Duration::from_millis(50))
        .until(
            || std::fs::read_to_string(&log).unwrap_or_default(),
            |log| log.contains("meshwork-apiserver running") || log.contains("meshwork-apiserver:"),
        )
        .unwrap();
    assert!(text.contains("meshwork-apiserver running"), "{text}");
    apiserver
}

pub async fn channel(port: u16) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .expect("the apiserver's gRPC port")
}

pub async fn http_get(port: u16, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.unwrap();
    let status = reply
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, reply)
}

/// Waits (at most `within`) until `/readyz` on `port` answers 200; the last answer on timeout.
pub async fn wait_readyz(port: u16, within: Duration) -> Result<(), String> {
    Wait::new("/readyz 200")
        .timeout(within)
        .every(Duration::from_millis(100))
        .until_async(|| http_get(port, "/readyz"), |(status, _)| *status == 200)
        .await
        .map(drop)
        .map_err(|err| err.to_string())
}

pub fn node(name: &str, index: u8) -> pb::Node {
    pb::Node {
        name: name.to_owned(),
        addresses: vec![pb::NodeAddress {
            r#type: "InternalIP".to_owned(),
            ip: format!("192.0.2.{index}"),
        }],
        ipv4_alloc_cidrs: vec![format!("10.1.{index}.0/24")],
        ..pb::Node::default()
    }
}

pub fn endpoint(index: u8, i: u8) -> pb::Endpoint {
    pb::Endpoint {
        id: u64::from(i),
        ips: vec![format!("10.1.{index}.{i}")],
        labels: vec![format!("k8s:app=app{}", i % 2)],
        pod_namespace: "default".to_owned(),
        pod_name: format!("pod-{i}"),
        ..pb::Endpoint::default()
    }
}

/// An agent's publishing session, open while this lives.
pub struct Agent {
    requests: mpsc::Sender<pb::PublishRequest>,
    answers: Streaming<pb::PublishResponse>,
    index: u8,
    /// The cluster's services as last received (they come between the other answers).
    pub local_services: Option<pb::LocalServices>,
}

pub fn send(request: Publish) -> pb::PublishRequest {
    pb::PublishRequest {
        request: Some(request),
    }
}

impl Agent {
    /// Opens a session that has published node `name` (node `index`) and nothing else.
    pub async fn open(port: u16, name: &str, index: u8) -> Result<Self, tonic::Status> {
        Self::open_on(channel(port).await, name, index).await
    }

    /// [`Self::open`] on `channel`.
    pub async fn open_on(channel: Channel, name: &str, index: u8) -> Result<Self, tonic::Status> {
        let (requests, rx) = mpsc::channel(64);
        requests
            .send(send(Publish::Node(node(name, index))))
            .await
            .unwrap();
        let mut client = ExportClient::new(channel);
        let answers = client.publish(ReceiverStream::new(rx)).await?.into_inner();
        Ok(Self {
            requests,
            answers,
            index,
            local_services: None,
        })
    }

    /// Publishes `endpoints` pods and the end of the initial state; returns once the
    /// apiserver says it is written.
    pub async fn finish(&mut self, endpoints: u8) -> Result<(), tonic::Status> {
        self.finish_range(1, endpoints).await
    }

    /// Publishes pods `from..=to`, then the end of the initial state (again, when it was
    /// sent before: a barrier); returns once the apiserver says all is written.
    pub async fn finish_range(&mut self, from: u8, to: u8) -> Result<(), tonic::Status> {
        for i in from..=to {
            let request = send(Publish::Endpoint(endpoint(self.index, i)));
            self.requests.send(request).await.unwrap();
            let answer = self.answer().await?;
            let Some(Answer::Identity(identity)) = answer else {
                panic!("no identity for endpoint {i}: {answer:?}");
            };
            assert_eq!(identity.endpoint_id, u64::from(i));
            // The first labels seen (app1) got the first ID of the range, app0 the next.
            assert_eq!(identity.identity, 65536 + u32::from(i % 2 == 0));
        }
        self.requests
            .send(send(Publish::InitialStateComplete(true)))
            .await
            .unwrap();
        let written = self.answer().await?;
        assert_eq!(written, Some(Answer::InitialStateWritten(true)));
        Ok(())
    }

    /// The next answer that is not a set of local services (those are kept in
    /// [`Self::local_services`]).
    async fn answer(&mut self) -> Result<Option<Answer>, tonic::Status> {
        loop {
            match self.answers.message().await?.and_then(|a| a.response) {
                Some(Answer::LocalServices(set)) => self.local_services = Some(set),
                other => return Ok(other),
            }
        }
    }

    /// The next set of local services the apiserver sends (at most [`DEADLINE`] away).
    pub async fn next_local_services(&mut self) -> pb::LocalServices {
        let next = async {
            match self
                .answers
                .message()
                .await
                .unwrap()
                .and_then(|a| a.response)
            {
                Some(Answer::LocalServices(set)) => set,
                Some(other) => panic!("expected local services, got {other:?}"),
                None => panic!("the session ended"),
            }
        };
        let set = tokio::time::timeout(DEADLINE, next)
            .await
            .expect("no local services in time");
        self.local_services = Some(set.clone());
        set
    }

    /// Whether a set of local services has arrived and waits unread (read without waiting).
    pub fn local_services_waiting(&mut self) -> bool {
        use futures::FutureExt as _;
        match self.answers.message().now_or_never() {
            Some(Ok(Some(pb::PublishResponse {
                response: Some(Answer::LocalServices(set)),
            }))) => {
                self.local_services = Some(set);
                true
            }
            None => false,
            Some(other) => panic!("an unexpected answer: {other:?}"),
        }
    }

    /// [`Self::open`], then [`Self::finish`].
    pub async fn publish(
        port: u16,
        name: &str,
        index: u8,
        endpoints: u8,
    ) -> Result<Self, tonic::Status> {
        let mut agent = Self::open(port, name, index).await?;
        agent.finish(endpoints).await?;
        Ok(agent)
    }
}
