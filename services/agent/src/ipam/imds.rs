//! This node's EC2 instance ID from the instance metadata service (IMDSv2), for `--ipam eni`
//! without `--eni-instance-id`, as Cilium's agent learns it: a session token
//! (`PUT /latest/api/token`), then `GET /latest/meta-data/instance-id` with it. A DaemonSet
//! cannot hand each node its own instance ID in a flag (the downward API does not expose the
//! node's provider ID), so a node asks its own metadata service.
//!
//! Plain HTTP/1.1 over one TCP connection per request (`Connection: close`), as the service
//! speaks it; a response must carry `Content-Length`.

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// The metadata service every EC2 instance reaches.
pub const DEFAULT_ENDPOINT: &str = "http://169.254.169.254";

/// The session token's lifetime asked for (AWS's SDKs ask for six hours).
const TOKEN_TTL_SECONDS: &str = "21600";

/// The largest response read (an instance ID is 19 bytes).
const MAX_RESPONSE: u64 = 64 * 1024;

/// Why the instance ID could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ImdsError {
    /// The endpoint is not `http://HOST[:PORT]`.
    #[error("--eni-metadata-endpoint {0:?} is not http://HOST[:PORT]")]
    Endpoint(String),
    /// Connecting, writing or reading failed, or took too long.
    #[error("{url}: {error}")]
    Io {
        /// The request's URL.
        url: String,
        /// What failed.
        error: String,
    },
    /// The service answered with another status than 200.
    #[error("{url}: HTTP {status}")]
    Status {
        /// The request's URL.
        url: String,
        /// The status code.
        status: u16,
    },
    /// The answer is not HTTP, or not an instance ID.
    #[error("{url}: {why}")]
    Malformed {
        /// The request's URL.
        url: String,
        /// What is wrong.
        why: String,
    },
}

/// `http://HOST[:PORT]` → `HOST:PORT` (port 80 by default).
pub fn authority(endpoint: &str) -> Result<String, ImdsError> {
    let rest = endpoint
        .strip_prefix("http://")
        .map(|rest| rest.trim_end_matches('/'))
        .filter(|rest| !rest.is_empty() && !rest.contains('/'))
        .ok_or_else(|| ImdsError::Endpoint(endpoint.to_owned()))?;
    let has_port = match rest.rsplit_once(':') {
        Some((_, port)) => !rest.ends_with(']') && port.parse::<u16>().is_ok(),
        None => false,
    };
    Ok(if has_port {
        rest.to_owned()
    } else {
        format!("{rest}:80")
    })
}

/// Asks the metadata service at `endpoint` for this instance's ID, each request bounded by
/// `timeout`.
pub async fn instance_id(endpoint: &str, timeout: Duration) -> Result<String, ImdsError> {
    let authority = authority(endpoint)?;
    let token = request(
        &authority,
        "PUT",
        "/latest/api/token",
        ("X-aws-ec2-metadata-token-ttl-seconds", TOKEN_TTL_SECONDS),
        timeout,
    )
    .await?;
    let path = "/latest/meta-data/instance-id";
    let id = request(
        &authority,
        "GET",
        path,
        ("X-aws-ec2-metadata-token", token.trim()),
        timeout,
    )
    .await?;
    let id = id.trim();
    let valid =
        id.starts_with("i-") && id.len() > 2 && id[2..].bytes().all(|b| b.is_ascii_alphanumeric());
    if !valid {
        return Err(ImdsError::Malformed {
            url: format!("http://{authority}{path}"),
            why: format!("{id:?} is not an instance ID"),
        });
    }
    Ok(id.to_owned())
}

/// One request with one header and an empty body; the body of a 200 answer.
async fn request(
    authority: &str,
    method: &str,
    path: &str,
    (name, value): (&str, &str),
    timeout: Duration,
) -> Result<String, ImdsError> {
    let url = format!("http://{authority}{path}");
    let io = |error: std::io::Error| ImdsError::Io {
        url: url.clone(),
        error: error.to_string(),
    };
    let exchange = async {
        let mut stream = TcpStream::connect(authority).await.map_err(io)?;
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {authority}\r\n{name}: {value}\r\n\
             Content-Length: 0\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).await.map_err(io)?;
        let mut answer = Vec::new();
        stream
            .take(MAX_RESPONSE)
            .read_to_end(&mut answer)
            .await
            .map_err(io)?;
        Ok::<_, ImdsError>(answer)
    };
    let answer = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| ImdsError::Io {
            url: url.clone(),
            error: format!("no answer within {timeout:?}"),
        })??;
    body(&url, &answer)
}

