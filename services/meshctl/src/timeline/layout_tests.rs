use std::time::Duration;

use meshwork_proto::agent::v1 as pb;

use super::super::model::{Step, Timeline, What};
use super::super::tests::{SAMPLE_ROWS, sample};
use super::*;

fn labels(layout: &Layout) -> Vec<&str> {
    layout.rows.iter().map(|r| r.label.as_str()).collect()
}

/// Where `ms` lands on `layout`'s axis.
fn x_of(layout: &Layout, ms: u64) -> i32 {
    let fraction = ms as f64 / layout.span.as_millis() as f64;
    LEFT + (f64::from(RIGHT - LEFT) * fraction).round() as i32
}

#[test]
fn one_row_per_cluster_and_store_clusters_by_name_stores_in_status_order() {
    let layout = layout(&sample(false), "t");
    assert_eq!(labels(&layout), SAMPLE_ROWS);
    for pair in layout.rows.windows(2) {
        assert_eq!(pair[1].y - pair[0].y, ROW_HEIGHT, "rows top to bottom");
    }
    assert_eq!(layout.rows[0].y, layout.rows_top + ROW_HEIGHT / 2);
    // Bars end where each store synced: c2 listed its ipcache first and its nodes last.
    let bar_end = |i: usize| layout.rows[i].synced.as_ref().unwrap().0;
    assert_eq!(bar_end(0), x_of(&layout, 50));
    assert_eq!(bar_end(7), x_of(&layout, 200));
    assert_eq!(bar_end(4), x_of(&layout, 230));
    assert_eq!(layout.rows[4].synced.as_ref().unwrap().1, "230ms");
    assert_eq!(layout.rows[0].connected_x, Some(x_of(&layout, 12)));
    assert_eq!(layout.rows[5].connected_x, Some(x_of(&layout, 15)));
    assert!(layout.lines.is_empty(), "nothing fired: {:?}", layout.lines);
}

#[test]
fn the_axis_ends_on_a_round_tick_past_the_last_step() {
    // The last step is at 320 ms: 50 ms ticks up to 350 ms.
    let layout = layout(&sample(false), "t");
    assert_eq!(layout.span, Duration::from_millis(350));
    let ticks: Vec<&str> = layout.ticks.iter().map(|t| t.label.as_str()).collect();
    assert_eq!(
        ticks,
        [
            "0s", "50ms", "100ms", "150ms", "200ms", "250ms", "300ms", "350ms"
        ]
    );
    assert_eq!(layout.ticks.first().unwrap().x, LEFT);
    assert_eq!(layout.ticks.last().unwrap().x, RIGHT);
    assert!(layout.axis_y > layout.lane.1 && layout.height > layout.legend_y);
}

#[test]
fn a_breaker_is_a_line_and_the_clusters_it_gave_up_on_stay_unsynced() {
    let layout = layout(&sample(true), "t");
    assert_eq!(layout.rows.len(), 8);
    assert!(layout.rows[..4].iter().all(|r| r.synced.is_some()));
    assert!(layout.rows[4..].iter().all(|r| r.synced.is_none()));
    let [line] = layout.lines.as_slice() else {
        panic!("one line: {:?}", layout.lines);
    };
    assert_eq!(line.kind, LineKind::Breaker);
    assert_eq!(line.x, x_of(&layout, 1000));
    assert_eq!(line.label, "breaker: IPIdentitiesSynced (regeneration)");
    assert!(line.label_y < layout.rows_top, "labelled above the rows");
}

