//! `meshctl timeline` as text (one row per step) and as JSON.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{Value, json};

use super::model::{Step, Timeline, What};

const HEADERS: [&str; 5] = ["OFFSET", "STEP", "CLUSTER", "KIND", "DETAIL"];

/// `+1.234s`: the offset from the start, to the millisecond.
pub fn offset(offset: Duration) -> String {
    format!("+{:.3}s", offset.as_secs_f64())
}

/// The table: a heading, then one row per step in time order.
pub fn render(timeline: &Timeline) -> String {
    let rows: Vec<[String; 5]> = timeline
        .steps
        .iter()
        .map(|step| {
            [
                offset(step.offset),
                step.name().to_owned(),
                step.cluster().unwrap_or("-").to_owned(),
                step.kind().unwrap_or("-").to_owned(),
                step.detail(&timeline.started_at),
            ]
        })
        .collect();
    let mut widths = HEADERS.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Timeline of the agent's start at {} ({} steps{})",
        timeline.started_at,
        timeline.steps.len(),
        if timeline.dropped > 0 {
            format!(
                ", {} more left out: the agent keeps the first ones",
                timeline.dropped
            )
        } else {
            String::new()
        }
    );
    let header = HEADERS.map(str::to_owned);
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (i, (cell, width)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}  ");
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}

/// The timeline as one JSON object: each step's table columns, and the fields of its type.
pub fn to_json(timeline: &Timeline) -> Value {
    json!({
        "started_at": timeline.started_at,
        "dropped": timeline.dropped,
        "steps": timeline.steps.iter().map(|s| step_json(s, &timeline.started_at)).collect::<Vec<_>>(),
    })
}

fn step_json(step: &Step, started_at: &str) -> Value {
    let mut value = json!({
        "offset_us": u64::try_from(step.offset.as_micros()).unwrap_or(u64::MAX),
        "step": step.name(),
        "cluster": step.cluster(),
        "kind": step.kind(),
        "detail": step.detail(started_at),
    });
    let extra = match &step.what {
        What::WaitReturned {
            waiter,
            pending,
            error,
            ..
        } => json!({
            "waiter": super::model::waiter_name(*waiter),
            "wait_end": step.wait_end(),
            "pending": pending,
            "error": error,
        }),
        What::Regenerated { endpoint, error } => json!({"endpoint_id": endpoint, "error": error}),
        What::WireguardGc { removed, .. } | What::Pruned { removed, .. } => {
            json!({"removed": removed})
        }
        What::Unknown(code) => json!({"type": code}),
        What::Started | What::Connected { .. } | What::ListDone { .. } => json!({}),
    };
    if let (Some(value), Value::Object(extra)) = (value.as_object_mut(), extra) {
        value.extend(extra);
    }
    value
}

#[cfg(test)]
mod tests {
    use super::super::tests::sample;
    use super::*;

    #[test]
    fn the_table_has_one_aligned_row_per_step_in_time_order() {
        let table = render(&sample(false));
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "Timeline of the agent's start at 2026-11-29T10:00:00.000Z (15 steps)"
        );
        assert_eq!(
            lines[1],
            "OFFSET   STEP           CLUSTER  KIND                DETAIL"
        );
        assert_eq!(
            lines[2],
            "+0.000s  start          -        -                   agent started at 2026-11-29T10:00:00.000Z"
        );
        assert_eq!(
            lines[3],
            "+0.012s  connected      c1       -                   etcd connected, cluster config valid"
        );
        assert!(
            lines.iter().any(|l| l.starts_with(
                "+0.300s  wait-returned  -        IPIdentitiesSynced  regeneration: synced"
            )),
            "{table}"
        );
        assert_eq!(lines.len(), 2 + 15, "{table}");
    }

    #[test]
    fn the_json_names_each_step_and_how_each_wait_ended() {
        let json = to_json(&sample(true));
        let steps = json["steps"].as_array().unwrap();
        assert_eq!(steps[0]["step"], "start");
        assert_eq!(steps[0]["cluster"], Value::Null);
        let breaker = steps
            .iter()
            .find(|s| s["wait_end"] == "breaker")
            .expect("a breaker");
        assert_eq!(breaker["kind"], "IPIdentitiesSynced");
        assert_eq!(breaker["waiter"], "regeneration");
        assert_eq!(breaker["pending"], json!(["c2"]));
        assert_eq!(breaker["offset_us"], 1_000_000);
    }
}
