//! Writes to the protected value: lost updates and writes outside the writer's claim.

use std::collections::HashMap;

use super::{Holder, Violation};
use crate::history::{At, Event};

/// Lost updates (a write based on a read that another write had already superseded) and
/// writes outside the writer's claim.
pub fn write_violations(events: &[Event], holders: &[Holder]) -> Vec<Violation> {
    let by_token: HashMap<&str, &Holder> = holders.iter().map(|h| (h.token.as_str(), h)).collect();
    let mut writes: Vec<(&String, &String, At, u64, u64)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Write {
                client,
                token,
                wrote_at,
                read,
                wrote,
                ..
            } => Some((client, token, *wrote_at, *read, *wrote)),
            _ => None,
        })
        .collect();
    writes.sort_by_key(|w| w.2);
    let mut found = Vec::new();
    let mut current = 0;
    for (client, token, at, read, wrote) in writes {
        if read != current {
            found.push(Violation::LostUpdate {
                client: client.clone(),
                token: token.clone(),
                read,
                current,
                at,
            });
        }
        current = wrote;
        let claim_ended = by_token.get(token.as_str()).map(|h| h.until);
        if claim_ended.is_none_or(|end| at > end) {
            found.push(Violation::StaleWrite {
                client: client.clone(),
                token: token.clone(),
                at,
                claim_ended,
            });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::super::check;
    use super::super::fixtures::*;

    #[test]
    fn a_lost_update_is_reported() {
        // B wrote 1; A then wrote from its old read of 0: B's update is lost.
        let events = vec![
            acquired("a", "ta", 0, 100),
            acquired("b", "tb", 150, 1000),
            write("b", "tb", 160, 0),
            write("a", "ta", 170, 0),
        ];
        let found = check(&events, &[], &[]);
        assert_eq!(categories(&found), ["lost update", "stale write"]);
    }

    #[test]
    fn a_write_without_a_lock_is_stale() {
        let events = vec![write("x", "never", 5, 0)];
        assert_eq!(categories(&check(&events, &[], &[])), ["stale write"]);
    }
}
