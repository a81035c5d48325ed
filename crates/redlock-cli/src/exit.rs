//! The exit codes: one table, so that scripts can tell "the lock was busy" from "the lock was
//! lost" from "the nodes are down" from "the command itself failed".
//!
//! The fixed codes follow `sysexits.h` where one fits (64, 69, 75, 78) and the shells'
//! conventions for commands (126, 127, 128 + signal), so that `redlock run` can stand in
//! front of a command in a script without changing what its caller already handles. The
//! command's own code passes through unchanged; it can collide with ours (a command that
//! exits 75 looks like a busy lock), as with `timeout(1)`'s 124. Scripts that must tell them
//! apart should keep their commands' own codes out of 64-78.

use std::process::ExitCode;

/// How `redlock` ends. The numbers are part of its interface (see the crate README).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: done (`run`: the command exited 0; `inspect`: the key is held; `nodes`: every
    /// node healthy; `release`: the token was removed; `fence`: tokens can be issued).
    Success,
    /// 1: the answer is no (`inspect`: the key is not held; `nodes`: some node unhealthy or
    /// unreachable, a quorum still reachable; `release`: no node held the key with that token;
    /// `fence`: the counters must be raised).
    No,
    /// The command's own exit code (`run`), or 128 + N when a signal N ended it (or ended
    /// the wait for the lock), as shells report it.
    Command(u8),
    /// 64 (`EX_USAGE`): the command line is wrong (unknown flag, missing argument, a key or
    /// number the library refuses).
    Usage,
    /// 69 (`EX_UNAVAILABLE`): fewer than a quorum of nodes could be reached or accepted the
    /// commands (an ACL without a permission, a replica); also `run` when the command
    /// exited 0 but its release failed on a quorum (the key stays until its TTL), `run
    /// --fenced` when no token can be issued until the counters are raised, and `fence
    /// --raise-to` when a node was not reached.
    Unavailable,
    /// 75 (`EX_TEMPFAIL`): the lock was not acquired within the wait: another holder has it.
    NotAcquired,
    /// 76: the lock was lost while the command ran; the command was stopped.
    LockLost,
    /// 78 (`EX_CONFIG`): the configuration (flags, environment, file) cannot work.
    Config,
    /// 126: the command was found but could not be started (not executable, ...).
    CannotExecute,
    /// 127: the command was not found.
    NotFound,
}

impl Exit {
    /// The process exit status.
    pub fn code(self) -> u8 {
        match self {
            Exit::Success => 0,
            Exit::No => 1,
            Exit::Command(code) => code,
            Exit::Usage => 64,
            Exit::Unavailable => 69,
            Exit::NotAcquired => 75,
            Exit::LockLost => 76,
            Exit::Config => 78,
            Exit::CannotExecute => 126,
            Exit::NotFound => 127,
        }
    }

    /// The status shells report for a process ended by signal `signal`.
    pub fn signalled(signal: i32) -> Exit {
        Exit::Command(u8::try_from(128 + signal).unwrap_or(u8::MAX))
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit.code())
    }
}

/// The table as `--help` shows it.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0      success (run: the command exited 0; inspect: held; nodes: all healthy;
         release: the token was removed; fence: tokens can be issued)
  1      the answer is no (inspect: not held; nodes: some node unhealthy; release:
         no node held the key with that token; fence: the counters must be raised)
  N      run: the command's own exit code; 128+N when signal N ended it
  64     usage error (unknown flag, missing argument, an empty or reserved key)
  69     fewer than a quorum of nodes reachable or accepting the commands (ACL,
         replica; the message says which) (also run: the command exited 0 but
         its release failed on a quorum; run --fenced: no token until the
         counters are raised, see fence; fence --raise-to: a node not reached)
  75     the lock was not acquired within the wait (another holder has it)
  76     the lock was lost while the command ran; the command was stopped
  78     configuration error (flags, environment or file)
  126    the command could not be started
  127    the command was not found";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_and_as_documented() {
        let fixed = [
            (Exit::Success, 0),
            (Exit::No, 1),
            (Exit::Usage, 64),
            (Exit::Unavailable, 69),
            (Exit::NotAcquired, 75),
            (Exit::LockLost, 76),
            (Exit::Config, 78),
            (Exit::CannotExecute, 126),
            (Exit::NotFound, 127),
        ];
        for (i, (exit, code)) in fixed.iter().enumerate() {
            assert_eq!(exit.code(), *code);
            assert!(
                EXIT_CODES_HELP.contains(&format!("\n  {code:<6} ")),
                "{code}"
            );
            for (other, _) in &fixed[i + 1..] {
                assert_ne!(exit.code(), other.code());
            }
        }
        assert_eq!(Exit::signalled(2).code(), 130);
        assert_eq!(Exit::signalled(15).code(), 143);
        assert_eq!(Exit::Command(3).code(), 3);
    }
}
