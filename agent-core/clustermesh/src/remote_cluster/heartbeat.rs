//! A remote's heartbeat (contract §8). Its apiserver writes `cilium/.heartbeat` every
//! minute; a reader that has seen no write for more than twice that counts a quorum error
//! at each check, and more than `--kvstore-max-consecutive-quorum-errors` in a row end the
//! connection, which the loop re-establishes (a failure; the stores are kept, nothing is
//! drained). An etcd that answers but whose writer is stuck or partitioned looks healthy to
//! every other check.
//!
//! [`HeartbeatMonitor`] is the decision alone, driven by the caller's clock; [`follow`]
//! feeds it from the watch and a ticker.

use std::time::{Duration, SystemTime};

use meshwork_kvstore::metrics::QuorumErrorLabels;
use meshwork_kvstore::{EtcdBackend, KvstoreError, KvstoreMetrics, WatchEvent};
use meshwork_types::keys::HEARTBEAT_KEY;
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};

use super::runner::{ConnectionState, RemoteClusterError};

/// Cilium's status checker period on small clusters.
const CHECK_PERIOD: Duration = Duration::from_secs(5);

/// How heartbeats are judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeartbeatSettings {
    /// How often the remote writes its heartbeat (Cilium: 1 minute, fixed).
    pub interval: Duration,
    /// Quorum errors in a row that are tolerated; one more reconnects
    /// (`--kvstore-max-consecutive-quorum-errors`, Cilium's default 2).
    pub max_consecutive_quorum_errors: u32,
}

impl Default for HeartbeatSettings {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(60),
            max_consecutive_quorum_errors: 2,
        }
    }
}

impl HeartbeatSettings {
    /// A heartbeat older than this is a quorum error.
    pub fn stale_after(&self) -> Duration {
        self.interval * 2
    }

    /// How often staleness is checked: Cilium's 5 s, shorter when the interval is short
    /// (tests), so that a check falls between two heartbeats.
    pub fn check_every(&self) -> Duration {
        CHECK_PERIOD
            .min(self.interval / 4)
            .max(Duration::from_millis(1))
    }
}

/// The heartbeat flags of the agent and kvstoremesh.
#[derive(Debug, Clone, clap::Args)]
pub struct HeartbeatArgs {
    /// Stale heartbeat checks in a row that are tolerated before the remote connection is
    /// re-established (a check counts a quorum error when no heartbeat came for twice the
    /// interval).
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub kvstore_max_consecutive_quorum_errors: u32,

    /// How often remotes write `cilium/.heartbeat` (Cilium's apiserver: every minute).
    /// Lower it only to test the staleness detection.
    #[arg(long, default_value = "1m", value_parser = parse_interval, value_name = "DURATION")]
    pub kvstore_heartbeat_interval: Duration,
}

impl HeartbeatArgs {
    /// The settings the flags say.
    pub fn settings(&self) -> HeartbeatSettings {
        HeartbeatSettings {
            interval: self.kvstore_heartbeat_interval,
            max_consecutive_quorum_errors: self.kvstore_max_consecutive_quorum_errors,
        }
    }
}

fn parse_interval(text: &str) -> Result<Duration, String> {
    let interval = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if interval < Duration::from_millis(100) {
        return Err("must be at least 100ms".to_owned());
    }
    Ok(interval)
}

/// What one check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A heartbeat arrived recently enough.
    Fresh,
    /// None for too long: the `consecutive`-th quorum error in a row, still tolerated.
    QuorumError {
        /// Errors in a row, this one included.
        consecutive: u32,
        /// Since the last heartbeat (or the connection, when none came).
        since: Duration,
    },
    /// More errors in a row than tolerated: the connection must be re-established.
    Reconnect(String),
}

/// The heartbeat staleness of one connection: a plain state machine.
#[derive(Debug, Clone)]
pub struct HeartbeatMonitor {
    settings: HeartbeatSettings,
    last_seen: Instant,
    consecutive: u32,
}

impl HeartbeatMonitor {
    /// A connection made at `now`; as in Cilium, a remote that never writes a heartbeat
    /// counts as stale from then on.
    pub fn new(settings: HeartbeatSettings, now: Instant) -> Self {
        Self {
            settings,
            last_seen: now,
            consecutive: 0,
        }
    }

