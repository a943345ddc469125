//! One endpoint, step by step as in Cilium: URL, DNS (names only), TCP, TLS (https only)
//! with the server's certificate, then a raw `GET /version`. A step that fails ends the
//! endpoint's checks: the next ones need what it would have given.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use meshwork_kvstore::EtcdConfig;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;

use super::certs::server_cert_check;
use super::probe::Budget;
use super::report::{Check, CheckKind};
use super::target::{Host, Target};
use super::tls::{self, TlsSetup};

/// Cilium gives the `/version` answer one second.
const VERSION_TIMEOUT: Duration = Duration::from_secs(1);
/// More than etcd's answer ever takes.
const VERSION_MAX_BYTES: usize = 64 * 1024;

/// Checks `endpoint` of `config` and returns whether a TCP connection to it was made (the
/// etcd client is only worth trying when one was).
pub async fn check(
    endpoint: &str,
    config: &EtcdConfig,
    tls: Option<&TlsSetup>,
    budget: &Budget,
    now: SystemTime,
    out: &mut Vec<Check>,
) -> bool {
    let mut push = |check: Check| out.push(check.at(endpoint));
    let target = match Target::parse(endpoint, config.uses_tls()) {
        Ok(target) => target,
        Err(err) => {
            push(Check::fail(
                CheckKind::Url,
                err,
                "an endpoint is http(s)://HOST[:PORT] or HOST:PORT",
            ));
            return false;
        }
    };
    push(Check::ok(CheckKind::Url, target.describe()));

    let addrs = match &target.host {
        Host::Ip(ip) => vec![SocketAddr::new(*ip, target.port)],
        Host::Name(name) => {
            let lookup = tokio::net::lookup_host((name.as_str(), target.port));
            match budget.within(lookup).await {
                Ok(Ok(addrs)) => {
                    let addrs: Vec<SocketAddr> = addrs.collect();
                    let ips: Vec<String> = addrs.iter().map(|a| a.ip().to_string()).collect();
                    push(Check::ok(
                        CheckKind::Dns,
                        format!("{name} resolves to {}", ips.join(", ")),
                    ));
                    addrs
                }
                Ok(Err(err)) => {
                    push(Check::fail(
                        CheckKind::Dns,
                        format!("cannot resolve {name}: {err}"),
                        "check the name, and the DNS this machine uses (/etc/resolv.conf); the \
                         agent resolves it the same way",
                    ));
                    return false;
                }
                Err(elapsed) => {
                    push(elapsed.check(CheckKind::Dns));
                    return false;
                }
            }
        }
    };

    let tcp = match budget.within(connect(&addrs)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(err)) => {
            push(Check::fail(
                CheckKind::Tcp,
                format!("cannot connect to {}: {err}", target.authority()),
                "is the remote's etcd (or its clustermesh-apiserver) running and listening \
                 there, and is nothing in between dropping the connection?",
            ));
            return false;
        }
        Err(elapsed) => {
            push(elapsed.check(CheckKind::Tcp));
            return false;
        }
    };
    let peer = tcp
        .peer_addr()
        .map_or_else(|_| target.authority(), |a| a.to_string());
    push(Check::ok(CheckKind::Tcp, format!("connected to {peer}")));

    // The caller sets TLS up whenever an endpoint is https.
    let Some(tls) = tls.filter(|_| target.https) else {
        push(version(tcp, &target, budget).await);
        return true;
    };
    let handshake = match budget.within(tls.handshake(tcp, &target.host)).await {
        Ok(handshake) => handshake,
        Err(elapsed) => {
            push(elapsed.check(CheckKind::Tls));
            return true;
        }
    };
    push(tls_check(&handshake));
    if let Some(chain) = &handshake.server_chain {
        push(server_cert_check(chain, &target.host, now));
    }
    if let (Ok(stream), false) = (handshake.stream, handshake.declined) {
        push(version(stream, &target, budget).await);
    }
    true
}

async fn connect(addrs: &[SocketAddr]) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(stream) => return Ok(stream),
            Err(err) => last = err,
        }
    }
    Err(last)
}

fn tls_check(handshake: &tls::Handshake) -> Check {
    let accepted = acceptable_cas(handshake.requested.as_deref().unwrap_or_default());
    if handshake.declined {
        return declined(&accepted);
    }
    match &handshake.stream {
        Err(err) => Check::fail(
            CheckKind::Tls,
            format!("handshake failed: {err}"),
            tls::handshake_hint(err),
        ),
        Ok(stream) if accepted.is_empty() => Check::ok(CheckKind::Tls, tls::negotiated(stream)),
        Ok(stream) => {
            Check::ok(CheckKind::Tls, tls::negotiated(stream)).with_details(vec![format!(
                "client certificates accepted from {}",
                accepted.join("; ")
            )])
        }
    }
}

