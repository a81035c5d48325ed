//! What `redlock` says on stderr besides errors: progress while waiting, on a terminal only,
//! so that scripts see nothing but the command's own output. Tracing logs (`-v`) go to
//! stderr too.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use humantime::format_duration;
use tokio::time::Instant;
use tracing_subscriber::EnvFilter;

/// Prints a command's result on stdout. A closed stdout (`redlock nodes | head -1`) is not
/// an error worth a panic: the reader has what it wanted.
pub fn print(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

/// Writes to stderr. A closed stderr (a reader that went away, `2>&-`) loses the message
/// but changes nothing else: `eprintln!` would panic there, ending `redlock` with 101
/// instead of its own exit code, before a `run` released its lock.
fn say(message: std::fmt::Arguments<'_>) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_fmt(message).and_then(|()| err.flush());
}

/// A value as pretty JSON on stdout, with a final newline.
pub fn print_json(value: &impl serde::Serialize) {
    let mut text = serde_json::to_string_pretty(value).expect("plain data serializes");
    text.push('\n');
    print(&text);
}

/// Where messages go and whether they are wanted.
#[derive(Debug, Clone, Copy)]
pub struct Console {
    quiet: bool,
    tty: bool,
}

impl Console {
    /// `quiet` from `-q`; the terminal check is made once here.
    pub fn new(quiet: bool) -> Console {
        Console {
            quiet,
            tty: std::io::stderr().is_terminal(),
        }
    }

    /// An error, always shown.
    pub fn error(&self, message: impl std::fmt::Display) {
        say(format_args!("redlock: {message}\n"));
    }

    /// A warning (something went wrong that does not change the outcome), unless quiet.
    pub fn warn(&self, message: impl std::fmt::Display) {
        if !self.quiet {
            say(format_args!("redlock: {message}\n"));
        }
    }

    /// A progress display for a wait for `key` of up to `max_wait`, on a terminal only.
    pub fn waiting(&self, key: &str, max_wait: Option<Duration>) -> Waiting {
        Waiting {
            show: self.tty && !self.quiet,
            key: key.to_string(),
            max_wait,
            start: Instant::now(),
            shown: false,
        }
    }
}

/// The progress line of a wait for a lock.
#[derive(Debug)]
pub struct Waiting {
    show: bool,
    key: String,
    max_wait: Option<Duration>,
    start: Instant,
    shown: bool,
}

/// An uncontended lock takes a millisecond; only a wait people would notice is shown.
const FIRST_SHOWN_AFTER: Duration = Duration::from_millis(500);

impl Waiting {
    /// Completes when the line should be redrawn; never, when nothing is shown.
    pub async fn tick(&self) {
        if !self.show {
            return std::future::pending().await;
        }
        let elapsed = self.start.elapsed();
        let next = if elapsed < FIRST_SHOWN_AFTER {
            FIRST_SHOWN_AFTER
        } else {
            // The next whole second of waiting: the line counts seconds.
            Duration::from_secs(elapsed.as_secs() + 1)
        };
        tokio::time::sleep_until(self.start + next).await;
    }

    /// Redraws the line: what is waited for, for how long so far, and the limit.
    pub fn draw(&mut self) {
        let waited = Duration::from_secs(self.start.elapsed().as_secs());
        let limit = match self.max_wait {
            Some(max) if max < Duration::from_secs(365 * 24 * 3600) => {
                format!("up to {}", format_duration(max))
            }
            _ => "no time limit".to_string(),
        };
        let mut err = std::io::stderr().lock();
        // `\r` and clear-to-end-of-line: one line, updated in place.
        let _ = write!(
            err,
            "\rredlock: waiting for lock \"{}\", another holder has it: {} so far, {limit} (Ctrl-C to give up)\x1b[K",
            self.key,
            format_duration(waited),
        );
        let _ = err.flush();
        self.shown = true;
    }

    /// Ends the line, if one was drawn, with how the wait ended.
    pub fn finish(&self, outcome: &str) {
        if self.shown {
            let waited = Duration::from_millis(self.start.elapsed().as_millis() as u64);
            say(format_args!(
                "\rredlock: lock \"{}\" {outcome} after {}\x1b[K\n",
                self.key,
                format_duration(waited)
            ));
        }
    }
}

/// Logs to stderr: off with `-q`; by default errors, and warnings too on a terminal (the
/// library warns, for example, about nodes without persistence: worth telling a person,
/// noise in a script's log, and `redlock nodes` tells it on demand); then info, debug and
/// trace with each `-v`. `REDLOCK_LOG` (a tracing filter such as `redlock_core=debug`)
/// replaces the level.
pub fn init_tracing(quiet: bool, verbose: u8) {
    let tty = std::io::stderr().is_terminal();
    // fred logs its own reconnections and resubscriptions as errors; the library reports
    // what they mean for the lock, so fred's lines are only for those who ask (-vv).
    let level = match (quiet, verbose) {
        (true, _) => "off",
        (false, 0) if tty => "warn,fred=off",
        (false, 0) => "error,fred=off",
        (false, 1) => "info,fred=off",
        (false, 2) => "debug",
        (false, _) => "trace",
    };
    let filter = EnvFilter::try_from_env("REDLOCK_LOG").unwrap_or_else(|_| EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // A log line that cannot be written (stderr closed) is dropped: by default the
        // subscriber reports that with `eprintln!`, which panics on a closed stderr.
        .log_internal_errors(false)
        .with_ansi(tty)
        .with_target(verbose > 0)
        .init();
}
