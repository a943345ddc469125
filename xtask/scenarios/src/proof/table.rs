//! What the proof prints: one detail line per run, the one-screen table of its figures (with
//! the wait against without it), and the closing line of `key=value` figures that the suite's
//! test and CI read.

use super::RunReport;

/// One line of a run's details (sample counts included), prefixed by `name`.
pub fn details(name: &str, r: &RunReport) -> String {
    let mut line = format!(
        "{name:<18} drops={} stream: received={} gaps={} resets={} longest_pause={} ms; \
         samples: waiting={} regenerated-without-B={} B-before-regeneration={}; \
         bad entries written={}",
        r.drops,
        r.stream.received,
        r.stream.gaps,
        r.stream.resets,
        r.stream.longest_pause.as_millis(),
        r.waiting,
        r.regenerated_without_b,
        r.b_before_regeneration,
        r.bad_written
    );
    if let Some(c) = &r.connects {
        let reasons = if c.reasons.is_empty() {
            String::new()
        } else {
            format!(" ({})", c.reasons.join(", "))
        };
        line.push_str(&format!(
            "\n{:<18} global service: {} new connections, {} failed{reasons}",
            "",
            c.ok + c.failed,
            c.failed,
        ));
    }
    if let Some(w) = &r.wg_stream {
        line.push_str(&format!(
            "\n{:<18} WireGuard stream: received={} gaps={} longest_pause={} ms",
            "",
            w.received,
            w.gaps,
            w.longest_pause.as_millis()
        ));
    }
    line
}

/// A row of the table: its label and how a run's report fills its cell.
type Row = (&'static str, &'static str, fn(&RunReport) -> Option<String>);

const ROWS: &[Row] = &[
    ("TCP stream A → B", "BPF drops", |r| {
        Some(r.drops.to_string())
    }),
    ("  (A's endpoint program)", "gaps", |r| {
        Some((r.stream.gaps + r.stream.resets).to_string())
    }),
    ("", "longest pause", |r| Some(pause(r.stream.longest_pause))),
    ("New connections A → VIP", "failed", |r| {
        r.connects
            .as_ref()
            .map(|c| format!("{}/{}", c.failed, c.ok + c.failed))
    }),
    ("  (socket-LB, backends in B)", "", |_| None),
    ("UDP stream B → A", "gaps", |r| {
        r.wg_stream.as_ref().map(|w| w.gaps.to_string())
    }),
    ("  (WireGuard only)", "longest pause", |r| {
        r.wg_stream.as_ref().map(|w| pause(w.longest_pause))
    }),
];

fn pause(d: std::time::Duration) -> String {
    if d.as_millis() >= 1000 {
        format!("{:.1} s", d.as_secs_f64())
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// The one-screen table: a row per figure, a column per run (`-` where a run or a figure is
/// missing: a variant not run, or a scene without a service or tunnels).
pub fn table(with: Option<&RunReport>, without: Option<&RunReport>) -> String {
    let cell = |r: Option<&RunReport>, f: fn(&RunReport) -> Option<String>| {
        r.and_then(f).unwrap_or_else(|| "-".to_owned())
    };
    let mut out = format!(
        "{:<30} {:<14} {:>16} {:>16}\n",
        "A restarts, B late", "", "with the wait", "without (0s)"
    );
    for (label, figure, f) in ROWS {
        if figure.is_empty() {
            out.push_str(&format!("{label}\n"));
            continue;
        }
        out.push_str(&format!(
            "{label:<30} {figure:<14} {:>16} {:>16}\n",
            cell(with, *f),
            cell(without, *f)
        ));
    }
    out.pop();
    out
}

/// `drops_with_wait=… drops_without_wait=… stream_gaps_with_wait=…
/// connect_failures_with_wait=… connect_failures_without_wait=… wg_stream_gaps_with_wait=…
/// wg_stream_gaps_without_wait=…`, in that order (`-` for a figure not measured).
pub fn closing_line(with: Option<&RunReport>, without: Option<&RunReport>) -> String {
    let field = |r: Option<&RunReport>, f: fn(&RunReport) -> Option<u64>| {
        r.and_then(f)
            .map_or_else(|| "-".to_owned(), |n| n.to_string())
    };
    let drops: fn(&RunReport) -> Option<u64> = |r| Some(r.drops);
    let gaps: fn(&RunReport) -> Option<u64> = |r| Some(r.stream.gaps + r.stream.resets);
    let failures: fn(&RunReport) -> Option<u64> = |r| r.connects.as_ref().map(|c| c.failed);
    let wg_gaps: fn(&RunReport) -> Option<u64> =
        |r| r.wg_stream.as_ref().map(|w| w.gaps + w.resets);
    format!(
        "drops_with_wait={} drops_without_wait={} stream_gaps_with_wait={} \
         connect_failures_with_wait={} connect_failures_without_wait={} \
         wg_stream_gaps_with_wait={} wg_stream_gaps_without_wait={}",
        field(with, drops),
        field(without, drops),
        field(with, gaps),
        field(with, failures),
        field(without, failures),
        field(with, wg_gaps),
        field(without, wg_gaps),
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::proof::connects::ConnectReport;
    use crate::proof::stream::StreamReport;

    fn report(drops: u64, failed: u64, wg_gaps: u64) -> RunReport {
        RunReport {
            drops,
            stream: StreamReport {
                received: 100,
                gaps: drops.min(1),
                resets: 0,
                longest_pause: Duration::from_millis(30),
            },
            regenerated_without_b: 0,
            b_before_regeneration: 0,
            waiting: 0,
            bad_written: 0,
            connects: Some(ConnectReport {
                ok: 20,
                failed,
                reasons: Vec::new(),
            }),
            wg_stream: Some(StreamReport {
                received: 100,
                gaps: wg_gaps,
                resets: 0,
                longest_pause: Duration::from_millis(2500),
            }),
        }
    }

    #[test]
    fn the_closing_line_keeps_the_older_fields_first_and_in_order() {
        let line = closing_line(Some(&report(0, 0, 0)), Some(&report(94, 3, 5)));
        assert_eq!(
            line,
            "drops_with_wait=0 drops_without_wait=94 stream_gaps_with_wait=0 \
             connect_failures_with_wait=0 connect_failures_without_wait=3 \
             wg_stream_gaps_with_wait=0 wg_stream_gaps_without_wait=5"
        );
    }

    #[test]
    fn figures_not_measured_are_dashes() {
        let mut fixtures = report(0, 0, 0);
        fixtures.connects = None;
        fixtures.wg_stream = None;
        let line = closing_line(Some(&fixtures), None);
        assert!(
            line.starts_with("drops_with_wait=0 drops_without_wait=- "),
            "{line}"
        );
        assert!(line.ends_with("wg_stream_gaps_without_wait=-"), "{line}");
        let table = table(Some(&fixtures), None);
        let udp = table.lines().find(|l| l.starts_with("UDP")).unwrap();
        assert_eq!(
            udp.split_whitespace().rev().take(2).collect::<Vec<_>>(),
            ["-", "-"]
        );
    }

    #[test]
    fn the_table_fits_one_screen() {
        let table = table(Some(&report(0, 0, 0)), Some(&report(94, 3, 5)));
        assert!(table.lines().count() <= 24, "{table}");
        assert!(table.lines().all(|l| l.chars().count() <= 80), "{table}");
        assert!(table.contains("2.5 s"), "{table}");
    }
}