fn declined(accepted: &[String]) -> Check {
    Check::fail(
        CheckKind::Tls,
        "the client certificate (cert-file) is issued by none of the CAs the server accepts",
        "cert-file must be issued by a CA the remote's etcd trusts (its --trusted-ca-file)",
    )
    .with_details(vec![format!("acceptable CAs: {}", accepted.join("; "))])
}

/// The CA names a server sent, readable (`CN=meshwork-lab-ca`).
fn acceptable_cas(names: &[Vec<u8>]) -> Vec<String> {
    use x509_parser::prelude::FromDer as _;
    names
        .iter()
        .map(|der| match x509_parser::x509::X509Name::from_der(der) {
            Ok((_, name)) => name.to_string(),
            Err(_) => format!("(undecodable name, {} bytes)", der.len()),
        })
        .collect()
}

/// A raw `GET /version`: etcd's version, and with TLS 1.3 the first place a refused client
/// certificate shows (the server's alert comes after the handshake).
async fn version<S>(mut stream: S, target: &Target, budget: &Budget) -> Check
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let request = format!(
        "GET /version HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        target.authority()
    );
    let exchange = async {
        stream.write_all(request.as_bytes()).await?;
        read_answer(&mut stream).await
    };
    let answer = match budget
        .within(tokio::time::timeout(VERSION_TIMEOUT, exchange))
        .await
    {
        Ok(Ok(answer)) => answer,
        Ok(Err(_)) => {
            return Check::fail(
                CheckKind::Version,
                format!("no answer within {}s", VERSION_TIMEOUT.as_secs()),
                "the server accepted the connection but does not answer: is it etcd?",
            );
        }
        Err(elapsed) => return elapsed.check(CheckKind::Version),
    };
    match answer {
        Err(err) => match tls::rustls_error(&err) {
            Some(rustls::Error::AlertReceived(alert)) => Check::fail(
                CheckKind::Version,
                format!("TLS client authentication failed: the server sent {alert:?}"),
                "the remote's etcd refused the client certificate: it is missing, expired, or \
                 issued by a CA it does not trust (see `client certificate`)",
            ),
            _ => Check::fail(
                CheckKind::Version,
                format!("GET /version failed: {err}"),
                "the server accepted the connection but broke it off: is it etcd?",
            ),
        },
        Ok(body) => match etcd_version(&body) {
            Some(version) => Check::ok(CheckKind::Version, format!("etcd {version}")),
            None => Check::warn(
                CheckKind::Version,
                format!(
                    "no etcd version in the answer: {:?}",
                    body.lines().next().unwrap_or_default()
                ),
                "is this endpoint an etcd client URL?",
            ),
        },
    }
}

/// Reads the answer until the server closes, or its Content-Length is in.
async fn read_answer<S: AsyncRead + Unpin>(stream: &mut S) -> io::Result<String> {
    let mut buf = Vec::new();
    let mut chunk = [0; 4096];
    loop {
        let n = match stream.read(&mut chunk).await {
            // A server that closes without TLS close_notify has still answered.
            Err(err) if err.kind() == io::ErrorKind::UnexpectedEof && !buf.is_empty() => 0,
            other => other?,
        };
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf);
        if n == 0 || buf.len() >= VERSION_MAX_BYTES || complete(&text) {
            return Ok(text.into_owned());
        }
    }
}

fn complete(answer: &str) -> bool {
    let Some((head, body)) = answer.split_once("\r\n\r\n") else {
        return false;
    };
    head.lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())
                .flatten()
        })
        .is_some_and(|length| body.len() >= length)
}

/// `etcdserver` of `{"etcdserver":"3.4.23","etcdcluster":"3.4.0"}` after the headers.
fn etcd_version(answer: &str) -> Option<String> {
    let (head, body) = answer.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return None;
    }
    let json: serde_json::Value = serde_json::from_str(body.trim()).ok()?;
    json.get("etcdserver")?.as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANSWER: &str = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                          Content-Length: 45\r\n\r\n{\"etcdserver\":\"3.4.23\",\"etcdcluster\":\"3.4.0\"}";

    #[test]
    fn reads_etcds_version_answer() {
        assert!(complete(ANSWER));
        assert!(!complete(&ANSWER[..ANSWER.len() - 1]));
        assert_eq!(etcd_version(ANSWER).as_deref(), Some("3.4.23"));
        assert_eq!(etcd_version("HTTP/1.1 404 Not Found\r\n\r\n{}"), None);
        assert_eq!(etcd_version("SSH-2.0-OpenSSH"), None);
    }

    #[tokio::test]
    async fn reads_until_the_length_is_in() {
        let (mut client, mut server) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            // Two writes, and the connection stays open: the length ends the read.
            server.write_all(&ANSWER.as_bytes()[..30]).await.unwrap();
            server.write_all(&ANSWER.as_bytes()[30..]).await.unwrap();
            server
        });
        assert_eq!(read_answer(&mut client).await.unwrap(), ANSWER);
        drop(writer.await.unwrap());
    }
}
