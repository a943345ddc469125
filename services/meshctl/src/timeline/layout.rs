//! The picture's geometry, in pixels, from the timeline alone (so it is checked without
//! drawing): one row per remote cluster × store (clusters by name, stores in status order)
//! with a bar from the start to the instant that store synced, a lane of markers for the
//! agent's own steps (endpoint regenerations, WireGuard GC, prune passes), and vertical
//! lines where a wait's breaker (or its own timeout) fired and where the agent became ready.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use meshwork_proto::agent::v1 as pb;

use super::model::{self, RESOURCES, Timeline, What};

/// The picture's width.
pub const WIDTH: i32 = 1100;
/// Where the rows' labels end and time 0 is.
pub const LEFT: i32 = 210;
/// Where the time axis ends.
pub const RIGHT: i32 = WIDTH - 40;
/// One row's height.
pub const ROW_HEIGHT: i32 = 26;
/// A bar's height.
pub const BAR_HEIGHT: i32 = 14;
/// The title and subtitle.
const HEADER: i32 = 60;
/// One line label above the rows.
const LINE_LABEL: i32 = 16;
/// The markers' lane: the marker, then up to [`LABEL_LEVELS`] rows of labels.
const LANE: i32 = 22 + LABEL_LEVELS * 12;
/// Marker labels closer than this go one level down.
const LABEL_GAP: i32 = 70;
const LABEL_LEVELS: i32 = 3;
const AXIS: i32 = 34;
const LEGEND: i32 = 30;

/// Where everything goes.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// The picture's size.
    pub width: i32,
    /// The picture's height.
    pub height: i32,
    /// The caption.
    pub title: String,
    /// Under the caption: the start and what the bars mean.
    pub subtitle: String,
    /// The time at [`RIGHT`].
    pub span: Duration,
    /// The first row's top.
    pub rows_top: i32,
    /// One per cluster × store, top to bottom.
    pub rows: Vec<Row>,
    /// The markers' lane (top, bottom).
    pub lane: (i32, i32),
    /// The agent's own steps.
    pub markers: Vec<Marker>,
    /// Breakers, timeouts and readiness, across the rows.
    pub lines: Vec<Line>,
    /// The time axis.
    pub axis_y: i32,
    /// Its ticks.
    pub ticks: Vec<Tick>,
    /// The legend's baseline.
    pub legend_y: i32,
}

/// One remote cluster × store.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// `cluster · store`.
    pub label: String,
    /// The store.
    pub resource: pb::TimelineResource,
    /// The row's middle.
    pub y: i32,
    /// Where the cluster first connected.
    pub connected_x: Option<i32>,
    /// Where the bar ends (the store synced) and its label; `None`: not synced.
    pub synced: Option<(i32, String)>,
}

/// What a marker marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerKind {
    /// An endpoint regenerated.
    Regenerated,
    /// An endpoint failed to regenerate.
    RegenerationFailed,
    /// WireGuard's garbage collection.
    WireguardGc,
    /// A prune pass of restored map entries.
    Pruned,
}

/// A marker in the lane.
#[derive(Debug, Clone, PartialEq)]
pub struct Marker {
    /// What it marks.
    pub kind: MarkerKind,
    /// When.
    pub x: i32,
    /// Its label.
    pub label: String,
    /// The label's baseline (staggered so close labels do not overlap).
    pub label_y: i32,
}

/// What a vertical line marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineKind {
    /// A wait's circuit breaker, or its own timeout, fired.
    Breaker,
    /// The start-up wait returned: the agent's health turned SERVING.
    Ready,
}

/// A vertical line across the rows, labelled above them.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// What it marks.
    pub kind: LineKind,
    /// When.
    pub x: i32,
    /// Its label (the waits that ended there).
    pub label: String,
    /// The label's baseline.
    pub label_y: i32,
}

/// A tick of the time axis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tick {
    /// Where.
    pub x: i32,
    /// `250ms`, `1.5s`, `2m`.
    pub label: String,
}

