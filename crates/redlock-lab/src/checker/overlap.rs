//! Overlapping claims: two holders of one key at the same time.

use std::collections::BTreeMap;

use super::{Holder, Violation};

/// Different holders of one key whose claim windows intersect.
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
                if a.token != b.token && b.until > b.from {
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
}
