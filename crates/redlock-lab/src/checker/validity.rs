//! Validity the nodes no longer hold: after an extension (manual, longer or shorter than
//! the TTL, or a renewal) a guard must never report validity beyond what a quorum of nodes
//! still hold for it. Judged from [`Event::NodesRead`]: each node read straight after the
//! guard was asked.

use std::time::Duration;

use super::{clock_steps_forward, key_losses, ms, stepped_forward, Violation, EVENT_SLACK};
use crate::history::{At, Event, NodeHold};

/// The latest a node can still hold the lock, by its read: the reply's arrival plus the
/// `PTTL` it reported (the read was taken at some point before the reply arrived, so this
/// bounds the expiry from above, whatever the read's own latency). `None`: unknown (no
/// answer), or held without expiry; a node that does not hold the lock held it until the
/// read was sent at the latest.
fn held_until(read: &NodeHold) -> Option<At> {
    match read.pttl? {
        -1 => None,
        pttl if pttl < 0 => Some(read.sent),
        pttl => Some(read.received + Duration::from_millis(pttl as u64 + 1)),
    }
}

/// Slack for one node's expiry: the event slack, plus 1 % of what it reported (a node's
/// clock may run slower than the lab's inside the drift budget, so its milliseconds last
/// longer than ours).
fn slack(read: &NodeHold) -> Duration {
    let pttl = read.pttl.unwrap_or(0).max(0) as u64;
    EVENT_SLACK + Duration::from_micros(pttl * 10)
}

/// Guards that reported validity beyond the expiry of more nodes than a lock can do
/// without (more than `nodes - quorum` of them): those nodes no longer held it, so no
/// quorum did. Nodes that did not answer, or that lost keys to an injected fault since
/// the guard began, count as holding it; a node whose clock stepped forward since then
/// may hold it that much less.
pub fn validity_violations(events: &[Event]) -> Vec<Violation> {
    let key_loss = key_losses(events);
    let clock_forward = clock_steps_forward(events);
    let acquired = |token: &str| {
        events.iter().find_map(|e| match e {
            Event::Acquired {
                token: t, started, ..
            } if t == token => Some(*started),
            _ => None,
        })
    };
    let mut found = Vec::new();
    for event in events {
        let Event::NodesRead {
            client,
            token,
            at,
            valid_until,
            quorum,
            nodes,
        } = event
        else {
            continue;
        };
        let since = acquired(token).unwrap_or(At::ZERO);
        let short_of: Vec<(usize, At)> = nodes
            .iter()
            .filter(|r| {
                !key_loss.iter().any(|&(n, from, to)| {
                    n == r.node && to + EVENT_SLACK >= since && from <= r.received + EVENT_SLACK
                })
            })
            .filter_map(|r| {
                let until = held_until(r)?;
                let early = stepped_forward(&clock_forward, r.node, since, r.received);
                (until + slack(r) + early < *valid_until).then_some((r.node, until))
            })
            .collect();
        if short_of.len() > nodes.len().saturating_sub(*quorum) {
            found.push(Violation::ValidityOverstated {
                client: client.clone(),
                token: token.clone(),
                at: *at,
                valid_until: *valid_until,
                short_of,
            });
        }
    }
    found
}

/// How [`Violation::ValidityOverstated`] lists the nodes that held less.
pub(super) fn describe(short_of: &[(usize, At)]) -> String {
    short_of
        .iter()
        .map(|(n, until)| format!("node-{n} until {}", ms(*until)))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::super::check;
    use super::super::fixtures::*;
    use super::*;
    use crate::history::FaultKind;

    fn read(node: usize, sent: u64, pttl: Option<i64>) -> NodeHold {
        NodeHold {
            node,
            sent: t(sent),
            received: t(sent + 1),
            pttl,
        }
    }

    /// A guard extended at 500 to 1500, then read on five nodes (quorum 3).
    fn extended(pttls: [Option<i64>; 5]) -> Vec<Event> {
        vec![
            acquired("a", "ta", 0, 1000),
            Event::Extend {
                client: "a".into(),
                token: "ta".into(),
                started: t(500),
                ended: t(505),
                valid_until: Some(t(1500)),
            },
            Event::NodesRead {
                client: "a".into(),
                token: "ta".into(),
                at: t(506),
                valid_until: t(1500),
                quorum: 3,
                nodes: (0..5).map(|n| read(n, 507, pttls[n])).collect(),
            },
        ]
    }

    #[test]
    fn a_guard_inside_what_a_quorum_holds_passes() {
        // Three nodes hold it past 1500 (plus drift), two lost it: still a quorum.
        let events = extended([Some(1010), Some(1010), Some(1010), Some(-2), Some(-2)]);
        assert_eq!(check(&events, &[], &[]), vec![]);
        // Two hold it, three do not answer: unknown is not proof.
        let events = extended([Some(1010), Some(1010), None, None, None]);
        assert_eq!(check(&events, &[], &[]), vec![]);
    }

    #[test]
    fn a_guard_beyond_what_a_quorum_holds_is_reported() {
        // The negative control: the extension took on two nodes only, the other three
        // still expire at about 1000 (the old TTL) while the guard reports 1500.
        let events = extended([Some(1010), Some(1010), Some(490), Some(490), Some(490)]);
        let found = check(&events, &[], &[]);
        assert_eq!(categories(&found), ["validity overstated"]);
        // The read's own latency is no excuse and no accuser: 1 % and 5 ms of slack.
        let close = extended([Some(1010), Some(1010), Some(985), Some(985), Some(985)]);
        assert_eq!(check(&close, &[], &[]), vec![]);
    }

    #[test]
    fn injected_key_loss_since_the_guard_began_is_not_held_against_it() {
        let mut events = extended([Some(1010), Some(1010), Some(-2), Some(-2), Some(-2)]);
        for n in 2..4 {
            events.push(Event::Fault {
                at: t(300),
                node: Some(n),
                kind: FaultKind::KeyLoss,
                what: format!("restart node-{n}"),
            });
        }
        assert_eq!(check(&events, &[], &[]), vec![]);
    }

    /// A node whose clock stepped forward holds the lock that much less, and no less: a
    /// 5 ms step of the host's clock must not take every node out of judgement.
    #[test]
    fn a_clock_step_forward_excuses_its_size_only() {
        let step = |by: u64| -> Vec<Event> {
            (0..5)
                .map(|n| Event::Fault {
                    at: t(300),
                    node: Some(n),
                    kind: FaultKind::ClockForward(Duration::from_millis(by)),
                    what: format!("host clock +{by} ms"),
                })
                .collect()
        };
        let short = [Some(1010), Some(1010), Some(490), Some(490), Some(490)];
        let mut small = extended(short);
        small.extend(step(5));
        assert_eq!(
            categories(&check(&small, &[], &[])),
            ["validity overstated"]
        );
        let mut large = extended(short);
        large.extend(step(600));
        assert_eq!(check(&large, &[], &[]), vec![]);
    }
}
