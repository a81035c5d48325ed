//! What the checker reports: one [`Violation`] per broken rule, with what a reader needs to
//! find it in the history.

use std::fmt;
use std::time::Duration;

use super::{ms, short, Fenced, Holder, Leftover};
use crate::history::At;

/// One safety violation.
#[derive(Clone, Debug, PartialEq)]
pub enum Violation {
    /// Two different holders claimed the same key at the same time.
    Overlap {
        /// The earlier holder.
        first: Holder,
        /// The later holder.
        second: Holder,
        /// How long both claimed the key.
        both_for: Duration,
    },
    /// A write to the protected value was based on a stale read: an update was lost.
    LostUpdate {
        /// The writer whose write overwrote another.
        client: String,
        /// Its token.
        token: String,
        /// The value it read.
        read: u64,
        /// The value the previous write had produced.
        current: u64,
        /// When it wrote.
        at: At,
    },
    /// A holder wrote the protected value after its claim had ended.
    StaleWrite {
        /// The writer.
        client: String,
        /// Its token.
        token: String,
        /// When it wrote.
        at: At,
        /// When its claim ended (`None`: the token never won a lock).
        claim_ended: Option<At>,
    },
    /// A lock key remained on a node after the scenario.
    LeftBehind(Leftover),
    /// A holder's token vanished from a node while the holder still claimed the lock, with
    /// no injected fault to explain it: deleted by a non-owner, or expired early.
    RemovedEarly {
        /// The node's index.
        node: usize,
        /// The key.
        key: String,
        /// The holder whose token vanished.
        holder: Holder,
        /// Last seen present.
        seen_at: At,
        /// Seen gone (or replaced) by.
        gone_by: At,
    },
    /// A token's expiry moved later on a node while its owner was not extending it.
    ForeignExtend {
        /// The node's index.
        node: usize,
        /// The key.
        key: String,
        /// The token whose expiry moved.
        token: String,
        /// Between these two samples.
        between: (At, At),
        /// By how much the expiry moved.
        moved_by: Duration,
    },
    /// An acquisition got a fencing token lower than one handed out before it began: a
    /// resource that checks tokens would reject the newer holder, or (worse) accept the
    /// older one's writes after it.
    FencingBackwards {
        /// The acquisition that completed first, with the highest token before `later`.
        earlier: Fenced,
        /// The acquisition that began after it and got a lower token.
        later: Fenced,
    },
    /// Two acquisitions got the same fencing token: a resource cannot tell their writes
    /// apart.
    FencingReused {
        /// The first to be handed the token.
        first: Fenced,
        /// Another one handed the same token.
        second: Fenced,
    },
    /// A guard reported validity (after an extension or a renewal) beyond what more than
    /// `nodes - quorum` of the nodes still held for it: no quorum held the lock that long.
    ValidityOverstated {
        /// The client.
        client: String,
        /// The guard's token.
        token: String,
        /// When the guard was asked.
        at: At,
        /// The end of validity it reported.
        valid_until: At,
        /// The nodes that held the lock for less, each with the latest it could hold it.
        short_of: Vec<(usize, At)>,
    },
    /// More holders of a semaphore claimed at once than it has permits.
    TooManyHolders {
        /// The semaphore's name.
        semaphore: String,
        /// Its permits.
        permits: u32,
        /// When the holder that made one too many acquired.
        at: At,
        /// Every holder claiming then, in order of acquisition.
        holders: Vec<Holder>,
    },
    /// A writer of a read-write lock claimed it while a reader or another writer did.
    WriterNotAlone {
        /// The read-write lock's name.
        rwlock: String,
        /// When the later of the two claims began.
        at: At,
        /// The writer.
        writer: Holder,
        /// The reader or the other writer claiming then.
        other: Holder,
        /// Whether `other` is a reader.
        reader: bool,
    },
    /// A rule of one scenario was broken (e.g. a lock won while a majority was down).
    Rule(String),
}

