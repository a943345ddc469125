//! The classic Prometheus text format (0.0.4) from prometheus-client's OpenMetrics output,
//! for scrapers that do not ask for OpenMetrics (and for `promtool check metrics`, which
//! reads only the classic format).
//!
//! The two differ where it matters here: OpenMetrics names a counter family `foo` with
//! samples `foo_total` and ends with `# EOF`; the classic format names the family after
//! its samples (`foo_total`) and has no end marker.

use std::collections::HashSet;

/// Rewrites OpenMetrics text into the classic text format.
pub fn classic_text(openmetrics: &str) -> String {
    let counters: HashSet<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len() + counters.len() * 12);
    for line in openmetrics.lines() {
        if line == "# EOF" {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find(|prefix| line.starts_with(prefix));
        match meta {
            Some(prefix) => {
                let rest = &line[prefix.len()..];
                let name = rest.split(' ').next().unwrap_or_default();
                out.push_str(prefix);
                out.push_str(name);
                if counters.contains(name) {
                    out.push_str("_total");
                }
                out.push_str(&rest[name.len()..]);
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_families_take_their_samples_name_and_eof_goes() {
        let openmetrics = "# HELP m_peers Peers.\n# TYPE m_peers gauge\nm_peers 2\n\
             # HELP m_rejected Rejected.\n# TYPE m_rejected counter\n\
             m_rejected_total{reason=\"a\"} 1\n# EOF\n";
        assert_eq!(
            classic_text(openmetrics),
            "# HELP m_peers Peers.\n# TYPE m_peers gauge\nm_peers 2\n\
             # HELP m_rejected_total Rejected.\n# TYPE m_rejected_total counter\n\
             m_rejected_total{reason=\"a\"} 1\n"
        );
    }
}
