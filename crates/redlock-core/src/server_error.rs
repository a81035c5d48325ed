//! Error replies from a node, sorted by what a person must do about them.
//!
//! Redis answers a refused command with a code (`NOAUTH`, `NOPERM`, `OOM`, `READONLY`, ...)
//! and a message; inside a script, Redis 7 keeps the code of the failing call and appends
//! where in the script it failed. [`ServerError`] keeps the node's own words, the command
//! that was refused, and its [`ServerErrorKind`], whose advice says what to change.

use std::borrow::Cow;
use std::fmt;

/// What kind of error reply a node gave. Each kind has its own [`advice`](Self::advice).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ServerErrorKind {
    /// The server refused the credentials: `NOAUTH` (it needs a password and none was
    /// given), `WRONGPASS`, or a password given to a server that has none.
    Auth,
    /// The ACL user may not run the command or touch the key or channel (`NOPERM`, or a
    /// script's call refused by the ACL).
    Permission,
    /// The server is at `maxmemory` with a policy that refuses writes (`OOM`).
    OutOfMemory,
    /// The node is a read-only replica (`READONLY`): Redlock needs masters.
    ReadOnly,
    /// A key of another type sits under the lock's name (`WRONGTYPE`).
    WrongType,
    /// The server refused the database of the URL (`SELECT`: index out of range).
    Database,
    /// The server is not ready (`LOADING` its data, `BUSY` with a script, `MASTERDOWN`,
    /// `TRYAGAIN`): transient.
    NotReady,
    /// The server cannot persist and refuses writes (`MISCONF`).
    Persistence,
    /// The node did not know the lock's script (`NOSCRIPT`: it restarted, or its scripts
    /// were flushed) and nothing ran. An acquisition is refused rather than sent again with
    /// the script's source, which could run after a later release of the lock; the scripts
    /// are loaded again at once: transient.
    ScriptNotLoaded,
    /// Not a reply: the node is the same Redis server (the same `run_id`) as a node that
    /// votes (another name, address or database of it), found when it was identified after
    /// start-up (it was down then, or reconnected since). Nothing is sent to it: one server
    /// casts one vote.
    SameServer,
    /// Not a reply: the node could not be identified at start-up (down, or `INFO`
    /// unanswered) and has not been since (is it another node's server?): it is as soon
    /// as it is connected. Nothing was sent: transient, like [`NotReady`](Self::NotReady).
    NotIdentified,
    /// Not a reply: a cluster member's master sent the command on to another (`MOVED` or
    /// `ASK`: a slot moved, or a replica was promoted). fred learns the cluster's slots
    /// again and would write the command a second time, which a round never does (a
    /// command written twice can run twice), so nothing ran. A release, an extension or a
    /// read is sent once more, to the slot's master now; an acquisition is not (it could
    /// run after a later release of the lock) and counts as failed there this round:
    /// transient.
    Redirected,
    /// Not a reply: a cluster member's master ran an acquisition or an extension, but
    /// fewer of its replicas than `Config::replica_acks` acknowledged it in time (`WAIT`).
    /// A failover now could promote a replica without it, so the member's vote does not
    /// count, and an acquisition is rolled back there: transient, unless the master has
    /// too few replicas.
    NotReplicated,
    /// Any other error reply, or a reply the lock does not understand.
    Unknown,
}

impl ServerErrorKind {
    /// Sorts an error reply by its code: the first word, or, for an error raised inside a
    /// script, the code Redis kept from the failing call.
    pub fn classify(message: &str) -> ServerErrorKind {
        let upper = message.trim().to_ascii_uppercase();
        let first = upper.split_whitespace().next().unwrap_or("");
        let by_code = |code: &str| match code {
            "NOAUTH" | "WRONGPASS" => Some(ServerErrorKind::Auth),
            "NOPERM" => Some(ServerErrorKind::Permission),
            "OOM" => Some(ServerErrorKind::OutOfMemory),
            "READONLY" => Some(ServerErrorKind::ReadOnly),
            "WRONGTYPE" => Some(ServerErrorKind::WrongType),
            "LOADING" | "BUSY" | "MASTERDOWN" | "TRYAGAIN" => Some(ServerErrorKind::NotReady),
            "MISCONF" => Some(ServerErrorKind::Persistence),
            "NOSCRIPT" => Some(ServerErrorKind::ScriptNotLoaded),
            _ => None,
        };
        if let Some(kind) = by_code(first) {
            return kind;
        }
        if upper.contains("DB INDEX") || upper.contains("SELECT IS NOT ALLOWED") {
            return ServerErrorKind::Database;
        }
        if upper.contains("CAN'T RUN THIS COMMAND") || upper.contains("NO PERMISSIONS") {
            // A script's call refused by the ACL (Redis 7: "ERR The user executing the
            // script can't run this command or subcommand").
            return ServerErrorKind::Permission;
        }
        if upper.contains("AUTH")
            && (upper.contains("PASSWORD") || upper.contains("WITHOUT ANY PASSWORD"))
        {
            // "ERR AUTH <password> called without any password configured", "invalid
            // password" from older servers.
            return ServerErrorKind::Auth;
        }
        // A code kept inside a longer message (an older server's script error wraps it).
        upper
            .split(|c: char| !c.is_ascii_alphabetic())
            .find_map(by_code)
            .unwrap_or(ServerErrorKind::Unknown)
    }

