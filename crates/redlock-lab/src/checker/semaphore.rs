//! Semaphores: at most `permits` holders of one semaphore at any instant.
//!
//! A history declares each semaphore it holds ([`Event::Semaphore`]): its name, the prefix
//! every one of its holders' keys starts with, and its number of permits. The holders are
//! those of [`holders`](super::holders), with the same claim windows as for locks (from the
//! acquisition until the validity the client reported ended, or its release began): the
//! rule counts the claims of one semaphore that are open at once. Two claims of one permit
//! key are an [overlap](super::overlaps) besides.

use std::collections::BTreeSet;

use super::{Holder, Violation};
use crate::history::{At, Event};

/// The prefixes of the keys of every semaphore `events` declare.
pub(super) fn semaphore_keys(events: &[Event]) -> Vec<&str> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Semaphore { keys, .. } => Some(keys.as_str()),
            _ => None,
        })
        .collect()
}

/// Whether `key` is a permit of a semaphore (its prefix among `semaphores`) other than the
/// one `holder` won: a permit round proposes its token on every permit and rolls back, on
/// each node, those it did not win, while its holder claims the permit won. The token
/// rule judges a holder's token on its own permit only.
pub(super) fn elsewhere(semaphores: &[&str], holder: &Holder, key: &str) -> bool {
    holder.key != key && semaphores.iter().any(|s| key.starts_with(s))
}

/// For each semaphore `events` declare: its name, permits, and the most holders that
/// claimed at once, for the notes (a rule that never saw the permits all held checked
/// little).
pub fn most_at_once(events: &[Event], holders: &[Holder]) -> Vec<(String, u32, usize)> {
    let mut most = Vec::new();
    for (name, keys, permits) in declared(events) {
        let members: Vec<&Holder> = holders
            .iter()
            .filter(|h| h.key.starts_with(keys) && h.until > h.from)
            .collect();
        let peak = crowded(&members, 0)
            .iter()
            .map(|(_, open)| open.len())
            .max();
        most.push((name.to_string(), permits, peak.unwrap_or(0)));
    }
    most
}

/// Each semaphore `events` declare, once: its name, the prefix of its holders' keys, and
/// its permits.
fn declared(events: &[Event]) -> Vec<(&str, &str, u32)> {
    let mut declared: Vec<(&str, &str, u32)> = Vec::new();
    for event in events {
        if let Event::Semaphore {
            name,
            keys,
            permits,
        } = event
        {
            if !declared.iter().any(|&(_, k, _)| k == keys) {
                declared.push((name, keys, *permits));
            }
        }
    }
    declared
}

/// Every instant at which a holder's claim made the holders of a declared semaphore more
/// than its permits: one violation per such acquisition, naming the instant and every
/// holder claiming then. Claims are half-open (`from..until`): a claim that ends as
/// another begins leaves its permit to it, as the overlap rule has it.
pub fn semaphore_violations(events: &[Event], holders: &[Holder]) -> Vec<Violation> {
    let mut found = Vec::new();
    for (name, keys, permits) in declared(events) {
        let members: Vec<&Holder> = holders
            .iter()
            .filter(|h| h.key.starts_with(keys) && h.until > h.from)
            .collect();
        for (at, claiming) in crowded(&members, permits) {
            found.push(Violation::TooManyHolders {
                semaphore: name.to_owned(),
                permits,
                at,
                holders: claiming.into_iter().cloned().collect(),
            });
        }
    }
    found
}

