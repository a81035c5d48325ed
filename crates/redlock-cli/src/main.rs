//! `redlock`: Redlock locks from the command line, in the spirit of `flock(1)`,
//! `consul lock` and `etcdctl lock`. See the crate README for the commands, the exit codes
//! and the environment variables.
//!
//! Module map: `cli` (arguments), `settings` (flags > environment > file > defaults),
//! `run` and `child` (the locked command), `inspect`, `nodes`, `release`, `fence`, `console`
//! (progress and logs on stderr), `error` and `exit` (what went wrong, and the exit code).
#![forbid(unsafe_code)]
#![deny(missing_docs, missing_debug_implementations)]

mod child;
mod cli;
mod console;
mod error;
mod exit;
mod fence;
mod inspect;
mod nodes;
mod release;
mod run;
mod settings;

use std::process::ExitCode;

use clap::Parser;
use redlock_client::{HealthPolicy, LockConfig, Redlock};

use crate::cli::{Cli, Command};
use crate::console::Console;
use crate::error::CliError;
use crate::exit::Exit;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // clap exits 2 on a usage error; ours is 64 (EX_USAGE), and help is no error.
            let _ = e.print();
            return if e.use_stderr() {
                Exit::Usage
            } else {
                Exit::Success
            }
            .into();
        }
    };
    console::init_tracing(cli.common.quiet, cli.common.verbose);
    let console = Console::new(cli.common.quiet);
    // Two worker threads: the command does the work; redlock only waits, renews and
    // passes signals on.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            console.error(CliError::Setup(e));
            return Exit::Unavailable.into();
        }
    };
    let exit = runtime.block_on(dispatch(cli, console));
    match exit {
        Ok(exit) => exit.into(),
        Err(e) => {
            console.error(&e);
            e.exit().into()
        }
    }
}

async fn dispatch(cli: Cli, console: Console) -> Result<Exit, CliError> {
    let config = settings::load(&cli.common)?;
    let config = match &cli.command {
        Command::Run(args) => settings::for_run(config, args)?,
        // This command reports the health check itself; the one at connect would only say
        // it twice, as log lines.
        Command::Nodes(_) => LockConfig {
            health: HealthPolicy::Off,
            notify: false,
            ..config
        },
        // Nothing to wait for, so no wake-up subscribers. A release keeps them: with
        // `notify`, it is what publishes the release and wakes other clients' waiters.
        Command::Inspect(_) | Command::Fence(_) => LockConfig {
            notify: false,
            ..config
        },
        Command::Release(_) => config,
    };
    let client = connect(config).await?;
    let exit = match &cli.command {
        Command::Run(args) => run::run(&client, args, console).await,
        Command::Inspect(args) => inspect::inspect(&client, args).await,
        Command::Nodes(args) => Ok(nodes::nodes(&client, args).await),
        Command::Release(args) => release::release(&client, args).await,
        Command::Fence(args) => fence::fence(&client, args).await,
    };
    // Waits (bounded) for background work such as rollbacks, so nothing is left behind.
    client.shutdown().await;
    exit
}

/// Connects; nodes that are down do not fail this (see `Redlock::connect`), only a
/// configuration that cannot work does.
async fn connect(config: LockConfig) -> Result<Redlock, CliError> {
    tracing::debug!(?config, "connecting");
    Redlock::connect(config)
        .await
        .map_err(|e| CliError::from_lock("connecting", e))
}

#[cfg(test)]
mod tests {
    /// Built as the README says (`cargo install --path crates/redlock-cli`, no features
    /// named), the command reaches TLS and unix-socket nodes. Built without either, it
    /// would refuse every `rediss://` node of a service's configuration file, and only a
    /// workspace build (whose test package turns both on) would hide that.
    #[test]
    fn the_command_is_built_with_tls_and_unix_sockets_by_default() {
        let built = [
            ("tls", cfg!(feature = "tls")),
            ("unix-sockets", cfg!(feature = "unix-sockets")),
        ];
        for (feature, on) in built {
            assert!(on, "built without `{feature}`");
        }
    }
}