    /// Whether retrying cannot clear an error of this kind: it takes a change to the node,
    /// its URL, its ACL or the key (credentials, permissions, a replica, a key of another
    /// type, a database index). `NotReady`, `OutOfMemory`, `Persistence`, `ScriptNotLoaded`
    /// and `Unknown` may pass by themselves.
    pub fn needs_a_change(self) -> bool {
        matches!(
            self,
            ServerErrorKind::Auth
                | ServerErrorKind::Permission
                | ServerErrorKind::ReadOnly
                | ServerErrorKind::WrongType
                | ServerErrorKind::Database
                | ServerErrorKind::SameServer
        )
    }

    /// What to do about an error of this kind, in one sentence.
    pub fn advice(self) -> &'static str {
        match self {
            ServerErrorKind::Auth => {
                "check the user name and password in the node URL against the server's \
                 `requirepass` or ACL users"
            }
            ServerErrorKind::Permission => {
                "the ACL user lacks a permission the lock needs: grant the key and channel \
                 patterns of the key prefix (`~<prefix>* &<prefix>*`) and the commands of the \
                 README's ACL line (the lock's commands and those its scripts call)"
            }
            ServerErrorKind::OutOfMemory => {
                "the node is at `maxmemory` and refuses writes: raise `maxmemory`, free memory, \
                 or keep lock keys on nodes of their own (their policy must stay `noeviction`)"
            }
            ServerErrorKind::ReadOnly => {
                "the node is a read-only replica: list only independent masters (Redlock \
                 needs no replication between its nodes)"
            }
            ServerErrorKind::WrongType => {
                "a key of another type holds the lock's name: another application uses this \
                 key; choose another key prefix or key"
            }
            ServerErrorKind::Database => {
                "check the database number in the node URL against the server's `databases` \
                 setting"
            }
            ServerErrorKind::NotReady => {
                "the node is loading its data or busy: it counts as failed until it is \
                 ready; retry"
            }
            ServerErrorKind::Persistence => {
                "the node cannot persist (`MISCONF`) and refuses writes: fix its disk or \
                 persistence settings"
            }
            ServerErrorKind::ScriptNotLoaded => {
                "the node had forgotten the lock's scripts (it restarted, or they were \
                 flushed) and ran nothing; they are being loaded again: retry"
            }
            ServerErrorKind::NotIdentified => {
                "the node was not identified at start-up and is checked not to be another \
                 node's server as soon as it is connected; it counts as failing until then: \
                 retry"
            }
            ServerErrorKind::Redirected => {
                "a slot of the cluster member moved to another master (a resharding or a \
                 failover); its commands go there from now on: retry"
            }
            ServerErrorKind::NotReplicated => {
                "the cluster member's master has fewer replicas in sync than `replica_acks` \
                 asks for (down, lagging, or too few configured): bring them back, or lower \
                 `replica_acks`"
            }
            ServerErrorKind::SameServer => {
                "two node URLs reach this one server (another address, name or database of \
                 it), which would cast two votes, so the later casts none: list each \
                 independent master once"
            }
            ServerErrorKind::Unknown => {
                "see the node's message; check that the node is a Redis master of version 6.2 \
                 or later"
            }
        }
    }
}

