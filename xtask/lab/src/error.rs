//! Errors of the lab.

use std::path::PathBuf;
use std::time::Duration;

/// Result alias for lab operations.
pub type Result<T, E = LabError> = std::result::Result<T, E>;

/// Why a lab component could not be started, used or cleaned.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A required program is not installed.
    #[error("`{program}` not found on PATH (run `cargo xtask setup`)")]
    MissingProgram {
        /// Name of the missing program.
        program: String,
    },
    /// A program ran but failed.
    #[error("`{command}` failed: {detail}")]
    CommandFailed {
        /// The command line, for the reader.
        command: String,
        /// Exit status and captured stderr.
        detail: String,
    },
    /// A condition was not met before its deadline.
    #[error("timed out after {waited:?} waiting for {what}; last seen: {last}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long it was awaited.
        waited: Duration,
        /// What the last look saw.
        last: String,
    },
    /// A file-system or process operation failed.
    #[error("{context}: {error}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        error: std::io::Error,
    },
    /// The Python venv that holds moto is missing.
    #[error("python venv not found at {path} (run `cargo xtask setup`)")]
    MissingVenv {
        /// Where the venv was looked for.
        path: PathBuf,
    },
}

impl LabError {
    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| Self::Io {
            context,
            error: source,
        }
    }
}