#[test]
fn a_cluster_known_only_from_a_breaker_still_gets_its_rows() {
    let step = |ms, what| Step {
        offset: Duration::from_millis(ms),
        what,
    };
    let timeline = Timeline {
        started_at: "now".to_owned(),
        dropped: 0,
        steps: vec![
            step(0, What::Started),
            step(
                60_000,
                What::WaitReturned {
                    waiter: pb::Waiter::Readiness,
                    kind: pb::TimelineSyncKind::Nodes,
                    end: pb::WaitEnd::Breaker,
                    pending: vec!["c9".to_owned()],
                    error: None,
                },
            ),
            step(
                60_000,
                What::WaitReturned {
                    waiter: pb::Waiter::Prune,
                    kind: pb::TimelineSyncKind::Nodes,
                    end: pb::WaitEnd::Breaker,
                    pending: vec!["c9".to_owned()],
                    error: None,
                },
            ),
            step(
                60_001,
                What::WaitReturned {
                    waiter: pb::Waiter::Readiness,
                    kind: pb::TimelineSyncKind::IpIdentities,
                    end: pb::WaitEnd::Synced,
                    pending: Vec::new(),
                    error: None,
                },
            ),
        ],
    };
    let layout = layout(&timeline, "t");
    assert_eq!(labels(&layout)[0], "c9 · nodes");
    assert!(
        layout
            .rows
            .iter()
            .all(|r| r.connected_x.is_none() && r.synced.is_none())
    );
    // Waits that fired at one instant share one line; the readiness wait that returned
    // last is where the agent became ready.
    let lines: Vec<(LineKind, &str)> = layout
        .lines
        .iter()
        .map(|l| (l.kind, l.label.as_str()))
        .collect();
    assert_eq!(
        lines,
        [
            (
                LineKind::Breaker,
                "breaker: NodesSynced (readiness), breaker: NodesSynced (prune)"
            ),
            (LineKind::Ready, "ready (SERVING)"),
        ]
    );
    assert_eq!(layout.span, Duration::from_secs(70));
    assert_eq!(layout.ticks[1].label, "10s");
}

#[test]
fn the_agent_is_ready_after_a_breaker_and_never_after_a_failed_wait() {
    let readiness = |ms, end| Step {
        offset: Duration::from_millis(ms),
        what: What::WaitReturned {
            waiter: pb::Waiter::Readiness,
            kind: pb::TimelineSyncKind::IpIdentities,
            end,
            pending: Vec::new(),
            error: None,
        },
    };
    let ready = |end| {
        let timeline = Timeline {
            started_at: "2026-12-02T00:00:00Z".to_owned(),
            steps: vec![readiness(1_000, end)],
            dropped: 0,
        };
        layout(&timeline, "t")
            .lines
            .iter()
            .any(|l| l.kind == LineKind::Ready)
    };
    assert!(ready(pb::WaitEnd::Breaker), "the breaker lets health serve");
    assert!(ready(pb::WaitEnd::Synced));
    assert!(
        !ready(pb::WaitEnd::Failed),
        "a failed wait leaves it NOT_SERVING"
    );
}

#[test]
fn markers_that_crowd_take_the_next_label_level() {
    let layout = layout(&sample(true), "t");
    let markers: Vec<(MarkerKind, &str)> = layout
        .markers
        .iter()
        .map(|m| (m.kind, m.label.as_str()))
        .collect();
    assert_eq!(
        markers,
        [
            (MarkerKind::WireguardGc, "WG peers GC"),
            (MarkerKind::Pruned, "prune services"),
            (MarkerKind::Regenerated, "endpoint 1"),
        ]
    );
    let levels: Vec<i32> = layout.markers.iter().map(|m| m.label_y).collect();
    assert!(levels[0] < levels[1] && levels[1] < levels[2], "{levels:?}");
    assert!(layout.markers.iter().all(|m| m.label_y < layout.lane.1));
}

#[test]
fn durations_read_as_people_write_them() {
    let label = |ms| duration_label(Duration::from_millis(ms));
    assert_eq!(label(0), "0s");
    assert_eq!(label(250), "250ms");
    assert_eq!(label(1500), "1.5s");
    assert_eq!(label(1234), "1.23s");
    assert_eq!(label(3000), "3s");
    assert_eq!(label(120_000), "2m");
    assert_eq!(label(90_000), "90s");
    // Rounded to the millisecond, as the table's offsets are.
    assert_eq!(duration_label(Duration::from_micros(14_900)), "15ms");
}
