//! Tokens on the nodes: removed early or extended by someone other than their owner, judged
//! from the observer's samples.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::semaphore::{elsewhere, semaphore_keys};
use super::{
    clock_steps_forward, episodes_of, key_losses, stepped_forward, Episode, Holder, Observation,
    Violation, EVENT_SLACK,
};
use crate::history::{At, Event, FaultKind};

/// Slack for comparing server-side expiry estimates (PTTL is whole milliseconds, the sampling
/// round trip is a few; 20 ms also absorbs a 1 % clock-rate difference over a 1 s TTL).
const EXPIRY_SLACK: Duration = Duration::from_millis(20);

/// Tokens removed or extended on a node by someone other than their owner, from the samples.
pub fn token_violations(
    events: &[Event],
    observations: &[Observation],
    holders: &[Holder],
) -> Vec<Violation> {
    let known = Known::new(events, holders);
    let mut series: BTreeMap<(usize, &str), Vec<&Observation>> = BTreeMap::new();
    for o in observations {
        series.entry((o.node, &o.key)).or_default().push(o);
    }
    let mut found = Vec::new();
    for ((node, key), mut list) in series {
        list.sort_by_key(|o| o.sent);
        for pair in list.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let faults = known.between(node, a, b);
            known.removed_early(node, key, (a, b), &faults, &mut found);
            found.extend(known.foreign_extend(node, key, (a, b), &faults));
        }
    }
    found
}

/// A window in which a token (or a reentrant lock's owner) was acting on its key: from a
/// call's start to its end.
type Acting<'a> = (&'a str, At, At);

/// What the history says about the tokens and the faults: who holds which token, and which
/// faults and calls may explain a token's going or its expiry's moving.
struct Known<'a> {
    holders: &'a [Holder],
    by_token: HashMap<&'a str, &'a Holder>,
    key_loss: Vec<Episode>,
    clock_back: Vec<Episode>,
    clock_forward: Vec<(Episode, Duration)>,
    /// Each extension call, by its token (see [`extension_windows`]).
    extends: Vec<Acting<'a>>,
    /// Each call of a reentrant lock's owner, and each extension of one of its holds.
    owner_active: Vec<Acting<'a>>,
    /// The prefixes of the declared semaphores' keys (see [`elsewhere`]).
    semaphores: Vec<&'a str>,
}

/// What happened on a node between two consecutive samples `a` and `b` of one key.
struct Between {
    /// Key loss on this node that began before the token was seen gone and lasted until
    /// after it was seen present. Faults that take time (a container restart) are recorded
    /// as a start and an end event, one episode.
    lost: bool,
    /// A clock stepped back: it explains a later expiry, never a removal.
    stepped_back: bool,
    /// The key expired on its own: the node's own PTTL in `a` ran out by `b`.
    expired: bool,
}