impl Violation {
    /// A short category name for tables.
    pub fn category(&self) -> &'static str {
        match self {
            Violation::Overlap { .. } => "overlap",
            Violation::LostUpdate { .. } => "lost update",
            Violation::StaleWrite { .. } => "stale write",
            Violation::LeftBehind(_) => "key left behind",
            Violation::RemovedEarly { .. } => "token removed early",
            Violation::ForeignExtend { .. } => "foreign extend",
            Violation::FencingBackwards { .. } => "fencing token backwards",
            Violation::FencingReused { .. } => "fencing token reused",
            Violation::ValidityOverstated { .. } => "validity overstated",
            Violation::TooManyHolders { .. } => "too many holders",
            Violation::WriterNotAlone { .. } => "writer not alone",
            Violation::Rule(_) => "scenario rule",
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Overlap {
                first,
                second,
                both_for,
            } => write!(
                f,
                "overlap: {first} and {second} both held the lock for {}",
                ms(*both_for)
            ),
            Violation::LostUpdate {
                client,
                token,
                read,
                current,
                at,
            } => write!(
                f,
                "lost update: {client} (token {}) wrote {} at {} from a read of {read}, but the \
                 value was already {current}",
                short(token),
                read + 1,
                ms(*at)
            ),
            Violation::StaleWrite {
                client,
                token,
                at,
                claim_ended,
            } => stale_write(f, client, token, *at, *claim_ended),
            Violation::LeftBehind(l) => write!(
                f,
                "key left behind: {} on {} (value {:?}, pttl {} ms) after every client released \
                 and all faults were healed",
                l.key,
                l.node,
                l.value.as_deref().map(shown_value),
                l.pttl
            ),
            Violation::RemovedEarly {
                node,
                key,
                holder,
                seen_at,
                gone_by,
            } => removed_early(f, *node, key, holder, (*seen_at, *gone_by)),
            Violation::ForeignExtend {
                node,
                key,
                token,
                between,
                moved_by,
            } => write!(
                f,
                "foreign extend: the expiry of {key} (token {}) on node-{node} moved {} later \
                 between {} and {} while its owner was not extending it",
                short(token),
                ms(*moved_by),
                ms(between.0),
                ms(between.1)
            ),
            Violation::FencingBackwards { earlier, later } => write!(
                f,
                "fencing token backwards: {later}, but {earlier}, before it began"
            ),
            Violation::FencingReused { first, second } => {
                write!(f, "fencing token reused: {first}, and {second}")
            }
            Violation::ValidityOverstated {
                client,
                token,
                at,
                valid_until,
                short_of,
            } => validity_overstated(f, client, token, (*at, *valid_until), short_of),
            Violation::TooManyHolders {
                semaphore,
                permits,
                at,
                holders,
            } => too_many_holders(f, semaphore, *permits, *at, holders),
            Violation::WriterNotAlone {
                rwlock,
                at,
                writer,
                other,
                reader,
            } => write!(
                f,
                "writer not alone: read-write lock {rwlock}: at {} writer {writer} claimed \
                 it while {} {other} did",
                ms(*at),
                if *reader { "reader" } else { "writer" }
            ),
            Violation::Rule(rule) => f.write_str(rule),
        }
    }
}

/// A [`Violation::StaleWrite`]'s message.
fn stale_write(
    f: &mut fmt::Formatter<'_>,
    client: &str,
    token: &str,
    at: At,
    claim_ended: Option<At>,
) -> fmt::Result {
    match claim_ended {
        Some(end) => write!(
            f,
            "stale write: {client} (token {}) wrote at {} but its claim ended at {}",
            short(token),
            ms(at),
            ms(end)
        ),
        None => write!(
            f,
            "stale write: {client} (token {}) wrote at {} without ever holding the lock",
            short(token),
            ms(at)
        ),
    }
}

/// A [`Violation::RemovedEarly`]'s message: the token last seen at `seen_at`, gone by
/// `gone_by`.
fn removed_early(
    f: &mut fmt::Formatter<'_>,
    node: usize,
    key: &str,
    holder: &Holder,
    (seen_at, gone_by): (At, At),
) -> fmt::Result {
    write!(
        f,
        "token removed early: {key} on node-{node} held {}'s token at {} and was gone by {}, \
         while {holder} (no owner release, no injected key loss: deleted by a non-owner or \
         expired before its TTL)",
        holder.client,
        ms(seen_at),
        ms(gone_by)
    )
}

/// A [`Violation::ValidityOverstated`]'s message: the guard asked `at`, reporting validity
/// until `valid_until`.
fn validity_overstated(
    f: &mut fmt::Formatter<'_>,
    client: &str,
    token: &str,
    (at, valid_until): (At, At),
    short_of: &[(usize, At)],
) -> fmt::Result {
    write!(
        f,
        "validity overstated: at {} {client} (token {}) reported validity until {}, but {} \
         held it for less: no quorum held it that long",
        ms(at),
        short(token),
        ms(valid_until),
        super::validity::describe(short_of)
    )
}

/// A [`Violation::TooManyHolders`]'s message.
fn too_many_holders(
    f: &mut fmt::Formatter<'_>,
    semaphore: &str,
    permits: u32,
    at: At,
    holders: &[Holder],
) -> fmt::Result {
    write!(
        f,
        "too many holders: semaphore {semaphore} has {permits} permit(s), but at {} {} \
         holders claimed one:",
        ms(at),
        holders.len()
    )?;
    for (i, holder) in holders.iter().enumerate() {
        let sep = if i == 0 { " " } else { "; " };
        write!(f, "{sep}{holder}")?;
    }
    Ok(())
}

/// A left-behind key's value as the report shows it: the first characters, as for every
/// token, and for a key handed over to a fair waiter (`"<waiter>~<n>"`: a waiter id begins
/// with its client's tag, which reads like a lock's token) the hand-over's number and mark.
fn shown_value(value: &str) -> String {
    match value.rsplit_once('~') {
        Some((_, number)) => format!("{}…~{number}, handed over", short(value)),
        None => short(value).to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::shown_value;

    #[test]
    fn a_hand_over_token_is_marked_as_one() {
        let handed = "a1d8af6a54594ee9b2c7d5a895fbe5e8:0929332fdf0847e48d009c84c71d0d1b~2";
        assert_eq!(shown_value(handed), "a1d8af6a…~2, handed over");
        assert_eq!(shown_value("650c3617ffffffffffffffffffffffff"), "650c3617");
    }
}
