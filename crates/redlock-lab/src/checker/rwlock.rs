//! Read-write locks: a writer alone. No writer's claim may overlap another writer's or
//! any reader's; readers may overlap each other.
//!
//! A history declares each read-write lock it holds ([`Event::RwLock`]): its name, its
//! writers' key and its readers' key. The holders are those of
//! [`holders`](super::holders), with the same claim windows as for locks (from the
//! acquisition until the validity the client reported ended, or its release began).
//! Readers share one key, so the [overlap](super::overlaps) rule leaves the readers' key
//! alone ([`shared_keys`]); two writers on the writers' key are an overlap besides.

use super::{Holder, Violation};
use crate::history::{At, Event};

/// A declared read-write lock: its name, writers' key and readers' key.
struct Declared<'a> {
    name: &'a str,
    writers: &'a str,
    readers: &'a str,
}

/// Every read-write lock `events` declare, once each.
fn declared(events: &[Event]) -> Vec<Declared<'_>> {
    let mut found: Vec<Declared<'_>> = Vec::new();
    for event in events {
        if let Event::RwLock {
            name,
            writers,
            readers,
        } = event
        {
            if !found.iter().any(|d| d.writers == writers) {
                found.push(Declared {
                    name,
                    writers,
                    readers,
                });
            }
        }
    }
    found
}

/// The readers' keys of every read-write lock `events` declare: holders there share the
/// key, which the overlap rule must not count against them.
pub(super) fn shared_keys(events: &[Event]) -> Vec<&str> {
    declared(events).into_iter().map(|d| d.readers).collect()
}

/// Every pair of a writer and another holder of one declared read-write lock (a reader,
/// or another writer) whose claims intersect: one violation per pair, naming the instant
/// the later claim began and both holders. Claims are half-open (`from..until`): a claim
/// that ends as another begins hands the lock over.
pub fn rwlock_violations(events: &[Event], holders: &[Holder]) -> Vec<Violation> {
    let mut found = Vec::new();
    for lock in declared(events) {
        let live = |key: &str| -> Vec<&Holder> {
            let mut on: Vec<&Holder> = holders
                .iter()
                .filter(|h| h.key == key && h.until > h.from)
                .collect();
            on.sort_by_key(|h| h.from);
            on
        };
        let (writers, readers) = (live(lock.writers), live(lock.readers));
        for (i, writer) in writers.iter().enumerate() {
            let others = writers[i + 1..]
                .iter()
                .map(|w| (w, false))
                .chain(readers.iter().map(|r| (r, true)));
            for (other, reader) in others {
                if let Some(at) = both_claim(writer, other) {
                    found.push(Violation::WriterNotAlone {
                        rwlock: lock.name.to_owned(),
                        at,
                        writer: (*writer).clone(),
                        other: (*other).clone(),
                        reader,
                    });
                }
            }
        }
    }
    found
}

/// When the later of two claims began, if they intersect.
fn both_claim(a: &Holder, b: &Holder) -> Option<At> {
    let at = a.from.max(b.from);
    (at < a.until.min(b.until)).then_some(at)
}

/// For each read-write lock `events` declare: its name, the most readers that claimed at
/// once, and how many writers claimed, for the notes (a rule that never saw readers
/// share, or a writer at all, checked little).
pub fn rwlock_counts(events: &[Event], holders: &[Holder]) -> Vec<(String, usize, usize)> {
    declared(events)
        .into_iter()
        .map(|lock| {
            let on = |key: &str| {
                holders
                    .iter()
                    .filter(|h| h.key == key && h.until > h.from)
                    .collect::<Vec<_>>()
            };
            let readers = on(lock.readers);
            let most = readers
                .iter()
                .map(|r| {
                    readers
                        .iter()
                        .filter(|o| both_claim(r, o).is_some())
                        .count()
                })
                .max()
                .unwrap_or(0);
            (lock.name.to_owned(), most, on(lock.writers).len())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::check;
    use super::super::fixtures::*;
    use super::*;

    /// The read-write lock declared, then each `(client, side, from, until)` a holder of
    /// it (`'w'` a writer, `'r'` a reader).
    fn history(holds: &[(&str, char, u64, u64)]) -> Vec<Event> {
        let mut events = vec![rwlock("config")];
        for &(client, side, from, until) in holds {
            let key = if side == 'w' { "w" } else { "r" };
            events.push(on_key(
                acquired(client, &format!("t{client}"), from, until),
                key,
            ));
        }
        events
    }

    #[test]
    fn a_writer_overlapping_a_reader_is_reported_with_the_instant_and_both() {
        let found = check(
            &history(&[("a", 'w', 0, 1000), ("b", 'r', 400, 1400)]),
            &[],
            &[],
        );
        assert_eq!(categories(&found), ["writer not alone"]);
        let Violation::WriterNotAlone {
            rwlock,
            at,
            writer,
            other,
            reader,
        } = &found[0]
        else {
            unreachable!()
        };
        assert_eq!((rwlock.as_str(), *at, *reader), ("config", t(400), true));
        assert_eq!((writer.client.as_str(), other.client.as_str()), ("a", "b"));
        let shown = found[0].to_string();
        assert!(
            shown.contains("config") && shown.contains("reader b"),
            "{shown}"
        );
        // The reader first, the writer inside its claim: the same.
        let found = check(
            &history(&[("b", 'r', 0, 1000), ("a", 'w', 400, 1400)]),
            &[],
            &[],
        );
        assert_eq!(categories(&found), ["writer not alone"]);
    }

    #[test]
    fn two_writers_at_once_are_reported_and_overlap() {
        let found = check(
            &history(&[("a", 'w', 0, 1000), ("b", 'w', 400, 1400)]),
            &[],
            &[],
        );
        let mut found = categories(&found);
        found.sort_unstable();
        assert_eq!(found, ["overlap", "writer not alone"]);
    }

    #[test]
    fn readers_share() {
        let events = history(&[
            ("a", 'r', 0, 1000),
            ("b", 'r', 400, 1400),
            ("c", 'r', 500, 900),
        ]);
        assert_eq!(check(&events, &[], &[]), vec![]);
        let counts = rwlock_counts(&events, &super::super::holders(&events));
        assert_eq!(counts, [("config".to_owned(), 3, 0)]);
    }

    #[test]
    fn back_to_back_claims_are_legal() {
        let events = history(&[
            ("a", 'r', 0, 1000),
            ("b", 'w', 1000, 2000),
            ("c", 'w', 2000, 3000),
            ("d", 'r', 3000, 4000),
        ]);
        assert_eq!(check(&events, &[], &[]), vec![]);
        // A released reader leaves the lock to the writer that comes in after it.
        let mut events = history(&[("a", 'r', 0, 1000), ("b", 'w', 500, 1500)]);
        events.push(released("a", "ta", 500));
        assert_eq!(check(&events, &[], &[]), vec![]);
    }

    #[test]
    fn undeclared_readers_overlap_as_holders_of_one_key() {
        let mut events = history(&[("a", 'r', 0, 1000), ("b", 'r', 400, 1400)]);
        events.remove(0);
        assert_eq!(categories(&check(&events, &[], &[])), ["overlap"]);
    }
}
