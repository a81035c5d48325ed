//! The bench's error: which step failed, why, and what to do about it.

use std::fmt;

/// A step of the benchmark that could not be completed.
#[derive(Debug)]
pub struct BenchError {
    /// What the bench was doing, naming the node, link or scenario involved.
    pub step: String,
    /// The underlying error, as text.
    pub cause: String,
    /// What to do about it.
    pub advice: &'static str,
}

impl BenchError {
    pub fn new(step: impl Into<String>, cause: impl fmt::Display, advice: &'static str) -> Self {
        BenchError {
            step: step.into(),
            cause: cause.to_string(),
            advice,
        }
    }
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {}; {}", self.step, self.cause, self.advice)
    }
}

impl std::error::Error for BenchError {}

/// Attaches the step and the advice to any error.
pub trait Context<T> {
    fn during(self, step: impl Into<String>, advice: &'static str) -> Result<T, BenchError>;
}

impl<T, E: fmt::Display> Context<T> for Result<T, E> {
    fn during(self, step: impl Into<String>, advice: &'static str) -> Result<T, BenchError> {
        self.map_err(|e| BenchError::new(step, e, advice))
    }
}

/// Advice for errors of the node harness, whose messages already say what to do.
pub const SEE_ABOVE: &str = "see the message above for what to do";
/// Advice for failures to write the outputs.
pub const CHECK_OUT_DIR: &str = "check that the --out directory is writable and has free space";
