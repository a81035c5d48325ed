//! Errors: invalid input, and rounds that did not reach their goal.

use std::time::Duration;

use crate::report::{NodeName, RoundReport};

/// A configuration value that cannot work: nothing was connected, or, for the checks made at
/// connect (duplicate servers, node health, refused commands), the connections were closed
/// again. Each message names the value and what to change.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// No node URLs were given.
    #[error(
        "no Redis nodes configured: give the URLs of N independent masters (N = 3 or 5 is typical)"
    )]
    NoNodes,
    /// A node URL could not be used.
    #[error("node URL `{url}` is not usable: {reason}; write it as redis://[user:password@]host:port[/db]")]
    InvalidUrl {
        /// The URL, with any password masked.
        url: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The same server (and database) appears twice.
    #[error("node `{node}` is listed twice: each node must be a distinct, independent master, or one server would cast two votes")]
    DuplicateNode {
        /// The repeated node, with any password masked.
        node: String,
    },
    /// Two node URLs lead to one Redis server, found at connect by the server's identity
    /// (the `run_id` of `INFO server`) rather than by the URL text.
    ///
    /// This catches what the URL check cannot: other host names or addresses of one server
    /// (`redis://127.0.0.1:6379` and `redis://localhost:6379`), and other databases of one
    /// server (`/0` and `/1`): one server process is one failure domain, so all its
    /// databases together count as one node, never as several votes.
    ///
    /// Only nodes reachable at connect can be identified: a node that is down then, or
    /// that refuses the connection (wrong password, bad database), is not checked, and a
    /// warning names it.
    #[error("nodes `{first}` and `{second}` are the same Redis server (same run_id): each node must be a distinct, independent master (not another address, name or database of the same server), or one server would cast two votes")]
    DuplicateServer {
        /// The first node, in configuration order, with any password masked.
        first: String,
        /// The later node that reached the same server, with any password masked.
        second: String,
    },
    /// The per-node timeout is zero.
    #[error("the per-node timeout is zero: set it to a few times the network round trip (for example 50ms)")]
    ZeroNodeTimeout,
    /// The per-node timeout exceeds [`MAX_NODE_TIMEOUT`](crate::MAX_NODE_TIMEOUT).
    #[error("the per-node timeout of {timeout:?} is longer than the maximum {max:?}: a node slower than a few round trips should count as failed; use a few times the network round trip (for example 50ms)")]
    NodeTimeoutTooLong {
        /// The rejected timeout.
        timeout: Duration,
        /// The maximum.
        max: Duration,
    },
    /// The reconnection delay is zero.
    #[error("the maximum reconnection delay is zero: set it to at least a few milliseconds (for example 1s)")]
    ZeroReconnectDelay,
    /// The drift factor is outside `[0, 1)`.
    #[error("drift factor {factor:?} is outside [0, 1): use a small fraction such as 0.01 (1 % of the TTL)")]
    DriftFactor {
        /// The rejected factor.
        factor: f64,
    },
    /// The fair queues' or the semaphores' prefix holds a brace, which could make a hash
    /// tag of its own (see `redlock_core::layout`).
    #[error("the setting `{setting}` = {prefix:?} holds a brace: a key under it takes its hash tag from its lock key or semaphore name, so use a prefix without '{{' or '}}'")]
    PrefixHashTag {
        /// Which prefix (`fair_prefix`, `semaphore_prefix`).
        setting: &'static str,
        /// The prefix.
        prefix: String,
    },
    /// The release notification channel is empty.
    #[error("the release notification channel is empty: name a channel, or set it to None to publish nothing")]
    EmptyChannel,
    /// A TLS setting cannot be used: a file that cannot be read, PEM without a certificate
    /// or key, settings given twice or half. Never quotes a key.
    #[error("TLS setting not usable: {what} {reason}")]
    Tls {
        /// Which setting.
        what: String,
        /// What is wrong, and what to do.
        reason: String,
    },
    /// TLS settings were given but no node URL uses TLS: the connections would not be
    /// encrypted.
    #[error("TLS settings are given, but no node URL uses TLS: write the nodes as rediss://host:port (plain redis:// connections are not encrypted), or remove the TLS settings")]
    TlsUnused,
    /// A node breaks the algorithm's assumptions and the configuration asks to refuse
    /// such nodes ([`HealthPolicy::Strict`](crate::HealthPolicy::Strict)).
    #[error("node `{node}` breaks the algorithm's assumptions: {problems}; fix its settings, or set the health policy to warn")]
    UnhealthyNode {
        /// The node, with any password masked.
        node: String,
        /// Each problem and what to do about it.
        problems: String,
    },
    /// So many of the nodes that answered refuse the commands the lock runs its scripts
    /// with (`EVALSHA`, `EVAL`: an ACL user without them, or a server that renamed them
    /// away) that the others cannot make a quorum: no lock could ever be released. Found by
    /// the health check at connect under every policy but
    /// [`HealthPolicy::Off`](crate::HealthPolicy::Off), before any lock is taken.
    #[error("nodes {} refuse {} ({reply}): the lock runs its releases and most acquisitions as scripts, and the other nodes cannot make a quorum; grant the nodes' user {} (and `+script|load`), or `+@scripting`", nodes.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", "), commands.join(", "), commands.iter().map(|c| format!("`+{}`", c.to_ascii_lowercase())).collect::<Vec<_>>().join(" "))]
    CommandsRefused {
        /// The nodes that refuse them, with any password masked.
        nodes: Vec<String>,
        /// The commands refused (`EVALSHA`, `EVAL`).
        commands: Vec<String>,
        /// What the first of those nodes answered.
        reply: String,
    },
    /// The Redis client for a node could not be created.
    #[error("could not create the client for node `{node}`: {reason}")]
    Client {
        /// The node, with any password masked.
        node: String,
        /// fred's explanation.
        reason: String,
    },
    /// A setting that names a key (the fencing counter's key, the fair queues' prefix)
    /// holds one that no lock could use.
    #[error(
        "the setting `{setting}` cannot work: {}",
        key_setting_problem(problem)
    )]
    Setting {
        /// Which setting.
        setting: &'static str,
        /// What is wrong with its value ([`ArgumentError::EmptyKey`] or
        /// [`ArgumentError::KeyTooLong`]).
        problem: ArgumentError,
    },
}

