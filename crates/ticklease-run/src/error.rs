//! What can go wrong running a command.

/// A runner's failure (a child that exits non-zero is a [`crate::ChildEnd`], not this).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The guard process could not be started.
    #[error("could not start the guard process")]
    Spawn {
        #[source]
        source: std::io::Error,
    },
    /// The guard's command line or pipes are missing.
    #[error("no guard command line or pipes")]
    NoGuard,
    /// The command could not be started (not found, not executable).
    #[error("{message}")]
    Command {
        /// The guard's message, naming the command.
        message: String,
    },
    /// The child exited non-zero or by a signal: fails the tick.
    #[error("exit {code}{}", tail_text(.stderr_tail))]
    Exit {
        /// Its code, or 128 + the signal.
        code: i32,
        /// Its last stderr lines.
        stderr_tail: Vec<String>,
    },
    /// The child ran past its timeout and was stopped: fails the tick.
    #[error("stopped after its timeout (exit {code}){}", tail_text(.stderr_tail))]
    TimedOut {
        /// What the child's group exited with.
        code: i32,
        /// Its last stderr lines.
        stderr_tail: Vec<String>,
    },
    /// The runner stopped the child (a lost term, a pause, shutdown).
    #[error("stopped by the runner (exit {code})")]
    Stopped {
        /// What the child's group exited with.
        code: i32,
    },
    /// The lease library failed.
    #[error("lease")]
    Lease {
        #[source]
        source: ticklease::Error,
    },
    /// An invalid option (exit 2, nothing written).
    #[error("{problem}")]
    Usage {
        /// What is wrong, naming the option.
        problem: String,
    },
}

/// The history keeps the first 500 characters of an error: the end of the
/// child's stderr (its last line) is what matters, so the start is cut.
const TAIL_TEXT_MAX: usize = 450;

fn tail_text(tail: &[String]) -> String {
    let text = tail.join(" | ");
    let n = text.chars().count();
    match n {
        0 => String::new(),
        n if n > TAIL_TEXT_MAX => format!(": …{}", text.chars().skip(n - TAIL_TEXT_MAX).collect::<String>()),
        _ => format!(": {text}"),
    }
}
