//! Live progress for `status --wait`, on stderr so stdout keeps only the final status:
//! indicatif bars (one per cluster) on a terminal, otherwise a line per change.

use std::collections::HashMap;
use std::io::IsTerminal as _;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::render::count;
use super::view::{ClusterMeshView, ClusterView};

/// Where and how progress is shown.
pub enum Progress {
    Bars(Bars),
    Lines(Lines),
}

impl Progress {
    /// Bars when stderr is a terminal, lines otherwise.
    pub fn new(timeout: Duration) -> Self {
        if std::io::stderr().is_terminal() {
            Self::Bars(Bars::new(timeout))
        } else {
            Self::Lines(Lines::default())
        }
    }

    /// Shows a fresh status.
    pub fn update(&mut self, mesh: &ClusterMeshView, elapsed: Duration) {
        let header = header(mesh);
        let width = mesh
            .clusters
            .iter()
            .map(|c| c.name.len())
            .max()
            .unwrap_or(0);
        let clusters = mesh
            .clusters
            .iter()
            .map(|c| (c.name.as_str(), cluster_line(c, width)));
        match self {
            Self::Bars(bars) => bars.update(&header, clusters),
            Self::Lines(lines) => lines.update(&header, clusters, elapsed),
        }
    }

    /// Shows why there is no status this time (the agent is not up yet, or went away).
    pub fn unreachable(&mut self, error: &str, elapsed: Duration) {
        let header = format!("waiting for the agent: {error}");
        match self {
            Self::Bars(bars) => bars.update(&header, std::iter::empty()),
            Self::Lines(lines) => lines.update(&header, std::iter::empty(), elapsed),
        }
    }

    /// Clears the bars, so that the final status starts on a clean screen.
    pub fn finish(self) {
        if let Self::Bars(bars) = self {
            bars.finish();
        }
    }
}

fn header(mesh: &ClusterMeshView) -> String {
    format!(
        "ClusterMesh: {}/{} remote clusters ready",
        mesh.ready, mesh.total
    )
}

/// `cluster-3  syncing  nodes ✓ 3  services … 0  identities … 0  endpoints … 0`.
pub fn cluster_line(c: &ClusterView, name_width: usize) -> String {
    let state = if c.ready {
        "ready"
    } else if !c.connected {
        "disconnected"
    } else if c.config.required && !c.config.retrieved {
        "awaiting config"
    } else if c.synced.nodes && c.synced.services && c.synced.identities && c.synced.endpoints {
        "not ready"
    } else {
        "syncing"
    };
    let kind = |synced: bool, n: u64| format!("{} {n}", if synced { '✓' } else { '…' });
    let mut line = format!(
        "{:<name_width$}  {state:<15}  nodes {}  services {}  identities {}  endpoints {}",
        c.name,
        kind(c.synced.nodes, c.entries.nodes),
        kind(c.synced.services, c.entries.services),
        kind(c.synced.identities, c.entries.identities),
        kind(c.synced.endpoints, c.entries.endpoints),
    );
    if c.failures > 0 {
        line.push_str(&format!("  {}", count(c.failures, "failure", "failures")));
    }
    if let Some(error) = &c.last_error {
        line.push_str(&format!("  last error: {error}"));
    }
    line
}

/// A spinner with the header, and one line per cluster under it.
pub struct Bars {
    multi: MultiProgress,
    header: ProgressBar,
    clusters: Vec<(String, ProgressBar)>,
}

impl Bars {
    fn new(timeout: Duration) -> Self {
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
        let header = multi.add(ProgressBar::new_spinner());
        // Templates are literals: a bad one is a bug caught by any run.
        header.set_style(
            ProgressStyle::with_template("{spinner} {msg} [{elapsed} of {prefix}]")
                .expect("valid template"),
        );
        header.set_prefix(humantime::format_duration(timeout).to_string());
        header.enable_steady_tick(Duration::from_millis(100));
        Self {
            multi,
            header,
            clusters: Vec::new(),
        }
    }

    fn update<'a>(&mut self, header: &str, clusters: impl Iterator<Item = (&'a str, String)>) {
        let mut kept = Vec::new();
        for (name, line) in clusters {
            let bar = match self.clusters.iter().position(|(n, _)| n == name) {
                Some(i) => self.clusters.swap_remove(i).1,
                None => {
                    let bar = self.multi.add(ProgressBar::new_spinner());
                    bar.set_style(ProgressStyle::with_template("  {msg}").expect("valid template"));
                    bar
                }
            };
            bar.set_message(line);
            kept.push((name.to_owned(), bar));
        }
        // Clusters gone from the status (their config was removed).
        for (_, bar) in self.clusters.drain(..) {
            bar.finish_and_clear();
            self.multi.remove(&bar);
        }
        self.clusters = kept;
        // Last, so the header never runs ahead of the lines under it.
        self.header.set_message(header.to_owned());
    }

    fn finish(self) {
        for (_, bar) in &self.clusters {
            bar.finish_and_clear();
        }
        self.header.finish_and_clear();
    }
}

/// The last line printed per cluster (and for the header), to print only changes.
#[derive(Default)]
pub struct Lines {
    header: String,
    clusters: HashMap<String, String>,
}

impl Lines {
    fn update<'a>(
        &mut self,
        header: &str,
        clusters: impl Iterator<Item = (&'a str, String)>,
        elapsed: Duration,
    ) {
        let at = humantime::format_duration(Duration::from_secs(elapsed.as_secs()));
        if self.header != header {
            eprintln!("[{at}] {header}");
            header.clone_into(&mut self.header);
        }
        for (name, line) in clusters {
            if self.clusters.get(name) != Some(&line) {
                eprintln!("[{at}]    {line}");
                self.clusters.insert(name.to_owned(), line);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::view::{StatusView, sample};

    #[test]
    fn cluster_lines() {
        let view = StatusView::from(&sample());
        let [ready, failing] = &view.clustermesh.clusters[..] else {
            panic!("two clusters");
        };
        assert_eq!(
            cluster_line(ready, 10),
            "cluster-2   ready            nodes ✓ 3  services ✓ 2  identities ✓ 5  endpoints ✓ 10"
        );
        assert_eq!(
            cluster_line(failing, 10),
            "cluster-3   syncing          nodes … 1  services … 0  identities … 0  endpoints … 0  \
             1 failure  last error: clusterID 2 is already used"
        );
    }
}
