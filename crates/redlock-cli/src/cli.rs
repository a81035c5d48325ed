//! The command line: commands, flags and the environment variables behind them.
//!
//! clap's `env` gives "flag over environment"; the file and the defaults come below both in
//! `settings.rs`, which is why every setting here is an `Option`: `None` means "not given on
//! the command line nor in the environment".

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand};

use crate::exit::EXIT_CODES_HELP;

const SETTINGS_HELP: &str = "\
Settings come from, first match wins: flags, then environment variables (REDLOCK_NODES,
REDLOCK_TTL, ...: each flag names its own), then the TOML file given by --config or
REDLOCK_CONFIG (the library's LockConfig: nodes, ttl, node_timeout, key_prefix, [retry],
[renewal], ...), then the defaults. Durations are written like 30s, 500ms, 1m 30s.";

const EXAMPLES: &str = "\
Examples:
  # Run a nightly job on one host at a time; give up after a minute if another runs it
  redlock --nodes redis://10.0.0.1:6379,redis://10.0.0.2:6379,redis://10.0.0.3:6379 \\
      run --wait 1m nightly-report -- ./report.sh --full

  # The same with the nodes from a file, and a fencing token for the job
  REDLOCK_CONFIG=/etc/redlock.toml redlock run --fenced deploy -- ./deploy.sh

  # Who holds a lock, as JSON
  redlock --config redlock.toml inspect deploy --json

  # Each node's reachability and health
  redlock --config redlock.toml nodes

  # Remove a lock left by a crashed holder (its token from its logs or REDLOCK_TOKEN)
  redlock --config redlock.toml release deploy --token 3f2a...";