/// The body of an HTTP/1.1 answer, if its status is 200.
fn body(url: &str, answer: &[u8]) -> Result<String, ImdsError> {
    let malformed = |why: &str| ImdsError::Malformed {
        url: url.to_owned(),
        why: why.to_owned(),
    };
    let text = std::str::from_utf8(answer).map_err(|_| malformed("not UTF-8"))?;
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| malformed("no end of headers"))?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.strip_prefix("HTTP/1."))
        .and_then(|line| line.get(2..5))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| malformed("not an HTTP/1.x status line"))?;
    if status != 200 {
        return Err(ImdsError::Status {
            url: url.to_owned(),
            status,
        });
    }
    let length = lines
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, value)| value.trim().parse::<usize>().ok())
        .ok_or_else(|| malformed("no Content-Length"))?;
    rest.get(..length)
        .map(str::to_owned)
        .ok_or_else(|| malformed("the body is shorter than its Content-Length"))
}

/// A metadata service for tests.
#[cfg(test)]
pub(crate) mod fake {
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
    use tokio::net::TcpListener;

    /// A metadata service on 127.0.0.1 answering each request with the next of `answers`;
    /// returns its endpoint and the request heads it got.
    pub(crate) async fn fake(
        answers: Vec<&'static str>,
    ) -> (String, tokio::task::JoinHandle<Vec<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
        let server = tokio::spawn(async move {
            let mut heads = Vec::new();
            for answer in answers {
                let (stream, _) = listener.accept().await.expect("accept");
                let (read, mut write) = stream.into_split();
                let mut lines = BufReader::new(read).lines();
                let mut head = Vec::new();
                while let Some(line) = lines.next_line().await.expect("read") {
                    if line.is_empty() {
                        break;
                    }
                    head.push(line);
                }
                heads.push(head);
                write.write_all(answer.as_bytes()).await.expect("write");
            }
            heads
        });
        (endpoint, server)
    }
}

#[cfg(test)]
mod tests {
    use tokio::net::TcpListener;

    use super::fake::fake;
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[tokio::test]
    async fn a_token_then_the_instance_id_with_it() {
        let (endpoint, server) = fake(vec![
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\ntok-1",
            "HTTP/1.1 200 OK\r\ncontent-length: 19\r\n\r\ni-0123456789abcdef0",
        ])
        .await;
        let id = instance_id(&endpoint, SECOND).await.expect("an ID");
        assert_eq!(id, "i-0123456789abcdef0");
        let heads = server.await.expect("server");
        assert_eq!(heads[0][0], "PUT /latest/api/token HTTP/1.1");
        assert!(heads[0].contains(&"X-aws-ec2-metadata-token-ttl-seconds: 21600".to_owned()));
        assert_eq!(heads[1][0], "GET /latest/meta-data/instance-id HTTP/1.1");
        assert!(
            heads[1].contains(&"X-aws-ec2-metadata-token: tok-1".to_owned()),
            "{heads:?}"
        );
    }

    #[tokio::test]
    async fn a_refusal_or_a_non_id_fails_naming_the_url() {
        let (endpoint, _server) = fake(vec![
            "HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n",
        ])
        .await;
        let err = instance_id(&endpoint, SECOND).await.expect_err("401");
        assert!(
            err.to_string().ends_with("/latest/api/token: HTTP 401"),
            "{err}"
        );

        let (endpoint, _server) = fake(vec![
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nt",
            "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n<html>hi!",
        ])
        .await;
        let err = instance_id(&endpoint, SECOND).await.expect_err("not an ID");
        assert!(err.to_string().contains("is not an instance ID"), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_service_times_out() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
        // Accepted by the kernel's backlog, never answered.
        let err = instance_id(&endpoint, SECOND).await.expect_err("silent");
        assert!(err.to_string().contains("no answer within 1s"), "{err}");
        drop(listener);
    }

    #[test]
    fn endpoints_are_http_host_and_port() {
        assert_eq!(
            authority("http://169.254.169.254").expect("ok"),
            "169.254.169.254:80"
        );
        assert_eq!(
            authority("http://127.0.0.1:8080/").expect("ok"),
            "127.0.0.1:8080"
        );
        assert_eq!(
            authority("http://[fd00:ec2::254]").expect("ok"),
            "[fd00:ec2::254]:80"
        );
        for bad in [
            "https://169.254.169.254",
            "169.254.169.254",
            "http://",
            "http://h/x",
        ] {
            assert!(authority(bad).is_err(), "{bad}");
        }
    }
}