impl<'a> Known<'a> {
    fn new(events: &'a [Event], holders: &'a [Holder]) -> Known<'a> {
        let by_token: HashMap<&str, &Holder> =
            holders.iter().map(|h| (h.token.as_str(), h)).collect();
        let extends = extension_windows(events, &by_token);
        let owner_active = owner_windows(events, &extends, &by_token);
        Known {
            holders,
            by_token,
            key_loss: key_losses(events),
            clock_back: episodes_of(events, FaultKind::ClockBack),
            clock_forward: clock_steps_forward(events),
            extends,
            owner_active,
            semaphores: semaphore_keys(events),
        }
    }

    /// The faults on `node` between samples `a` and `b`, and whether the key expired.
    fn between(&self, node: usize, a: &Observation, b: &Observation) -> Between {
        let between = |faults: &[Episode]| {
            faults.iter().any(|&(n, began, ended)| {
                n == node && began <= b.received + EVENT_SLACK && ended + EVENT_SLACK >= a.sent
            })
        };
        // Expired on its own: the node's own PTTL in `a` ran out by `b` (within 1 %, a node
        // clock a little slower than ours). A key that an extension or a renewal did not
        // reach keeps its old expiry there while its holder claims on, backed by the other
        // nodes: that is no removal (what the guard may claim against what a quorum holds
        // is the validity rule's). A clock that runs fast still shows: its key vanishes
        // before the PTTL it reported had run out in real time. A clock step forward
        // between the two samples brings that expiry forward by its size, and no more.
        let early = stepped_forward(&self.clock_forward, node, a.sent, b.received);
        let expired = u64::try_from(a.pttl).is_ok_and(|p| {
            let due = Duration::from_millis(p);
            a.sent + due.saturating_sub(early) <= b.received + EVENT_SLACK + due / 100
        });
        Between {
            lost: between(&self.key_loss),
            stepped_back: between(&self.clock_back),
            expired,
        }
    }

    /// Each token seen in `a` (a plain lock's, or each hold of a reentrant lock) that is
    /// gone in `b` while its holder still claims the lock, unless a fault or the key's own
    /// expiry explains it.
    fn removed_early(
        &self,
        node: usize,
        key: &str,
        (a, b): (&Observation, &Observation),
        faults: &Between,
        found: &mut Vec<Violation>,
    ) {
        for token in a.tokens() {
            let Some(holder) = self.by_token.get(token) else {
                continue;
            };
            if elsewhere(&self.semaphores, holder, key) {
                continue;
            }
            if !b.has(token)
                && b.received + EVENT_SLACK < holder.until
                && !faults.lost
                && !faults.expired
            {
                found.push(Violation::RemovedEarly {
                    node,
                    key: key.to_owned(),
                    holder: (*holder).clone(),
                    seen_at: a.received,
                    gone_by: b.received,
                });
            }
        }
    }

    /// The expiry of one key value (a token, or a reentrant lock's owner) moving later
    /// between `a` and `b` while nobody it belongs to was extending it.
    fn foreign_extend(
        &self,
        node: usize,
        key: &str,
        (a, b): (&Observation, &Observation),
        faults: &Between,
    ) -> Option<Violation> {
        let (Some(value), true) = (a.token.as_deref(), a.token == b.token) else {
            return None;
        };
        let known = match a.owner() {
            Some(owner) => {
                self.owner_active.iter().any(|&(o, ..)| o == owner)
                    || self
                        .holders
                        .iter()
                        .any(|h| h.owner.as_deref() == Some(owner))
            }
            None => self.by_token.contains_key(value),
        };
        let (Ok(p1), Ok(p2)) = (u64::try_from(a.pttl), u64::try_from(b.pttl)) else {
            return None;
        };
        let latest_first = a.received + Duration::from_millis(p1);
        let earliest_second = b.sent + Duration::from_millis(p2);
        if !known
            || earliest_second <= latest_first + EXPIRY_SLACK
            || faults.lost
            || faults.stepped_back
        {
            return None;
        }
        let during =
            |&(_, started, ended): &Acting| started <= b.received && ended + EVENT_SLACK >= a.sent;
        let owner_extending = match a.owner() {
            Some(owner) => self.owner_active.iter().any(|w| w.0 == owner && during(w)),
            None => self.extends.iter().any(|w| w.0 == value && during(w)),
        };
        (!owner_extending).then(|| Violation::ForeignExtend {
            node,
            key: key.to_owned(),
            token: value.to_owned(),
            between: (a.sent, b.received),
            moved_by: earliest_second - latest_first,
        })
    }
}

/// Each extension call's window, by its token. It runs from the call's start until it
/// returned or, if later, until its holder's claim ended: a node that the call gave up on
/// (timed out) may still apply its PEXPIRE after the call returned, and only the holder's
/// own release orders it (PEXPIRE never recreates a deleted key, and checks the token).
fn extension_windows<'a>(
    events: &'a [Event],
    by_token: &HashMap<&str, &Holder>,
) -> Vec<Acting<'a>> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Extend {
                token,
                started,
                ended,
                ..
            } => {
                let claim = by_token.get(token.as_str()).map_or(*ended, |h| h.until);
                Some((token.as_str(), *started, (*ended).max(claim)))
            }
            _ => None,
        })
        .collect()
}

/// What moves a reentrant lock's expiry: any call of its owner (a new hold raises the key's
/// TTL, in rounds that lose too) and any extension of one of its holds (`extends`).
fn owner_windows<'a>(
    events: &'a [Event],
    extends: &[Acting<'a>],
    by_token: &HashMap<&'a str, &'a Holder>,
) -> Vec<Acting<'a>> {
    let mut owner_active: Vec<Acting<'a>> = events
        .iter()
        .filter_map(|e| match e {
            Event::Op {
                owner: Some(owner),
                started,
                ended,
                ..
            } => Some((owner.as_str(), *started, *ended)),
            _ => None,
        })
        .collect();
    owner_active.extend(extends.iter().filter_map(|&(token, started, ended)| {
        let owner = by_token.get(token)?.owner.as_deref()?;
        Some((owner, started, ended))
    }));
    owner_active
}