/// Redlock locks from the command line: run a command while holding a lock over N
/// independent Redis masters, and inspect or clean up locks.
#[derive(Debug, Parser)]
#[command(name = "redlock", version, after_help = after_help())]
pub struct Cli {
    /// Where the nodes are and how to talk to them.
    #[command(flatten)]
    pub common: Common,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

fn after_help() -> String {
    format!("{SETTINGS_HELP}\n\n{EXAMPLES}\n\n{EXIT_CODES_HELP}")
}

/// The settings every command shares. Global: they may come before or after the command.
#[derive(Debug, Args)]
pub struct Common {
    /// A TOML configuration file (the library's LockConfig, durations as text).
    #[arg(
        long,
        short = 'c',
        env = "REDLOCK_CONFIG",
        global = true,
        value_name = "FILE"
    )]
    pub config: Option<PathBuf>,
    /// The Redis masters, comma-separated, each `redis://[user:password@]host:port[/db]`.
    // Split by `settings::node_list`, not by clap: a password may hold a comma.
    #[arg(
        long,
        env = "REDLOCK_NODES",
        global = true,
        // The URLs may hold passwords: --help must not show the variable's value.
        hide_env_values = true,
        value_name = "URL,..."
    )]
    pub nodes: Option<String>,
    /// How long one node gets to answer one command [default: 100ms].
    #[arg(long, env = "REDLOCK_NODE_TIMEOUT", global = true, value_parser = duration, value_name = "DURATION")]
    pub node_timeout: Option<Duration>,
    /// Prepended to every key [default: redlock:].
    #[arg(long, env = "REDLOCK_KEY_PREFIX", global = true, value_name = "PREFIX")]
    pub key_prefix: Option<String>,
    /// The clock drift allowance, a fraction of the TTL [default: 0.01].
    #[arg(
        long,
        env = "REDLOCK_DRIFT_FACTOR",
        global = true,
        value_name = "FRACTION"
    )]
    pub drift_factor: Option<f64>,
    /// Print nothing on stderr but errors (no progress while waiting, no warnings); what a
    /// command prints on stdout (`inspect`, `nodes`) still comes.
    #[arg(long, short, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
    /// Log what the library does to stderr: -v info, -vv debug, -vvv trace.
    #[arg(long, short, global = true, action = ArgAction::Count)]
    pub verbose: u8,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Acquire KEY, run COMMAND while holding it (renewed in the background), release it.
    ///
    /// The command gets REDLOCK_KEY (the full key), REDLOCK_TOKEN (the lock's token) and,
    /// with --fenced, REDLOCK_FENCING_TOKEN in its environment. SIGINT, SIGTERM, SIGHUP,
    /// SIGQUIT, SIGUSR1, SIGUSR2 and SIGALRM are passed on to it (those ignored when
    /// redlock started stay ignored). If the lock is lost while it runs, the command gets
    /// SIGTERM, then SIGKILL after the grace period (or when the lock's validity ends, if
    /// sooner), and redlock exits with 76; while renewal
    /// fails, it gets SIGTERM a grace period before the lock's validity ends and SIGKILL
    /// when it ends, so that it never runs unlocked. Otherwise redlock exits with the
    /// command's own code (128+N if signal N ended it).
    #[command(override_usage = "redlock run [OPTIONS] <KEY> -- <COMMAND>...")]
    Run(RunArgs),
    /// Show whether KEY is held, for how long, and what each node says.
    ///
    /// "For how long" is the time until fewer than a quorum of nodes hold the key. Exits 0
    /// when held, 1 when not, 69 when too few nodes answered to tell.
    Inspect(InspectArgs),
    /// Show each node's reachability, latency and health.
    ///
    /// Health: what the algorithm assumes of a node (an independent standalone master,
    /// `appendonly yes` with `appendfsync always`, `maxmemory-policy noeviction`). Exits 0
    /// when every node is healthy, 1 when some are not but a quorum is reachable, 69
    /// otherwise.
    Nodes(NodesArgs),
    /// Remove KEY if it holds TOKEN, to clean up after a crashed holder.
    ///
    /// Compare-and-delete on every node: a key that holds another token (a newer holder)
    /// is left alone. Exits 0 when removed, 1 when no node held KEY with TOKEN.
    Release(ReleaseArgs),
    /// Show each node's fencing counter, or raise them all after a quorum lost theirs.
    ///
    /// Fenced locks (`run --fenced`) take their tokens from one counter per node. A node
    /// that lost its counter, or came back from older data (shown as stale), is repaired
    /// by the clients in the background (shown as a repair in progress). When a quorum of
    /// nodes lost their counters at once (restarts without persistence, FLUSHALL,
    /// evictions) while another node kept one, no token can be issued until every counter
    /// is at least the highest token the protected resources have accepted: --raise-to N
    /// sets that (raise-only: a higher counter stays). Exits 0 when fenced locks can get
    /// tokens, 1 when the counters must be raised, 69 when too few nodes answered to tell
    /// (or, with --raise-to, when a node did not answer: run it again once it is back).
    Fence(FenceArgs),
}

/// `redlock run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The lock's lifetime on the nodes; it is renewed every third of it while the command
    /// runs [default: 30s].
    #[arg(long, env = "REDLOCK_TTL", value_parser = duration, value_name = "DURATION")]
    pub ttl: Option<Duration>,
    /// How long to wait for the lock (`forever` for no limit); 0s for a single attempt
    /// [default: the configuration's retry.max_wait, 10s].
    #[arg(long, env = "REDLOCK_WAIT", value_parser = wait, value_name = "DURATION")]
    pub wait: Option<Duration>,
    /// Get a fencing token and pass it to the command as REDLOCK_FENCING_TOKEN
    /// (`--fenced=false` turns off the configuration file's `fencing = true`).
    #[arg(
        long,
        env = "REDLOCK_FENCED",
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub fenced: Option<bool>,
    /// How long the command gets between SIGTERM and SIGKILL when the lock is lost or
    /// renewal fails: it gets SIGTERM this long before the lock's validity ends, unless a
    /// renewal extended it by then, and SIGKILL when it ends [default: 5s, or half of what
    /// a short TTL leaves].
    #[arg(long, env = "REDLOCK_GRACE", value_parser = duration, value_name = "DURATION")]
    pub grace: Option<Duration>,
    /// Take one of K permits of the semaphore KEY instead of the lock KEY: at most K
    /// commands run at once under that name. The command gets the permit's number
    /// (1..=K) as REDLOCK_PERMIT; every caller must give the same K.
    #[arg(long, env = "REDLOCK_PERMITS", value_name = "K", value_parser = clap::value_parser!(u32).range(1..=i64::from(redlock_client::MAX_PERMITS)))]
    pub permits: Option<u32>,
    /// Take the read side of the read-write lock KEY instead of the lock KEY: shared with
    /// other readers, never with a writer.
    #[arg(long, conflicts_with_all = ["permits", "write"])]
    pub read: bool,
    /// Take the write side of the read-write lock KEY instead of the lock KEY: alone, and
    /// new readers wait while it waits.
    #[arg(long, conflicts_with = "permits")]
    pub write: bool,
    /// The lock's key (or the semaphore's or read-write lock's name), without the prefix.
    pub key: String,
    /// The command and its arguments (after `--`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        // Any bytes, as a shell passes them (file names need not be UTF-8).
        value_parser = clap::value_parser!(std::ffi::OsString),
        value_name = "COMMAND"
    )]
    pub command: Vec<std::ffi::OsString>,
}