/// Lays `timeline` out under `title`.
pub fn layout(timeline: &Timeline, title: &str) -> Layout {
    let end = timeline
        .steps
        .iter()
        .map(|s| s.offset)
        .max()
        .unwrap_or_default();
    let (span, step) = scale(end);
    let x = |offset: Duration| -> i32 {
        let fraction = offset.as_secs_f64() / span.as_secs_f64();
        LEFT + (f64::from(RIGHT - LEFT) * fraction.min(1.0)).round() as i32
    };
    let lines = lines(timeline, &x);
    let rows_top = HEADER + LINE_LABEL * i32::try_from(lines.len()).unwrap_or(0) + 10;
    let lines = lines
        .into_iter()
        .enumerate()
        .map(|(i, (kind, x, label))| Line {
            kind,
            x,
            label,
            label_y: HEADER + LINE_LABEL * i32::try_from(i).unwrap_or(0) + 4,
        })
        .collect();
    let rows = rows(timeline, rows_top, &x);
    let rows_bottom = rows_top + ROW_HEIGHT * i32::try_from(rows.len()).unwrap_or(0);
    let lane = (rows_bottom + 6, rows_bottom + 6 + LANE);
    let axis_y = lane.1 + 4;
    let ticks = (0u32..)
        .map(|i| step * i)
        .take_while(|t| *t <= span)
        .map(|t| Tick {
            x: x(t),
            label: duration_label(t),
        })
        .collect();
    Layout {
        width: WIDTH,
        height: axis_y + AXIS + LEGEND,
        title: title.to_owned(),
        subtitle: format!(
            "agent started {} · {} steps{} · bars: start → first list synced",
            timeline.started_at,
            timeline.steps.len(),
            if timeline.dropped > 0 {
                format!(" (+{} left out)", timeline.dropped)
            } else {
                String::new()
            }
        ),
        span,
        rows_top,
        rows,
        lane,
        markers: markers(timeline, lane.0, &x),
        lines,
        axis_y,
        ticks,
        legend_y: axis_y + AXIS + LEGEND / 2,
    }
}

/// One row per cluster (by name) × store (in status order).
fn rows(timeline: &Timeline, top: i32, x: &impl Fn(Duration) -> i32) -> Vec<Row> {
    let mut clusters = BTreeSet::new();
    let mut connected = BTreeMap::new();
    let mut synced = BTreeMap::new();
    for step in &timeline.steps {
        match &step.what {
            What::Connected { cluster } => {
                clusters.insert(cluster.clone());
                connected.entry(cluster.clone()).or_insert(step.offset);
            }
            What::ListDone { cluster, resource } => {
                clusters.insert(cluster.clone());
                synced
                    .entry((cluster.clone(), *resource))
                    .or_insert(step.offset);
            }
            // A cluster that never connected is still one the breaker gave up on.
            What::WaitReturned { pending, .. } => clusters.extend(pending.iter().cloned()),
            _ => {}
        }
    }
    let mut rows = Vec::new();
    for cluster in &clusters {
        for resource in RESOURCES {
            let y = top + ROW_HEIGHT * i32::try_from(rows.len()).unwrap_or(0) + ROW_HEIGHT / 2;
            rows.push(Row {
                label: format!("{cluster} · {}", model::resource_name(resource)),
                resource,
                y,
                connected_x: connected.get(cluster).map(|at| x(*at)),
                synced: synced
                    .get(&(cluster.clone(), resource))
                    .map(|at| (x(*at), duration_label(*at))),
            });
        }
    }
    rows
}

