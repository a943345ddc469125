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
    quantile(values, 0.5)
}

/// The `q` quantile (0..=1) of `sorted`, which must be sorted and not empty.
pub fn quantile<T: Copy>(sorted: &[T], q: f64) -> T {
    sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)]
}

/// `d` in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// CPU time (user + system) process `pid` has used so far, or zero when `/proc` does not say.
pub fn cpu_time(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // Fields after the command name, which is in parentheses and may hold spaces.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the name.
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<u64>().ok()))
        .sum();
    // USER_HZ: /proc reports clock ticks of 10 ms on every Linux architecture we run on.
    Duration::from_millis(ticks * 10)
}