#[cfg(test)]
mod tests {
    use super::super::check;
    use super::super::fixtures::*;
    use super::*;
    use crate::history::FaultKind;

    #[test]
    fn a_token_deleted_while_held_is_reported() {
        let observations = [obs(1, 100, Some("ta"), 900), obs(1, 110, None, -2)];
        let events = vec![acquired("a", "ta", 0, 1000)];
        assert_eq!(
            categories(&check(&events, &observations, &[])),
            ["token removed early"]
        );
    }

    #[test]
    fn a_key_that_expires_on_its_node_while_extended_elsewhere_is_not_removed() {
        // Extended at 700 to 1700 on the other nodes; node 1 missed it and expires the key
        // at 1000, as its PTTL said.
        let mut events = vec![acquired("a", "ta", 0, 1000)];
        events.push(Event::Extend {
            client: "a".into(),
            token: "ta".into(),
            started: t(700),
            ended: t(705),
            valid_until: Some(t(1700)),
        });
        let on_time = [obs(1, 990, Some("ta"), 10), obs(1, 1002, None, -2)];
        assert_eq!(check(&events, &on_time, &[]), vec![]);
        // The negative control: gone at 1002 while its PTTL said 300 more.
        let early = [obs(1, 990, Some("ta"), 300), obs(1, 1002, None, -2)];
        assert_eq!(
            categories(&check(&events, &early, &[])),
            ["token removed early"]
        );
    }

    #[test]
    fn an_injected_key_loss_explains_a_vanished_token() {
        let observations = [obs(1, 100, Some("ta"), 900), obs(1, 110, None, -2)];
        let events = vec![
            acquired("a", "ta", 0, 1000),
            Event::Fault {
                at: t(105),
                node: Some(1),
                kind: FaultKind::KeyLoss,
                what: "FLUSHALL node-1".into(),
            },
        ];
        assert_eq!(check(&events, &observations, &[]), vec![]);
        // The same fault on another node explains nothing.
        let mut other = events.clone();
        other[1] = Event::Fault {
            at: t(105),
            node: Some(2),
            kind: FaultKind::KeyLoss,
            what: "FLUSHALL node-2".into(),
        };
        assert_eq!(
            categories(&check(&other, &observations, &[])),
            ["token removed early"]
        );
    }

    #[test]
    fn a_key_loss_interval_around_the_samples_explains_a_vanished_token() {
        // A restart that began before the last sample that saw the token and ended after
        // the first one that did not.
        let observations = [obs(1, 100, Some("ta"), 900), obs(1, 400, None, -2)];
        let fault = |at, kind| Event::Fault {
            at: t(at),
            node: Some(1),
            kind,
            what: "restart node-1".into(),
        };
        let (start, end) = (FaultKind::KeyLoss, FaultKind::KeyLossEnd);
        let events = vec![
            acquired("a", "ta", 0, 1000),
            fault(50, start),
            fault(450, end),
        ];
        assert_eq!(check(&events, &observations, &[]), vec![]);
        // Key loss that ended before the token was seen is no explanation.
        let earlier = vec![
            acquired("a", "ta", 0, 1000),
            fault(10, start),
            fault(20, end),
        ];
        assert_eq!(
            categories(&check(&earlier, &observations, &[])),
            ["token removed early"]
        );
        // Nor are two losses that take no time, one before the samples and one after (two
        // steps of the host's clock): they must not make one episode over both samples.
        let apart = vec![
            acquired("a", "ta", 0, 1000),
            fault(50, start),
            fault(450, start),
        ];
        assert_eq!(
            categories(&check(&apart, &observations, &[])),
            ["token removed early"]
        );
    }

    #[test]
    fn a_clock_stepped_back_explains_a_later_expiry_and_no_removal() {
        let step = |node| Event::Fault {
            at: t(150),
            node: Some(node),
            kind: FaultKind::ClockBack,
            what: "clock of node-0 steps -1500 ms".into(),
        };
        // The key's expiry moves 1.5 s later on node 0 as its clock steps back.
        let later = [obs(0, 100, Some("ta"), 900), obs(0, 200, Some("ta"), 2300)];
        let events = vec![acquired("a", "ta", 0, 1000), step(0)];
        assert_eq!(check(&events, &later, &[]), vec![]);
        // A step on another node explains nothing.
        let elsewhere = vec![acquired("a", "ta", 0, 1000), step(1)];
        assert_eq!(
            categories(&check(&elsewhere, &later, &[])),
            ["foreign extend"]
        );
        // The negative control: a token gone from the stepped node while its holder claims
        // is still removed early (a step back removes nothing).
        let gone = [obs(0, 100, Some("ta"), 900), obs(0, 200, None, -2)];
        assert_eq!(
            categories(&check(&events, &gone, &[])),
            ["token removed early"]
        );
    }

