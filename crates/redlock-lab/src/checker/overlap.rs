//! Overlapping claims: two holders of one key at the same time (but two holds of one
//! reentrant lock's owner, which share it).

use std::collections::BTreeMap;

use super::{Holder, Violation};

/// Different holders of one key whose claim windows intersect, unless both are holds of
/// the same reentrant owner ([`Holder::shares_with`]).
pub fn overlaps(holders: &[Holder]) -> Vec<Violation> {
    let mut by_key: BTreeMap<&str, Vec<&Holder>> = BTreeMap::new();
    for h in holders {
        by_key.entry(&h.key).or_default().push(h);
    }
    let mut found = Vec::new();
    for (_, mut list) in by_key {
        list.sort_by_key(|h| h.from);
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                if b.from >= a.until {
                    // Sorted by start: later holders start later still, but an earlier
                    // long claim may still reach them, so keep scanning only while useful.
                    continue;
                }
                // The same token twice counts too: no path acquires a token twice (each
                // attempt, and each reentrant hold, has its own), so two claims under one
                // token are one lock handed to two callers.
                if b.until > b.from && !a.shares_with(b) {
                    let both_for = a.until.min(b.until) - b.from;
                    found.push(Violation::Overlap {
                        first: (*a).clone(),
                        second: (*b).clone(),
                        both_for,
                    });
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::super::check;
    use super::super::fixtures::*;
    use super::*;

    #[test]
    fn overlapping_claims_are_reported() {
        let events = vec![acquired("a", "ta", 0, 1000), acquired("b", "tb", 500, 1500)];
        let found = check(&events, &[], &[]);
        assert_eq!(categories(&found), ["overlap"]);
        let Violation::Overlap { both_for, .. } = &found[0] else {
            unreachable!()
        };
        assert_eq!(*both_for, t(500));
    }

    /// One won lock handed to two callers (say by a grouped round's answers): two claims
    /// under one token, which must not be skipped as one holder.
    #[test]
    fn one_token_claimed_twice_at_once_overlaps() {
        let events = vec![acquired("a", "t", 0, 1000), acquired("b", "t", 500, 1500)];
        assert_eq!(categories(&check(&events, &[], &[])), ["overlap"]);
    }

    #[test]
    fn holds_of_one_owner_share_the_key_and_of_two_owners_overlap() {
        // Legal: two holds of owner o1 inside each other's validity, released in either
        // order.
        let shared = vec![
            held_by("a", "t1", "o1", 0, 1000),
            held_by("a", "t2", "o1", 100, 1100),
            released("a", "t1", 300),
            released("a", "t2", 400),
        ];
        assert_eq!(check(&shared, &[], &[]), vec![]);
        // The negative control: the same windows, the second hold another owner's.
        let mut foreign = shared.clone();
        foreign[1] = held_by("b", "t2", "o2", 100, 1100);
        assert_eq!(categories(&check(&foreign, &[], &[])), ["overlap"]);
        // A reentrant hold and a plain lock exclude each other too.
        foreign[1] = acquired("b", "t2", 100, 1100);
        assert_eq!(categories(&check(&foreign, &[], &[])), ["overlap"]);
    }
}
