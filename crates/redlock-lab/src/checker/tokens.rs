//! Tokens on the nodes: removed early or extended by someone other than their owner, judged
//! from the observer's samples.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::{Holder, Observation, Violation, EVENT_SLACK};
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
    let by_token: HashMap<&str, &Holder> = holders.iter().map(|h| (h.token.as_str(), h)).collect();
    let key_loss: Vec<(usize, At)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Fault {
                at,
                node: Some(n),
                kind: FaultKind::KeyLoss,
                ..
            } => Some((*n, *at)),
            _ => None,
        })
        .collect();
    let extends: Vec<(&str, At, At)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Extend {
                token,
                started,
                ended,
                ..
            } => Some((token.as_str(), *started, *ended)),
            _ => None,
        })
        .collect();
    let mut series: BTreeMap<(usize, &str), Vec<&Observation>> = BTreeMap::new();
    for o in observations {
        series.entry((o.node, &o.key)).or_default().push(o);
    }
    let mut found = Vec::new();
    for ((node, key), mut list) in series {
        list.sort_by_key(|o| o.sent);
        for pair in list.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let Some(token) = a.token.as_deref() else {
                continue;
            };
            let Some(holder) = by_token.get(token) else {
                continue;
            };
            // Key loss on this node that began before the token was seen gone and lasted
            // (or happened again) until after it was seen present. Faults that take time
            // (a container restart) are recorded as a start and an end event.
            let lost_between = key_loss.iter().any(|&(n, began)| {
                n == node
                    && began <= b.received + EVENT_SLACK
                    && key_loss.iter().any(|&(m, ended)| {
                        m == node && ended >= began && ended + EVENT_SLACK >= a.sent
                    })
            });
            if b.token.as_deref() != Some(token) {
                if b.received + EVENT_SLACK < holder.until && !lost_between {
                    found.push(Violation::RemovedEarly {
                        node,
                        key: key.to_owned(),
                        holder: (*holder).clone(),
                        seen_at: a.received,
                        gone_by: b.received,
                    });
                }
                continue;
            }
            let (Ok(p1), Ok(p2)) = (u64::try_from(a.pttl), u64::try_from(b.pttl)) else {
                continue;
            };
            let latest_first = a.received + Duration::from_millis(p1);
            let earliest_second = b.sent + Duration::from_millis(p2);
            if earliest_second <= latest_first + EXPIRY_SLACK || lost_between {
                continue;
            }
            let owner_extending = extends.iter().any(|&(t, started, ended)| {
                t == token && started <= b.received && ended + EVENT_SLACK >= a.sent
            });
            if !owner_extending {
                found.push(Violation::ForeignExtend {
                    node,
                    key: key.to_owned(),
                    token: token.to_owned(),
                    between: (a.sent, b.received),
                    moved_by: earliest_second - latest_first,
                });
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
    fn a_token_deleted_while_held_is_reported() {
        let observations = [obs(1, 100, Some("ta"), 900), obs(1, 110, None, -2)];
        let events = vec![acquired("a", "ta", 0, 1000)];
        assert_eq!(
            categories(&check(&events, &observations, &[])),
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
        let fault = |at| Event::Fault {
            at: t(at),
            node: Some(1),
            kind: FaultKind::KeyLoss,
            what: "restart node-1".into(),
        };
        let events = vec![acquired("a", "ta", 0, 1000), fault(50), fault(450)];
        assert_eq!(check(&events, &observations, &[]), vec![]);
        // Key loss that ended before the token was seen is no explanation.
        let earlier = vec![acquired("a", "ta", 0, 1000), fault(10), fault(20)];
        assert_eq!(
            categories(&check(&earlier, &observations, &[])),
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
    fn normal_countdown_is_not_an_extension() {
        let observations = [obs(0, 100, Some("ta"), 900), obs(0, 300, Some("ta"), 701)];
        let events = vec![acquired("a", "ta", 0, 1000)];
        assert_eq!(check(&events, &observations, &[]), vec![]);
    }
}