    #[test]
    fn a_foreign_extension_is_reported_and_an_owned_one_is_not() {
        let observations = [obs(0, 100, Some("ta"), 900), obs(0, 200, Some("ta"), 1000)];
        let events = vec![acquired("a", "ta", 0, 1000)];
        assert_eq!(
            categories(&check(&events, &observations, &[])),
            ["foreign extend"]
        );
        let mut owned = events.clone();
        owned.push(Event::Extend {
            client: "a".into(),
            token: "ta".into(),
            started: t(150),
            ended: t(152),
            valid_until: Some(t(1100)),
        });
        assert_eq!(check(&owned, &observations, &[]), vec![]);
    }

    #[test]
    fn an_extension_landing_late_on_a_node_is_the_owners() {
        // The call returned at 152 (that node timed out); its PEXPIRE landed there at
        // about 180, while the holder still claimed (until 1100).
        let observations = [obs(0, 170, Some("ta"), 830), obs(0, 190, Some("ta"), 1010)];
        let events = vec![
            acquired("a", "ta", 0, 1000),
            Event::Extend {
                client: "a".into(),
                token: "ta".into(),
                started: t(150),
                ended: t(152),
                valid_until: Some(t(1100)),
            },
        ];
        assert_eq!(check(&events, &observations, &[]), vec![]);
        // Before the owner's call started, the same move is foreign.
        let before = [obs(0, 100, Some("ta"), 900), obs(0, 120, Some("ta"), 1010)];
        assert_eq!(
            categories(&check(&events, &before, &[])),
            ["foreign extend"]
        );
    }

    #[test]
    fn normal_countdown_is_not_an_extension() {
        let observations = [obs(0, 100, Some("ta"), 900), obs(0, 300, Some("ta"), 701)];
        let events = vec![acquired("a", "ta", 0, 1000)];
        assert_eq!(check(&events, &observations, &[]), vec![]);
    }

    fn hash(node: usize, sent: u64, owner: &str, holds: &[&str], pttl: i64) -> Observation {
        Observation {
            token: Some(format!("{}{owner}", super::super::REENTRANT)),
            holds: holds.iter().map(|h| (*h).to_owned()).collect(),
            ..obs(node, sent, None, pttl)
        }
    }

    #[test]
    fn a_hold_removed_while_its_holder_claims_is_reported() {
        let events = vec![
            held_by("a", "t1", "o1", 0, 1000),
            held_by("a", "t2", "o1", 50, 1050),
            released("a", "t1", 120),
        ];
        // Legal: t1's release drops its hold, t2's stays.
        let legal = [
            hash(0, 100, "o1", &["t1", "t2"], 900),
            hash(0, 130, "o1", &["t2"], 870),
        ];
        assert_eq!(check(&events, &legal, &[]), vec![]);
        // The negative control: t2's hold gone while t2 still claims.
        let removed = [
            hash(0, 100, "o1", &["t1", "t2"], 900),
            hash(0, 130, "o1", &["t1"], 870),
        ];
        assert_eq!(
            categories(&check(&events, &removed, &[])),
            ["token removed early"]
        );
    }

    #[test]
    fn a_reentrant_expiry_moves_only_while_its_owner_acts() {
        let events = vec![held_by("a", "t1", "o1", 0, 1000)];
        let moved = [
            hash(0, 100, "o1", &["t1"], 900),
            hash(0, 200, "o1", &["t1"], 1000),
        ];
        assert_eq!(categories(&check(&events, &moved, &[])), ["foreign extend"]);
        // A call of the same owner (a new hold raises the key's TTL) explains it.
        let mut acting = events.clone();
        acting.push(Event::Op {
            client: "a".into(),
            op: "reentrant",
            owner: Some("o1".into()),
            started: t(150),
            ended: t(160),
            outcome: "ok".into(),
        });
        assert_eq!(check(&acting, &moved, &[]), vec![]);
        // Another owner's call does not.
        let Event::Op { owner, .. } = &mut acting[1] else {
            unreachable!()
        };
        *owner = Some("o2".into());
        assert_eq!(categories(&check(&acting, &moved, &[])), ["foreign extend"]);
    }
}