    /// A heartbeat was written (seen at `now`).
    pub fn observe(&mut self, now: Instant) {
        self.last_seen = self.last_seen.max(now);
    }

    /// The periodic check at `now`.
    pub fn check(&mut self, now: Instant) -> Verdict {
        let since = now.saturating_duration_since(self.last_seen);
        if since <= self.settings.stale_after() {
            self.consecutive = 0;
            return Verdict::Fresh;
        }
        self.consecutive += 1;
        if self.consecutive > self.settings.max_consecutive_quorum_errors {
            return Verdict::Reconnect(format!(
                "quorum check failed {} times in a row: {} since last heartbeat update has been received",
                self.consecutive,
                humantime::format_duration(round_to_millis(since)),
            ));
        }
        Verdict::QuorumError {
            consecutive: self.consecutive,
            since,
        }
    }
}

fn round_to_millis(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The time a heartbeat value names: RFC 3339 with `Z` (what Meshwork writes) or a
/// `±hh:mm` offset (what Go's `time.RFC3339` writes in a local zone); `None` when it does
/// not parse.
pub fn written_at(value: &[u8]) -> Option<SystemTime> {
    let text = std::str::from_utf8(value).ok()?.trim();
    if let Ok(time) = humantime::parse_rfc3339(text) {
        return Some(time);
    }
    let (base, offset) = text.split_at_checked(text.len().checked_sub(6)?)?;
    let (sign, hh_mm) = offset.split_at_checked(1)?;
    let (hours, minutes) = hh_mm.split_once(':')?;
    let shift =
        Duration::from_secs(hours.parse::<u64>().ok()? * 3600 + minutes.parse::<u64>().ok()? * 60);
    let utc = humantime::parse_rfc3339(&format!("{base}Z")).ok()?;
    match sign {
        "+" => utc.checked_sub(shift),
        "-" => utc.checked_add(shift),
        _ => None,
    }
}

/// When a heartbeat of `cluster` holding `value` was written: the time it names, or now
/// (the write was just seen) when it names none, which is logged.
pub(super) fn written_or_now(value: &[u8], cluster: &str) -> SystemTime {
    written_at(value).unwrap_or_else(|| {
        tracing::warn!(cluster, value = %String::from_utf8_lossy(value),
            "the remote's heartbeat is not an RFC 3339 time; taking the time it was seen");
        SystemTime::now()
    })
}

/// Where [`follow`] reports.
pub struct Reporting<'a> {
    /// The remote cluster's name, for the log.
    pub cluster: &'a str,
    /// Where each heartbeat's time is published.
    pub state: &'a watch::Sender<ConnectionState>,
    /// Where quorum errors are counted.
    pub metrics: &'a KvstoreMetrics,
}