/// The agent's own steps, labels staggered where they crowd.
fn markers(timeline: &Timeline, lane_top: i32, x: &impl Fn(Duration) -> i32) -> Vec<Marker> {
    let mut markers: Vec<Marker> = Vec::new();
    // The x of the last label on each level.
    let mut last = [i32::MIN / 2; LABEL_LEVELS as usize];
    for step in &timeline.steps {
        let (kind, label) = match &step.what {
            What::Regenerated { endpoint, error } => (
                if error.is_some() {
                    MarkerKind::RegenerationFailed
                } else {
                    MarkerKind::Regenerated
                },
                format!("endpoint {endpoint}"),
            ),
            What::WireguardGc { kind, .. } => (
                MarkerKind::WireguardGc,
                match kind {
                    pb::TimelineSyncKind::IpIdentities => "WG allowed IPs".to_owned(),
                    _ => "WG peers GC".to_owned(),
                },
            ),
            What::Pruned { kind, .. } => (
                MarkerKind::Pruned,
                match kind {
                    pb::TimelineSyncKind::Nodes => "prune tunnel".to_owned(),
                    _ => "prune services".to_owned(),
                },
            ),
            _ => continue,
        };
        let at = x(step.offset);
        let level = (0..LABEL_LEVELS as usize)
            .find(|&l| at - last[l] >= LABEL_GAP)
            .unwrap_or(LABEL_LEVELS as usize - 1);
        last[level] = at;
        markers.push(Marker {
            kind,
            x: at,
            label,
            label_y: lane_top + 26 + 12 * i32::try_from(level).unwrap_or(0),
        });
    }
    markers
}

/// Where breakers (or timeouts) fired, and where the agent became ready; waits that ended
/// on the same pixel share a line.
fn lines(timeline: &Timeline, x: &impl Fn(Duration) -> i32) -> Vec<(LineKind, i32, String)> {
    let mut lines: Vec<(LineKind, i32, String)> = Vec::new();
    // Health turns SERVING when the last readiness wait returns, synced or by the breaker;
    // a readiness wait that failed leaves it NOT_SERVING.
    let (mut ready, mut never_ready) = (None, false);
    for step in &timeline.steps {
        let What::WaitReturned {
            waiter, kind, end, ..
        } = &step.what
        else {
            continue;
        };
        let at = x(step.offset);
        if *waiter == pb::Waiter::Readiness {
            match end {
                pb::WaitEnd::Synced | pb::WaitEnd::Breaker => ready = Some(at),
                _ => never_ready = true,
            }
        }
        let how = match end {
            pb::WaitEnd::Breaker => "breaker",
            pb::WaitEnd::Timeout => "timeout",
            _ => continue,
        };
        let what = format!(
            "{how}: {} ({})",
            model::sync_kind_name(*kind),
            model::waiter_name(*waiter)
        );
        match lines.iter_mut().find(|(_, x, _)| *x == at) {
            Some((_, _, label)) => {
                label.push_str(", ");
                label.push_str(&what);
            }
            None => lines.push((LineKind::Breaker, at, what)),
        }
    }
    if let Some(at) = ready.filter(|_| !never_ready) {
        lines.push((LineKind::Ready, at, "ready (SERVING)".to_owned()));
    }
    lines
}

/// The time at the axis' end and the tick step: the smallest 1-2-5 step (in whole
/// milliseconds) giving at most 8 ticks past the last step, with 5% room to spare.
fn scale(end: Duration) -> (Duration, Duration) {
    let end_ms = u64::try_from(end.as_millis()).unwrap_or(u64::MAX / 2);
    let end_ms = (end_ms + end_ms / 20).max(100);
    let step_ms = [1, 2, 5]
        .into_iter()
        .flat_map(|m| (0..8).map(move |e| m * 10u64.pow(e)))
        .filter(|s| end_ms.div_ceil(*s) <= 8)
        .min()
        .unwrap_or(end_ms);
    let span_ms = end_ms.div_ceil(step_ms) * step_ms;
    (
        Duration::from_millis(span_ms),
        Duration::from_millis(step_ms),
    )
}

/// `0s`, `250ms`, `1.5s`, `2m`, `90s`.
pub fn duration_label(at: Duration) -> String {
    // Rounded as the table rounds its offsets.
    let ms = (at.as_micros() + 500) / 1000;
    let at = Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX));
    if ms == 0 {
        "0s".to_owned()
    } else if ms < 1000 {
        format!("{ms}ms")
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        let text = format!("{:.2}", at.as_secs_f64());
        format!("{}s", text.trim_end_matches('0').trim_end_matches('.'))
    }
}

#[cfg(test)]
#[path = "layout_tests.rs"]
mod tests;
