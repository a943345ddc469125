//! Scraping a server's `/metrics` on 127.0.0.1 and checking the text with `promtool`, as a
//! Prometheus server would read it.

use std::io::{Read as _, Write as _};
use std::process::{Command, Stdio};
use std::time::Duration;

/// `GET /metrics` on 127.0.0.1:`port` (the classic text format), the body; `None` while
/// nothing answers.
pub fn scrape(port: u16) -> Option<String> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    // A hung server fails the caller's wait instead of blocking the test forever.
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (_, body) = response.split_once("\r\n\r\n")?;
    Some(body.to_owned())
}

/// What `promtool check metrics` says of `metrics`: `Ok` when it says nothing at all (no
/// lint warning either), else its output.
pub fn promtool_check(metrics: &str) -> Result<(), String> {
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("running promtool (`cargo xtask setup` installs it): {e}"))?;
    if let Some(mut stdin) = promtool.stdin.take() {
        stdin
            .write_all(metrics.as_bytes())
            .map_err(|e| format!("writing to promtool: {e}"))?;
    }
    let checked = promtool
        .wait_with_output()
        .map_err(|e| format!("waiting for promtool: {e}"))?;
    if checked.status.success() && checked.stdout.is_empty() && checked.stderr.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    ))
}

/// Panics unless `promtool check metrics` accepts `metrics` without a word.
pub fn assert_promtool_clean(metrics: &str) {
    if let Err(complaint) = promtool_check(metrics) {
        panic!("promtool check metrics complained:\n{complaint}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[ignore = "needs promtool: `cargo xtask test` runs it"]
    fn promtool_accepts_clean_text_and_names_what_it_lints() {
        let clean = "# HELP requests_total Requests served.\n# TYPE requests_total counter\nrequests_total 3\n";
        assert_eq!(promtool_check(clean), Ok(()));
        // A counter's name must end in _total: the lint a check has to surface.
        let unclean = "# HELP requests Requests served.\n# TYPE requests counter\nrequests 3\n";
        let complaint = promtool_check(unclean).unwrap_err();
        assert!(complaint.contains("_total"), "{complaint}");
    }
}