impl fmt::Display for ServerErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ServerErrorKind::Auth => "authentication failed",
            ServerErrorKind::Permission => "permission denied",
            ServerErrorKind::OutOfMemory => "out of memory",
            ServerErrorKind::ReadOnly => "read-only replica",
            ServerErrorKind::WrongType => "wrong key type",
            ServerErrorKind::Database => "database refused",
            ServerErrorKind::NotReady => "not ready",
            ServerErrorKind::Persistence => "cannot persist",
            ServerErrorKind::ScriptNotLoaded => "script not loaded",
            ServerErrorKind::SameServer => "same server as another node",
            ServerErrorKind::NotIdentified => "not identified yet",
            ServerErrorKind::Redirected => "redirected to another master",
            ServerErrorKind::NotReplicated => "not acknowledged by enough replicas",
            ServerErrorKind::Unknown => "error reply",
        })
    }
}

/// An error reply from a node: its kind, the command it refused and the node's own words.
///
/// Shown as `SET refused (out of memory): OOM command not allowed ...: <advice>`. Any
/// password the message might echo has been masked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerError {
    /// What kind of error it is.
    pub kind: ServerErrorKind,
    /// The command the node refused (`SET`, `EVALSHA`, ...), or `connect` when it refused
    /// the connection's handshake (a wrong or missing password, a database out of range).
    pub command: Cow<'static, str>,
    /// The node's message.
    pub message: String,
}

impl ServerError {
    /// An error reply to `command`, sorted by its message.
    pub fn new(command: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        let message = message.into();
        ServerError {
            kind: ServerErrorKind::classify(&message),
            command: command.into(),
            message,
        }
    }

    /// An error of a known kind.
    pub fn of_kind(
        kind: ServerErrorKind,
        command: impl Into<Cow<'static, str>>,
        message: impl Into<String>,
    ) -> Self {
        ServerError {
            kind,
            command: command.into(),
            message: message.into(),
        }
    }

    /// What to do about it.
    pub fn advice(&self) -> &'static str {
        self.kind.advice()
    }
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} refused ({}): {}: {}",
            self.command,
            self.kind,
            self.message.trim(),
            self.advice()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replies as redis-server 7.0 words them.
    #[test]
    fn replies_of_a_real_server_are_sorted_by_their_code() {
        use ServerErrorKind::*;
        for (message, kind) in [
            ("NOAUTH Authentication required.", Auth),
            (
                "WRONGPASS invalid username-password pair or user is disabled.",
                Auth,
            ),
            (
                "ERR AUTH <password> called without any password configured for the default \
                 user. Are you sure your configuration is correct?",
                Auth,
            ),
            (
                "NOPERM this user has no permissions to run the 'set' command",
                Permission,
            ),
            (
                "NOPERM this user has no permissions to access one of the keys used as arguments",
                Permission,
            ),
            (
                "ERR The user executing the script can't run this command or subcommand script: \
                 131b5f2ed4a6e4f431cc21897ae043d687859f08, on @user_script:1.",
                Permission,
            ),
            (
                "OOM command not allowed when used memory > 'maxmemory'.",
                OutOfMemory,
            ),
            (
                "OOM command not allowed when used memory > 'maxmemory'. script: 5a394d, on \
                 @user_script:1.",
                OutOfMemory,
            ),
            (
                "READONLY You can't write against a read only replica.",
                ReadOnly,
            ),
            (
                "WRONGTYPE Operation against a key holding the wrong kind of value script: \
                 a6460c, on @user_script:1.",
                WrongType,
            ),
            ("ERR DB index is out of range", Database),
            ("LOADING Redis is loading the dataset in memory", NotReady),
            ("BUSY Redis is busy running a script.", NotReady),
            (
                "MISCONF Redis is configured to save RDB snapshots, but it's currently unable \
                 to persist to disk.",
                Persistence,
            ),
            (
                "ERR Error running script (call to f_1): @user_script:1: @user_script:1: \
                 READONLY You can't write against a read only replica.",
                ReadOnly,
            ),
            (
                "NOSCRIPT No matching script. Please use EVAL.",
                ScriptNotLoaded,
            ),
            ("ERR unknown command 'EVALSHA'", Unknown),
            ("", Unknown),
        ] {
            assert_eq!(ServerErrorKind::classify(message), kind, "{message}");
        }
    }

    #[test]
    fn the_text_names_the_command_the_kind_and_what_to_do() {
        let e = ServerError::new(
            "SET",
            "OOM command not allowed when used memory > 'maxmemory'.",
        );
        assert_eq!(e.kind, ServerErrorKind::OutOfMemory);
        let text = e.to_string();
        assert!(
            text.starts_with("SET refused (out of memory): OOM"),
            "{text}"
        );
        assert!(text.contains("raise `maxmemory`"), "{text}");
    }
}
