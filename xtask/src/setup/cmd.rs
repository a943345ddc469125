//! Running commands quietly, keeping the tail of their output for failure reports.

use std::process::{Command, Output, Stdio};

/// How many of a failed command's last output lines a report shows.
const TAIL_LINES: usize = 3;

/// Runs `command` with stdin closed and its output captured. A failure is described by the
/// last lines of its stderr (or stdout, if stderr is empty).
pub fn run(command: &mut Command) -> Result<Output, String> {
    run_keeping(command, TAIL_LINES)
}

/// [`run`], describing a failure by the last `lines` lines of its output.
pub fn run_keeping(command: &mut Command, lines: usize) -> Result<Output, String> {
    let program = command.get_program().to_string_lossy().into_owned();
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|err| format!("cannot run {program}: {err}"))?;
    if output.status.success() {
        Ok(output)
    } else {
        Err(failure_tail(&output, lines))
    }
}

/// The last `count` non-empty lines of a failed command's stderr (or stdout), joined by
/// ` | `; or its exit status if it printed nothing.
fn failure_tail(output: &Output, count: usize) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let text = if stderr.trim().is_empty() {
        String::from_utf8_lossy(&output.stdout)
    } else {
        stderr
    };
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect();
    if lines.is_empty() {
        return format!("exited with {}", output.status);
    }
    lines[lines.len().saturating_sub(count)..].join(" | ")
}
