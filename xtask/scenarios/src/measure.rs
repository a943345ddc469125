//! Figures the benchmarks report: peak memory of a process, medians, milliseconds.

use std::time::Duration;

/// Peak resident set size (`VmHWM`) of process `pid` in MiB (`None`: this process), or 0
/// when `/proc` does not say.
pub fn peak_rss_mib(pid: Option<u32>) -> u64 {
    let path = pid.map_or_else(
        || "/proc/self/status".to_owned(),
        |pid| format!("/proc/{pid}/status"),
    );
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kib| kib / 1024)
}

/// The median of `values` (sorts them).
pub fn median(values: &mut [Duration]) -> Duration {
    values.sort_unstable();
    values[values.len() / 2]
}

/// `d` in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
