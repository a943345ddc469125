//! `status --wait`: poll Status until every remote cluster is ready or the timeout.

use std::fmt::Write as _;
use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior, interval, timeout_at};

use super::Source;
use super::progress::Progress;
use super::view::StatusView;

/// How often the agent (or kvstoremesh) is asked.
const POLL: Duration = Duration::from_millis(250);

/// How a wait ended.
pub enum Outcome {
    /// Every remote cluster is ready (or there are none).
    Ready(StatusView),
    /// The timeout came first.
    TimedOut {
        /// The last status received, if any.
        last: Option<StatusView>,
        /// Why the last poll got no status, if it failed.
        error: Option<String>,
    },
}

/// Polls the agent until the cluster mesh is ready or `timeout` has passed, retrying while
/// the agent can't be reached (it may be starting).
pub async fn wait(source: &mut Source, timeout: Duration) -> Outcome {
    let start = Instant::now();
    let deadline = start + timeout;
    let mut progress = Progress::new(timeout);
    let mut ticks = interval(POLL);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last = None;
    let mut error = None;
    loop {
        let poll = async {
            ticks.tick().await;
            source.clustermesh().await
        };
        let Ok(reply) = timeout_at(deadline, poll).await else {
            break;
        };
        match reply {
            Ok(mesh) => {
                let view = StatusView::from(&mesh);
                progress.update(&view.clustermesh, start.elapsed());
                if view.clustermesh.all_ready() {
                    progress.finish();
                    return Outcome::Ready(view);
                }
                last = Some(view);
                error = None;
            }
            Err(err) => {
                let err = format!("{err:#}");
                progress.unreachable(&err, start.elapsed());
                error = Some(err);
            }
        }
    }
    progress.finish();
    Outcome::TimedOut { last, error }
}

/// Why `--wait` gave up: the clusters not ready and their last errors, or why no status came.
pub fn timeout_message(
    from: &str,
    timeout: Duration,
    last: Option<&StatusView>,
    error: Option<&str>,
) -> String {
    let timeout = humantime::format_duration(timeout);
    let Some(view) = last else {
        let mut msg = format!("timed out after {timeout} without a status from {from}");
        if let Some(error) = error {
            // Writing to a String cannot fail.
            let _ = write!(msg, ": {error}");
        }
        return msg;
    };
    let mesh = &view.clustermesh;
    let mut msg = format!(
        "timed out after {timeout} waiting for the cluster mesh: {}/{} remote clusters ready; not ready:",
        mesh.ready, mesh.total
    );
    for c in mesh.clusters.iter().filter(|c| !c.ready) {
        let error = c.last_error.as_deref().unwrap_or("no error reported");
        let _ = write!(msg, "\n   {}: {error}", c.name);
    }
    if let Some(error) = error {
        let _ = write!(msg, "\n(the last poll failed: {error})");
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::view::sample;

    #[test]
    fn names_the_clusters_not_ready() {
        let mut mesh = sample();
        mesh.total = 3;
        mesh.clusters
            .push(meshwork_proto::agent::v1::RemoteClusterStatus {
                name: "cluster-4".into(),
                ..Default::default()
            });
        let view = StatusView::from(&mesh);
        assert_eq!(
            timeout_message("the agent", Duration::from_secs(120), Some(&view), None),
            "timed out after 2m waiting for the cluster mesh: 1/3 remote clusters ready; not ready:\n   \
             cluster-3: clusterID 2 is already used\n   cluster-4: no error reported"
        );
    }

    #[test]
    fn says_why_no_status_came() {
        assert_eq!(
            timeout_message(
                "kvstoremesh",
                Duration::from_secs(30),
                None,
                Some("cannot reach the agent")
            ),
            "timed out after 30s without a status from kvstoremesh: cannot reach the agent"
        );
    }
}