/// What is wrong with a setting's key, in words about the setting: the key checker's own
/// message speaks of a lock's key.
fn key_setting_problem(problem: &ArgumentError) -> String {
    match problem {
        ArgumentError::EmptyKey => "it is empty: set it, or leave it at its default".to_owned(),
        ArgumentError::KeyTooLong { len, max } => {
            format!("it is {len} bytes long, more than the maximum {max}: shorten it")
        }
        other => other.to_string(),
    }
}

/// A request argument that cannot work: a key, a TTL, a token, an owner, a fair place or a
/// fencing counter given to one call. Nothing was sent to any node. Each message names the
/// value and what to change.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ArgumentError {
    /// An owner that holds a read-write lock's read side asked for its write side.
    #[error("the read side of `{name}` is held by the owner that asks for its write side: read-write locks do not upgrade (two readers that both upgraded would wait for each other for ever); release the read side first, then take the write side")]
    Upgrade {
        /// The read-write lock's name.
        name: String,
    },
    /// A semaphore's number of permits is zero or above
    /// [`MAX_PERMITS`](crate::MAX_PERMITS).
    #[error("a semaphore of {permits} permits cannot be taken: give it from 1 to {max} permits (every round proposes each of them to every node)")]
    Permits {
        /// The number given.
        permits: u32,
        /// The most accepted.
        max: u32,
    },
    /// The TTL is zero (or below one millisecond, the precision of `PX`).
    #[error("the lock TTL is zero (or under 1ms): give the lock a lifetime, for example 10s")]
    ZeroTtl,
    /// The TTL exceeds [`MAX_TTL`](crate::MAX_TTL).
    #[error("the lock TTL of {ttl:?} is longer than the maximum {max:?}: locks are leases; use a shorter TTL and extend it while you work")]
    TtlTooLong {
        /// The rejected TTL.
        ttl: Duration,
        /// The maximum.
        max: Duration,
    },
    /// The TTL leaves no validity once drift and one node timeout are taken off.
    #[error("the lock TTL of {ttl:?} leaves no validity: the drift allowance ({drift:?}) plus one per-node timeout ({node_timeout:?}) use it all; use a TTL many times the node timeout, or a shorter node timeout")]
    TtlTooShort {
        /// The rejected TTL.
        ttl: Duration,
        /// The drift allowance for that TTL.
        drift: Duration,
        /// The configured per-node timeout.
        node_timeout: Duration,
    },
    /// A fenced acquisition on a node set with a member that is a whole cluster, whose
    /// fence key has no hash tag: the counter's companions (its stamp, a repair's marker)
    /// would fall in other hash slots than the counter, and a script may only name keys of
    /// one slot there.
    #[error("fencing with a cluster member (`{node}`) needs a fence key with a hash tag, such as `{{{fence_key}}}`, not `{fence_key}`, so that the counter and its companions share a slot; change it only on a node set that has handed out no token yet, or raise the new counters past the highest token after (`redlock fence --raise-to`)")]
    FencingOnCluster {
        /// The cluster member.
        node: String,
        /// The fence key configured.
        fence_key: String,
    },
    /// The key is empty.
    #[error("the lock key is empty: name the resource the lock protects")]
    EmptyKey,
    /// The key is longer than [`MAX_KEY_LEN`](crate::MAX_KEY_LEN).
    #[error("the lock key is {len} bytes long, more than the maximum {max}: hash long resource names into a shorter key")]
    KeyTooLong {
        /// The key's length in bytes.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// A lock over several keys was requested with none.
    #[error("no keys given: a lock over several keys needs at least one")]
    NoKeys,
    /// A key appears twice in one lock.
    #[error("key `{key}` appears twice in one lock: list each resource once")]
    DuplicateKey {
        /// The repeated key.
        key: String,
    },
    /// A caller-given token cannot be stored and recognised safely.
    #[error("the lock token is not usable: {reason}; use Token::random(), or a unique value of printable characters without spaces (and, to acquire with, without '~')")]
    InvalidToken {
        /// What is wrong with it.
        reason: String,
    },
    /// A reentrant lock was requested over several keys.
    #[error("a reentrant lock takes exactly one key, not {count}: lock several keys with a plain lock over all of them")]
    ReentrantKeys {
        /// How many keys were given.
        count: usize,
    },
    /// A lock key is the name of the node set's fencing counter, or starts with the prefix
    /// of the fair queues' keys.
    #[error(
        "the lock key `{key}` is reserved for the fencing counter or the fair queues: name the lock differently"
    )]
    ReservedKey {
        /// The key.
        key: String,
    },
    /// A fair acquisition's place cannot be queued: its waiter id is empty or has white
    /// space or `~`, or its patience is zero or longer than [`MAX_TTL`](crate::MAX_TTL).
    #[error("a fair acquisition's place cannot be queued: {problem}")]
    FairPlace {
        /// What is wrong with it.
        problem: FairPlaceProblem,
    },
    /// A reentrant lock was requested with an empty owner.
    #[error(
        "the owner of a reentrant lock is empty: give each owner a unique, non-empty identity"
    )]
    EmptyOwner,
    /// A fencing counter to raise to is zero or above [`MAX_FENCING_COUNTER`] (2^53: Redis
    /// scripts compare numbers as doubles, exact only up to there).
    ///
    /// [`MAX_FENCING_COUNTER`]: crate::MAX_FENCING_COUNTER
    #[error("cannot raise the fencing counters to {value}: give the highest token the protected resources have accepted, from 1 to 2^53 (9007199254740992)")]
    FencingCounter {
        /// The value given.
        value: u64,
    },
}

