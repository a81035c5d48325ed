//! Owner identities for reentrant locks.

use std::fmt;
use std::sync::Arc;

/// Who holds a reentrant lock.
///
/// Async tasks have no thread identity (a task moves between threads, and one thread runs
/// many tasks), so reentrancy cannot be keyed on the current thread as Redisson does in
/// Java. Instead the caller holds an `Owner` value and passes it to every nested
/// acquisition; clone it into the tasks that act for the same owner. Two different
/// `Owner`s exclude each other like any two lock holders.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Owner(Arc<str>);

impl Owner {
    /// A new, unique owner (a random UUID).
    pub fn new() -> Self {
        Owner(random_id().to_string().into())
    }

    /// An owner with a chosen identity, for example a job ID shared by several processes
    /// that act as one owner. It must be unique to that owner.
    pub fn named(id: impl Into<String>) -> Self {
        Owner(id.into().into())
    }

    /// The identity stored on the nodes.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for Owner {
    fn default() -> Self {
        Owner::new()
    }
}

/// The first eight characters only, as a lock token's: an owner's identity lets its
/// bearer enter the reentrant locks it holds, so logs must not carry it whole.
impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prefix: String = self.0.chars().take(8).collect();
        write!(f, "Owner({prefix}…)")
    }
}

/// A random UUID v4, from `rand`'s thread generator (a CSPRNG seeded from the operating
/// system's, with no system call per id): for owners, waiter ids and client tags.
pub(crate) fn random_id() -> uuid::fmt::Simple {
    uuid::Builder::from_random_bytes(rand::random())
        .into_uuid()
        .simple()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Debug` must never print the whole identity: its bearer could enter the owner's
    /// reentrant locks.
    #[test]
    fn debug_shows_only_the_start_of_the_identity() {
        let owner = Owner::named("job-42-0123456789abcdef");
        assert_eq!(format!("{owner:?}"), "Owner(job-42-0…)");
    }
}
