//! Figures the benchmarks report: peak memory of a process, medians, milliseconds, and the
//! per-round paired ratios every benchmark's closing `ratio=` is the median of.

use std::time::Duration;

pub use meshwork_lab::proc_stat::cpu_time;

/// A benchmark's rounds, each a floor and its subject measured back to back, and the round's
/// own ratio. The closing figure is the median of those paired ratios, never a ratio of two
/// medians taken from different rounds: the shared machine's speed drifts between rounds,
/// and pairing cancels that drift out of each ratio.
#[derive(Debug)]
pub struct Rounds<T> {
    rounds: Vec<(f64, T)>,
}

impl<T> Default for Rounds<T> {
    fn default() -> Self {
        Self { rounds: Vec::new() }
    }
}

impl<T> Rounds<T> {
    /// Records a round: its ratio and the figures it came from.
    pub fn push(&mut self, ratio: f64, figures: T) {
        self.rounds.push((ratio, figures));
    }

    /// Every round's ratio, in round order.
    pub fn ratios(&self) -> Vec<f64> {
        self.rounds.iter().map(|(ratio, _)| *ratio).collect()
    }

    /// The median round: its ratio (the median of the per-round ratios; with an odd count,
    /// exactly one round's) and its figures. `None` without rounds.
    pub fn median(&self) -> Option<(f64, &T)> {
        let mut order: Vec<usize> = (0..self.rounds.len()).collect();
        order.sort_by(|&a, &b| self.rounds[a].0.total_cmp(&self.rounds[b].0));
        let middle = *order.get(order.len() / 2)?;
        let (ratio, figures) = &self.rounds[middle];
        Some((*ratio, figures))
    }

    /// The per-round ratios as one line: `0.98 1.02 1.10`.
    pub fn ratios_line(&self) -> String {
        self.ratios()
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Runs a round's floor and subject back to back, the floor first in even rounds and the
/// subject first in odd ones, so neither always meets a warm (or a cold) machine; answers
/// `(floor, subject)`.
pub async fn back_to_back<F, S, FF, SF>(
    round: usize,
    floor: impl FnOnce() -> FF,
    subject: impl FnOnce() -> SF,
) -> anyhow::Result<(F, S)>
where
    FF: Future<Output = anyhow::Result<F>>,
    SF: Future<Output = anyhow::Result<S>>,
{
    if round.is_multiple_of(2) {
        let floor = floor().await?;
        Ok((floor, subject().await?))
    } else {
        let subject = subject().await?;
        Ok((floor().await?, subject))
    }
}

/// Parses a `--rounds` value: odd and at least 1, so the median of the per-round ratios is
/// one round's ratio.
pub fn odd_rounds(value: &str) -> Result<usize, String> {
    let rounds: usize = value.parse().map_err(|err| format!("{value:?}: {err}"))?;
    if rounds.is_multiple_of(2) {
        return Err(format!(
            "{rounds} is even: the rounds must be odd, so the median ratio is one round's"
        ));
    }
    Ok(rounds)
}

/// Peak resident set size (`VmHWM`) of process `pid` in MiB (`None`: this process), or 0
/// when `/proc` does not say.
pub fn peak_rss_mib(pid: Option<u32>) -> u64 {
    let path = pid.map_or_else(
        || "/proc/self/status".to_owned(),
        |pid| format!("/proc/{pid}/status"),
    );
    proc_kib(&path, "VmHWM:").map_or(0, |kib| kib / 1024)
}

/// The machine's available memory (`MemAvailable`) in MiB, or 0 when `/proc` does not say.
pub fn mem_available_mib() -> u64 {
    proc_kib("/proc/meminfo", "MemAvailable:").map_or(0, |kib| kib / 1024)
}

/// The `field` line of the /proc file at `path`, in kB.
fn proc_kib(path: &str, field: &str) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
}

/// The `q` quantile (0..=1) of `sorted`, which must be sorted and not empty.
pub fn quantile<T: Copy>(sorted: &[T], q: f64) -> T {
    sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)]
}

/// `d` in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