/// What makes a fair acquisition's place (`support::FairPlace`) unusable
/// ([`ArgumentError::FairPlace`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FairPlaceProblem {
    /// The waiter id is empty.
    #[error("the waiter id is empty: give each waiter a unique, non-empty id")]
    EmptyWaiter,
    /// The waiter id has white space.
    #[error("the waiter id has white space: use an id without spaces, tabs or line breaks")]
    WhiteSpace,
    /// The waiter id has `~`, which separates a waiter id from its hand-over number.
    #[error("the waiter id has '~', which marks hand-over tokens: use an id without it")]
    HandoverMark,
    /// The patience is zero.
    #[error("the patience is zero: give waiters at least a millisecond (the queue entry expires after it)")]
    ZeroPatience,
    /// The patience is past the longest expiry the nodes accept.
    #[error(
        "the patience {patience:?} is longer than the most the nodes accept, {max:?}: wait less"
    )]
    PatienceTooLong {
        /// The patience asked for.
        patience: std::time::Duration,
        /// The longest accepted ([`MAX_TTL`](crate::MAX_TTL)).
        max: std::time::Duration,
    },
}

/// Why a round failed. Rounds never panic and never report success without a quorum.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Invalid configuration; nothing was sent.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// An argument of this call cannot work; nothing was sent.
    #[error(transparent)]
    Argument(#[from] ArgumentError),
    /// Fewer than a quorum of nodes accepted. For an acquisition, everything that was set
    /// has been (or is being) rolled back on every node.
    #[error("{report}; {}", report.advice())]
    NoQuorum {
        /// What each node answered.
        report: Box<RoundReport>,
    },
    /// A quorum accepted, but the round took so long that no validity was left once the
    /// drift allowance was taken off. An acquisition is rolled back; an extension leaves
    /// the lock with the validity it had before.
    #[error("{report}; the round used up the whole TTL of {ttl:?}: use a longer TTL or a shorter node timeout, and look for slow nodes in the report")]
    ValidityExhausted {
        /// What each node answered.
        report: Box<RoundReport>,
        /// The TTL the round asked for.
        ttl: Duration,
    },
    /// A fenced acquisition won its lock but could not hand out a fencing token: too few
    /// nodes had a counter, the write-back did not reach a quorum, or the lock's validity
    /// ran out meanwhile. The lock has been released again; retrying is safe (a later
    /// round with a different quorum, or after a new node set's first write-back reached
    /// the nodes, succeeds).
    #[error("{report}; the lock was won but no fencing token could be issued: {reason}; it was released again: retry (redlock-client's `lock` does this)")]
    NotFenced {
        /// The round that failed: the acquisition, or the token's write-back.
        report: Box<RoundReport>,
        /// What was missing.
        reason: String,
    },
    /// A fenced acquisition won its lock, but no fencing token can be issued until an
    /// operator acts: every node answered, and fewer than a quorum have a fencing counter
    /// beside some that have one. A quorum lost its counters at once (restarts without
    /// persistence, `FLUSHALL`, evictions; losses of fewer nodes at a time are repaired
    /// in the background), and the highest token handed out may be gone
    /// with them: starting again lower would let a stale holder's writes through. The lock
    /// has been released again. Retrying does not help (redlock-client's `lock` returns
    /// this at once): raise every node's counter to at least the highest token the
    /// protected resources have accepted, with
    /// [`Coordinator::raise_fencing_counters`](crate::Coordinator::raise_fencing_counters)
    /// or `redlock fence --raise-to N`.
    ///
    /// A new node set whose first token's write-back reached fewer than a quorum before
    /// that acquisition gave up ends in the same state (nothing tells it from a loss), and
    /// is mended the same way.
    #[error("{report}; the lock was won but no fencing token can be issued: {seeded} node(s) have a fencing counter and {missing} have none ({}), fewer than a quorum: a quorum lost its counters at once (restarts without persistence, FLUSHALL, evictions; or a new node set's first write-back reached too few nodes) and the highest token handed out may be gone with them; the lock is released again. Retrying does not help: raise every node's counter to at least the highest token your protected resources have accepted (`redlock fence --raise-to N`, or Coordinator::raise_fencing_counters)", names(missing_on))]
    FencingCountersLost {
        /// The acquisition round.
        report: Box<RoundReport>,
        /// Nodes that have a counter.
        seeded: usize,
        /// Nodes that have none.
        missing: usize,
        /// Which nodes have none (their masked URLs), as the last read found them.
        missing_on: Vec<NodeName>,
    },
    /// A fenced acquisition won its lock and recorded a token on a quorum, but that token
    /// is not above one this coordinator handed out before the acquisition began: the
    /// nodes' counters went back (more nodes lost their counters at once than `N - quorum`,
    /// so that every node answered without one and tokens started again at 1, or counters
    /// were lowered by hand). Handing it out would let a stale holder's writes through at
    /// a resource that has seen the higher token. The lock has been released again.
    /// Retrying does not help: raise every node's counter to at least the highest token the
    /// protected resources have accepted (`redlock fence --raise-to N`).
    #[error("{report}; the lock was won but its fencing token {token} is not above {handed_out}, a token this client already handed out: the nodes' fencing counters went back (more nodes lost their counters at once than the quorum allows, or they were lowered by hand); the lock is released again. Retrying does not help: raise every node's counter to at least the highest token your protected resources have accepted (`redlock fence --raise-to N`, or Coordinator::raise_fencing_counters)")]
    FencingTokenBehind {
        /// The token's write-back.
        report: Box<RoundReport>,
        /// The token the nodes gave.
        token: u64,
        /// The highest token this coordinator handed out before.
        handed_out: u64,
    },
}

impl Error {
    /// The per-node report of the round, when a round was run.
    pub fn report(&self) -> Option<&RoundReport> {
        match self {
            Error::Config(_) | Error::Argument(_) => None,
            Error::NoQuorum { report }
            | Error::ValidityExhausted { report, .. }
            | Error::NotFenced { report, .. }
            | Error::FencingCountersLost { report, .. }
            | Error::FencingTokenBehind { report, .. } => Some(report),
        }
    }
}

/// Node names as a message lists them.
fn names(nodes: &[NodeName]) -> String {
    let names: Vec<&str> = nodes.iter().map(NodeName::as_str).collect();
    names.join(", ")
}