/// Each acquisition after which more than `permits` of `members` claimed at once: its
/// instant and the claims open then, in order of acquisition.
fn crowded<'a>(members: &[&'a Holder], permits: u32) -> Vec<(At, Vec<&'a Holder>)> {
    // Ends sort before starts at one instant (`false < true`): half-open claims.
    let mut marks: Vec<(At, bool, usize)> = Vec::with_capacity(members.len() * 2);
    for (i, h) in members.iter().enumerate() {
        marks.push((h.from, true, i));
        marks.push((h.until, false, i));
    }
    marks.sort();
    let mut open: BTreeSet<(At, usize)> = BTreeSet::new();
    let mut found = Vec::new();
    for (at, starts, i) in marks {
        if !starts {
            open.remove(&(members[i].from, i));
            continue;
        }
        open.insert((members[i].from, i));
        if open.len() > permits as usize {
            found.push((at, open.iter().map(|&(_, j)| members[j]).collect()));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::{check, Observation};
    use super::*;

    /// `permits` permits declared under `p:`, and holders `a`, `b`, `c` each on a permit of
    /// its own (or `p:1` for all, `shared`), claiming 0-1000, 100-1100 and 200-1200.
    fn three_holders(permits: u32, shared: bool) -> Vec<Event> {
        let key = |i: usize| {
            if shared {
                "p:1".to_owned()
            } else {
                format!("p:{i}")
            }
        };
        vec![
            semaphore("jobs", "p:", permits),
            on_key(acquired("a", "ta", 0, 1000), &key(1)),
            on_key(acquired("b", "tb", 100, 1100), &key(2)),
            on_key(acquired("c", "tc", 200, 1200), &key(3)),
        ]
    }

    #[test]
    fn more_holders_than_permits_at_once_are_reported_with_the_instant_and_the_holders() {
        let found = check(&three_holders(2, false), &[], &[]);
        assert_eq!(categories(&found), ["too many holders"]);
        let events = three_holders(2, false);
        let most = most_at_once(&events, &super::super::holders(&events));
        assert_eq!(most, [("jobs".to_owned(), 2, 3)]);
        let Violation::TooManyHolders {
            semaphore,
            permits,
            at,
            holders,
        } = &found[0]
        else {
            unreachable!()
        };
        assert_eq!((semaphore.as_str(), *permits, *at), ("jobs", 2, t(200)));
        let clients: Vec<&str> = holders.iter().map(|h| h.client.as_str()).collect();
        assert_eq!(clients, ["a", "b", "c"]);
        let shown = found[0].to_string();
        assert!(
            shown.contains("jobs") && shown.contains("2 permit"),
            "{shown}"
        );
    }

    #[test]
    fn as_many_holders_as_permits_are_legal() {
        assert_eq!(check(&three_holders(3, false), &[], &[]), vec![]);
        // Two permits, the first holder gone (released) before the third arrives.
        let mut events = three_holders(2, false);
        events.push(released("a", "ta", 150));
        assert_eq!(check(&events, &[], &[]), vec![]);
        // A claim that ends as the next begins leaves its permit to it.
        events.pop();
        events.push(released("a", "ta", 200));
        assert_eq!(check(&events, &[], &[]), vec![]);
    }

    #[test]
    fn holders_outside_the_semaphore_or_undeclared_are_not_counted() {
        // Without a declaration, three holders of three keys break nothing.
        let mut events = three_holders(2, false);
        events.remove(0);
        assert_eq!(check(&events, &[], &[]), vec![]);
        // A declaration of another prefix counts none of them.
        events.insert(0, semaphore("mail", "q:", 1));
        assert_eq!(check(&events, &[], &[]), vec![]);
    }

    #[test]
    fn holders_of_one_permit_overlap_as_well() {
        let found = check(&three_holders(2, true), &[], &[]);
        let mut found = categories(&found);
        found.dedup();
        assert_eq!(found, ["overlap", "too many holders"]);
    }

    /// A token rolled back from a permit its round did not win, while its holder claims the
    /// permit won, is no removal; gone from the permit won, it is.
    #[test]
    fn a_token_rolled_back_from_another_permit_is_not_removed_early() {
        let mut events = three_holders(3, false);
        events.truncate(2);
        let seen = |key: &str, sent, token: Option<&str>, pttl| Observation {
            key: key.into(),
            ..obs(0, sent, token, pttl)
        };
        let rolled_back = [seen("p:2", 5, Some("ta"), 995), seen("p:2", 10, None, -2)];
        assert_eq!(check(&events, &rolled_back, &[]), vec![]);
        let removed = [seen("p:1", 5, Some("ta"), 995), seen("p:1", 10, None, -2)];
        assert_eq!(
            categories(&check(&events, &removed, &[])),
            ["token removed early"]
        );
        // Without a declared semaphore, a token gone from any key is judged.
        events.remove(0);
        assert_eq!(
            categories(&check(&events, &rolled_back, &[])),
            ["token removed early"]
        );
    }

    #[test]
    fn each_acquisition_that_crowds_the_semaphore_is_reported() {
        let mut events = three_holders(1, false);
        events.push(on_key(acquired("d", "td", 1100, 2000), "p:4"));
        // 1 permit: b arrives at 100 (a, b), c at 200 (a, b, c); d at 1100 finds c alone
        // (b's claim ended then).
        let at: Vec<At> = semaphore_violations(&events, &super::super::holders(&events))
            .iter()
            .map(|v| match v {
                Violation::TooManyHolders { at, .. } => *at,
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(at, [t(100), t(200), t(1100)]);
    }
}
