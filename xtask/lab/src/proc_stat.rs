//! CPU time and counters of a process, read from `/proc`, for the benchmarks and profiles.

use std::time::Duration;

/// CPU time (user + system) process `pid` has used so far, or zero when `/proc` does not say.
///
/// The sum of its threads' run time from `schedstat` (nanoseconds): `/proc/<pid>/stat` counts
/// in 10 ms ticks, which on a reader's 160 ms moved a round's CPU ratio by up to a tenth. A
/// thread that ended is not in the sum; the processes measured here (etcd, the agent, a
/// benchmark's runtime) keep theirs for the whole measurement, and a process whose threads
/// cannot be read falls back to the ticks.
pub fn cpu_time(pid: u32) -> Duration {
    thread_run_time(pid).unwrap_or_else(|| {
        let ticks = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map_or(0, |stat| stat_sum(&stat, &[STAT_UTIME, STAT_STIME]));
        // USER_HZ: /proc reports clock ticks of 10 ms on every Linux architecture we run on.
        Duration::from_millis(ticks * 10)
    })
}

/// The run time of every live thread of `pid` (`None` when none can be read).
pub fn thread_run_time(pid: u32) -> Option<Duration> {
    let mut ns = 0u64;
    let mut threads = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        // A thread may end between the listing and the read: it is skipped.
        let Ok(line) = std::fs::read_to_string(task.ok()?.path().join("schedstat")) else {
            continue;
        };
        ns += line.split_whitespace().next()?.parse::<u64>().ok()?;
        threads += 1;
    }
    (threads > 0).then(|| Duration::from_nanos(ns))
}

/// Minor faults, in a `stat` line's fields after the command name.
pub const STAT_MINFLT: usize = 7;
/// User time in ticks, in a `stat` line's fields after the command name.
pub const STAT_UTIME: usize = 11;
/// System time in ticks, in a `stat` line's fields after the command name.
pub const STAT_STIME: usize = 12;

/// The sum of the `fields` (counted after the command name, which is in parentheses and may
/// hold spaces) of a `/proc/<pid>/stat` line, in the line's own units.
pub fn stat_sum(stat: &str, fields: &[usize]) -> u64 {
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let values: Vec<&str> = rest.split_whitespace().collect();
    fields
        .iter()
        .filter_map(|&i| values.get(i)?.parse::<u64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_per_thread_and_falls_back_to_nothing() {
        let own = thread_run_time(std::process::id()).expect("this process's threads");
        assert!(own > Duration::ZERO);
        assert!(cpu_time(std::process::id()) >= own);
        // No such process (pid_max is at most 2^22).
        assert_eq!(thread_run_time(u32::MAX), None);
        assert_eq!(cpu_time(u32::MAX), Duration::ZERO);
    }

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 321 0 0 0 7 3 0 0";
        assert_eq!(stat_sum(stat, &[STAT_MINFLT]), 321);
        assert_eq!(stat_sum(stat, &[STAT_UTIME, STAT_STIME]), 10);
    }
}
