//! Why a scenario could not run (as opposed to the violations it found).

use redlock_testkit::HarnessError;

use crate::outcome::Outcome;

/// A scenario could not be set up or driven. Violations are not errors: they are results.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// Starting nodes, injecting a fault or inspecting a node failed.
    #[error(transparent)]
    Harness(#[from] HarnessError),
    /// A client could not be configured or connected.
    #[error("client set-up failed: {0}")]
    Client(#[from] redlock_client::Error),
    /// A client configuration was refused.
    #[error("client configuration refused: {0}")]
    Config(#[from] redlock_client::InvalidConfig),
    /// A command of the lab's own (the fenced resource, a lab-side token issuer) failed.
    #[error("a lab-side Redis command failed: {0}")]
    Redis(#[from] fred::error::Error),
    /// A scenario's schedule waited for an event (e.g. the observer seeing a new holder's
    /// token) that did not come in time.
    #[error("the schedule waited in vain: {0}")]
    Schedule(String),
    /// Anything else, with what to do about it.
    #[error("{0}")]
    Setup(String),
    /// A driver that had judged its own rules when something else failed: the run reports
    /// `error`, and the outcome's violations and notes with it (a false success found
    /// before a restart failed is not lost to the restart's error).
    #[error("{error}")]
    Judged {
        /// What failed.
        error: Box<LabError>,
        /// What the driver had found by then.
        outcome: Box<Outcome>,
    },
}

impl LabError {
    /// `self`, with the outcome a driver had judged by the time it happened.
    pub fn with_outcome(self, outcome: Outcome) -> LabError {
        LabError::Judged {
            error: Box::new(self),
            outcome: Box::new(outcome),
        }
    }
}
