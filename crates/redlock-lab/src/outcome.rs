//! What a scenario's driver reports besides the history: below the scenario and the lab's
//! error (which carries one when a driver fails after judging its own rules).

use crate::checker::Violation;

/// What the scenario's driver reports besides the history.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Remarks for the summary (e.g. how long recovery took).
    pub notes: Vec<String>,
    /// Violations of scenario-specific rules (e.g. a lock won while a majority was down).
    pub violations: Vec<Violation>,
}