/// `redlock inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Inspect each of the K permits of the semaphore KEY (as `run --permits K` takes
    /// them): exits 0 when some permit is held, 1 when none is.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..=i64::from(redlock_client::MAX_PERMITS)))]
    pub permits: Option<u32>,
    /// Inspect both sides of the read-write lock KEY (its writer, then its live readers):
    /// exits 0 when either side is held, 1 when neither is.
    #[arg(long, conflicts_with = "permits")]
    pub rw: bool,
    /// The key (or the semaphore's or read-write lock's name), without the prefix.
    pub key: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `redlock nodes`.
#[derive(Debug, Args)]
pub struct NodesArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `redlock release`.
#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// The key, without the prefix.
    pub key: String,
    /// The holder's token (REDLOCK_TOKEN in its environment). Deliberately not read from
    /// the environment: inside `redlock run`, REDLOCK_TOKEN is the running lock's own.
    #[arg(long, value_name = "TOKEN")]
    pub token: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `redlock fence`.
#[derive(Debug, Args)]
pub struct FenceArgs {
    /// Raise every node's counter to at least N (the highest token the protected resources
    /// have accepted, 1 to 2^53) and to at least the highest counter any node has, then
    /// show them.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=redlock_client::redlock_core::MAX_FENCING_COUNTER))]
    pub raise_to: Option<u64>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// A duration written as humantime text (`30s`, `500ms`, `1m 30s`).
fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{e}; write a duration such as 30s, 500ms or 1m 30s"))
}

/// A wait: a duration, or `forever` (a wait too long to represent is no limit for the
/// library's retry policy).
fn wait(text: &str) -> Result<Duration, String> {
    match text {
        "forever" | "infinity" => Ok(Duration::MAX),
        _ => duration(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_takes_the_command_after_the_key() {
        let cli = Cli::try_parse_from([
            "redlock", "run", "--ttl", "5s", "job", "--", "ls", "-la", "--color",
        ])
        .unwrap();
        let Command::Run(run) = cli.command else {
            panic!("not run")
        };
        assert_eq!(run.key, "job");
        assert_eq!(run.command, ["ls", "-la", "--color"]);
        assert_eq!(run.ttl, Some(Duration::from_secs(5)));
        assert_eq!(run.grace, None);
    }

    #[test]
    fn durations_and_waits() {
        assert_eq!(duration("1m 30s"), Ok(Duration::from_secs(90)));
        assert!(duration("30 parsecs").unwrap_err().contains("such as 30s"));
        assert_eq!(wait("forever"), Ok(Duration::MAX));
        assert_eq!(wait("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn nodes_are_global() {
        let cli = Cli::try_parse_from([
            "redlock",
            "inspect",
            "k",
            "--nodes",
            "redis://a:1,redis://b:2",
        ])
        .unwrap();
        assert_eq!(cli.common.nodes.as_deref(), Some("redis://a:1,redis://b:2"));
    }
}