/// Follows the heartbeat of a connection from `revision` on; returns the error that ends
/// the connection (stale heartbeats, a failed watch).
pub async fn follow(
    backend: &EtcdBackend,
    revision: i64,
    settings: HeartbeatSettings,
    report: Reporting<'_>,
) -> RemoteClusterError {
    let Reporting {
        cluster,
        state,
        metrics,
    } = report;
    let stale = QuorumErrorLabels {
        error: "no event received".to_owned(),
    };
    let mut beats = match backend.watch_key(HEARTBEAT_KEY, revision).await {
        Ok(beats) => beats,
        Err(err) => return err.into(),
    };
    let start = Instant::now();
    let mut monitor = HeartbeatMonitor::new(settings, start);
    let mut checks =
        tokio::time::interval_at(start + settings.check_every(), settings.check_every());
    checks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            batch = beats.next() => {
                let events = match batch {
                    Ok(Some(events)) => events,
                    Ok(None) => return KvstoreError::WatchClosed(HEARTBEAT_KEY.to_owned()).into(),
                    Err(err) => return err.into(),
                };
                for event in events {
                    // A delete is the lease expiring, not a write.
                    if let WatchEvent::Put { key, value, .. } = event
                        && key == HEARTBEAT_KEY.as_bytes()
                    {
                        monitor.observe(Instant::now());
                        let at = written_or_now(&value, cluster);
                        state.send_modify(|s| s.last_heartbeat = Some(at));
                    }
                }
            }
            _ = checks.tick() => match monitor.check(Instant::now()) {
                Verdict::Fresh => {}
                Verdict::QuorumError { consecutive, since } => {
                    metrics.quorum_errors.get_or_create(&stale).inc();
                    tracing::warn!(cluster, consecutive, since = %humantime::format_duration(round_to_millis(since)),
                        "no heartbeat from the remote cluster: quorum error");
                }
                Verdict::Reconnect(reason) => {
                    metrics.quorum_errors.get_or_create(&stale).inc();
                    return RemoteClusterError::Quorum(reason);
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> HeartbeatSettings {
        HeartbeatSettings::default()
    }

    #[test]
    fn heartbeats_within_twice_the_interval_are_fresh() {
        let start = Instant::now();
        let mut monitor = HeartbeatMonitor::new(settings(), start);
        assert_eq!(
            monitor.check(start + Duration::from_secs(120)),
            Verdict::Fresh
        );
        monitor.observe(start + Duration::from_secs(100));
        assert_eq!(
            monitor.check(start + Duration::from_secs(220)),
            Verdict::Fresh
        );
    }

    #[test]
    fn three_stale_checks_in_a_row_reconnect_and_a_heartbeat_resets_the_count() {
        let start = Instant::now();
        let mut monitor = HeartbeatMonitor::new(settings(), start);
        let at = |s| start + Duration::from_secs(s);
        assert!(matches!(
            monitor.check(at(121)),
            Verdict::QuorumError { consecutive: 1, .. }
        ));
        assert!(matches!(
            monitor.check(at(126)),
            Verdict::QuorumError { consecutive: 2, .. }
        ));
        // A heartbeat between the errors: the count starts over.
        monitor.observe(at(127));
        assert_eq!(monitor.check(at(131)), Verdict::Fresh);
        assert!(matches!(
            monitor.check(at(248)),
            Verdict::QuorumError { consecutive: 1, .. }
        ));
        assert!(matches!(
            monitor.check(at(253)),
            Verdict::QuorumError { consecutive: 2, .. }
        ));
        let Verdict::Reconnect(reason) = monitor.check(at(258)) else {
            panic!("a third stale check in a row must reconnect");
        };
        assert_eq!(
            reason,
            "quorum check failed 3 times in a row: 2m 11s since last heartbeat update has been received"
        );
    }

    #[test]
    fn a_higher_tolerance_waits_for_more_errors() {
        let settings = HeartbeatSettings {
            max_consecutive_quorum_errors: 4,
            ..settings()
        };
        let start = Instant::now();
        let mut monitor = HeartbeatMonitor::new(settings, start);
        for n in 1..=4 {
            let verdict = monitor.check(start + Duration::from_secs(120 + n));
            assert!(
                matches!(verdict, Verdict::QuorumError { .. }),
                "{n}: {verdict:?}"
            );
        }
        assert!(matches!(
            monitor.check(start + Duration::from_secs(130)),
            Verdict::Reconnect(_)
        ));
    }

    #[test]
    fn checks_run_every_five_seconds_or_a_quarter_of_a_short_interval() {
        assert_eq!(settings().check_every(), Duration::from_secs(5));
        let short = HeartbeatSettings {
            interval: Duration::from_secs(2),
            ..settings()
        };
        assert_eq!(short.check_every(), Duration::from_millis(500));
        assert_eq!(short.stale_after(), Duration::from_secs(4));
    }

    #[test]
    fn the_written_time_is_read_as_rfc_3339() {
        let at = written_at(b"2026-12-02T01:20:57Z").unwrap();
        assert_eq!(
            humantime::format_rfc3339_seconds(at).to_string(),
            "2026-12-02T01:20:57Z"
        );
        let zoned = written_at(b"2026-12-02T02:20:57+01:00").unwrap();
        assert_eq!(zoned, at);
        assert_eq!(written_at(b"2026-12-02T00:20:57-01:00"), Some(at));
        assert_eq!(written_at(b"not a time"), None);
        assert_eq!(written_at("2026-12-02T01:20€:00".as_bytes()), None);
        assert_eq!(written_at(&[0xff, 0xfe]), None);
    }
}
