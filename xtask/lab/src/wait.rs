//! Waiting on conditions with deadlines (never a bare sleep as synchronisation): one helper,
//! blocking and async, whose failure names what it waited for and what it saw last.
//!
//! ```no_run
//! # use std::time::Duration;
//! # use meshwork_lab::wait::{Wait, eventually};
//! # fn entries() -> usize { 3 }
//! // Blocking; the error (or the panic of `eventually`) says "… last seen: 2".
//! let n = Wait::new("three entries").timeout(Duration::from_secs(5)).until(entries, |n| *n == 3);
//! let n = eventually("three entries", entries, |n| *n == 3);
//! ```

use std::fmt::Debug;
use std::time::{Duration, Instant};

use crate::{LabError, Result};

/// How long a wait takes at most unless told otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a wait looks unless told otherwise.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(20);

/// A condition to wait for: what it is (for the error), how long at most, how often to look.
#[derive(Debug, Clone)]
pub struct Wait {
    what: String,
    timeout: Duration,
    interval: Duration,
}

impl Wait {
    /// A wait for `what`, [`DEFAULT_TIMEOUT`] at most, looking every [`DEFAULT_INTERVAL`].
    pub fn new(what: impl Into<String>) -> Self {
        Self {
            what: what.into(),
            timeout: DEFAULT_TIMEOUT,
            interval: DEFAULT_INTERVAL,
        }
    }

    /// At most `timeout`.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Looks every `interval`.
    pub fn every(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    fn poll<V>(
        &self,
        mut observe: impl FnMut() -> V,
        done: impl Fn(&V) -> bool,
        show: impl Fn(&V) -> String,
    ) -> Result<V> {
        let started = Instant::now();
        loop {
            let seen = observe();
            if done(&seen) {
                return Ok(seen);
            }
            if started.elapsed() >= self.timeout {
                return Err(self.timed_out(started, show(&seen)));
            }
            std::thread::sleep(self.interval);
        }
    }

    async fn poll_async<V, F: Future<Output = V>>(
        &self,
        mut observe: impl FnMut() -> F,
        done: impl Fn(&V) -> bool,
        show: impl Fn(&V) -> String,
    ) -> Result<V> {
        let started = Instant::now();
        loop {
            let seen = observe().await;
            if done(&seen) {
                return Ok(seen);
            }
            if started.elapsed() >= self.timeout {
                return Err(self.timed_out(started, show(&seen)));
            }
            tokio::time::sleep(self.interval).await;
        }
    }

    fn timed_out(&self, started: Instant, last: String) -> LabError {
        LabError::Timeout {
            what: self.what.clone(),
            waited: started.elapsed(),
            last,
        }
    }

    /// Observes until `done` holds for what was observed, and answers that; blocking.
    pub fn until<T: Debug>(
        &self,
        observe: impl FnMut() -> T,
        done: impl Fn(&T) -> bool,
    ) -> Result<T> {
        self.poll(observe, done, |seen| format!("{seen:?}"))
    }

    /// [`Self::until`] for an async observation.
    pub async fn until_async<T: Debug, F: Future<Output = T>>(
        &self,
        observe: impl FnMut() -> F,
        done: impl Fn(&T) -> bool,
    ) -> Result<T> {
        self.poll_async(observe, done, |seen| format!("{seen:?}"))
            .await
    }

    /// Checks until `check` answers `Some`, and answers what it holds; blocking.
    pub fn some<T>(&self, check: impl FnMut() -> Option<T>) -> Result<T> {
        self.poll(check, Option::is_some, |_| NOTHING_YET.to_owned())
            .map(found)
    }

    /// [`Self::some`] for an async check.
    pub async fn some_async<T, F: Future<Output = Option<T>>>(
        &self,
        check: impl FnMut() -> F,
    ) -> Result<T> {
        self.poll_async(check, Option::is_some, |_| NOTHING_YET.to_owned())
            .await
            .map(found)
    }
}

/// What a check that answered `None` is shown as.
const NOTHING_YET: &str = "nothing yet";

/// The value of a check that answered (`poll` returns only once `done` held).
fn found<T>(seen: Option<T>) -> T {
    seen.unwrap_or_else(|| unreachable!("a wait answers only once its check found something"))
}

/// Polls `check` every `interval` until it returns `Some`, or fails after `timeout`.
pub fn until<T>(
    what: &str,
    timeout: Duration,
    interval: Duration,
    check: impl FnMut() -> Option<T>,
) -> Result<T> {
    Wait::new(what).timeout(timeout).every(interval).some(check)
}

/// For tests: [`Wait::until`] with the defaults, panicking (with the last value seen) when
/// it times out.
#[track_caller]
pub fn eventually<T: Debug>(
    what: &str,
    observe: impl FnMut() -> T,
    done: impl Fn(&T) -> bool,
) -> T {
    Wait::new(what)
        .until(observe, done)
        .unwrap_or_else(|err| panic!("{err}"))
}

/// For tests: [`Wait::until_async`] with the defaults, panicking (with the last value seen)
/// when it times out.
pub async fn eventually_async<T: Debug, F: Future<Output = T>>(
    what: &str,
    observe: impl FnMut() -> F,
    done: impl Fn(&T) -> bool,
) -> T {
    Wait::new(what)
        .until_async(observe, done)
        .await
        .unwrap_or_else(|err| panic!("{err}"))
}

/// Picks a TCP port on 127.0.0.1 that is free right now.
pub fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))
        .map_err(LabError::io("binding 127.0.0.1:0 to pick a free port"))?;
    let port = listener
        .local_addr()
        .map_err(LabError::io("reading the picked port"))?
        .port();
    Ok(port)
}

/// True when something accepts TCP connections on 127.0.0.1:`port`.
pub fn port_open(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    )
    .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_answers_what_it_saw_or_names_the_last_value() {
        let mut n = 0;
        let seen = Wait::new("three")
            .every(Duration::ZERO)
            .until(
                || {
                    n += 1;
                    n
                },
                |n| *n == 3,
            )
            .unwrap();
        assert_eq!(seen, 3);
        let err = Wait::new("never")
            .timeout(Duration::from_millis(30))
            .every(Duration::from_millis(5))
            .until(|| "still 2", |_| false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("waiting for never"), "{err}");
        assert!(err.ends_with("last seen: \"still 2\""), "{err}");
        let err = until("none", Duration::ZERO, Duration::ZERO, || None::<u8>).unwrap_err();
        assert!(err.to_string().ends_with("last seen: nothing yet"), "{err}");
    }

    #[tokio::test]
    async fn the_async_wait_is_the_same_wait() {
        let mut n = 0;
        let seen = Wait::new("two")
            .every(Duration::ZERO)
            .some_async(|| {
                n += 1;
                let found = (n == 2).then_some(n);
                async move { found }
            })
            .await
            .unwrap();
        assert_eq!(seen, 2);
        let err = Wait::new("never")
            .timeout(Duration::ZERO)
            .until_async(|| async { 7 }, |_| false)
            .await
            .unwrap_err();
        assert!(err.to_string().ends_with("last seen: 7"), "{err}");
    }
}
