//! The safety checker: reads a scenario's history, the token observations and the keys left
//! on the nodes, and reports every violation it can prove.
//!
//! Pure functions of their inputs, so each rule is unit-tested below with a hand-made
//! history that contains exactly one violation (the negative controls of the checker itself).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use crate::history::{At, Event, FaultKind};

/// Slack for comparing server-side expiry estimates (PTTL is whole milliseconds, the sampling
/// round trip is a few; 20 ms also absorbs a 1 % clock-rate difference over a 1 s TTL).
const EXPIRY_SLACK: Duration = Duration::from_millis(20);
/// Slack around fault times and release starts: an observation's reply can arrive a little
/// after the event that explains it.
pub const EVENT_SLACK: Duration = Duration::from_millis(5);

/// What one sample of a key on one node showed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    /// The node's index.
    pub node: usize,
    /// The key sampled.
    pub key: String,
    /// When the sample was sent.
    pub sent: At,
    /// When its reply arrived.
    pub received: At,
    /// The value (token) the key held, if any.
    pub token: Option<String>,
    /// `PTTL` in the node's milliseconds (`-2` when missing).
    pub pttl: i64,
}

/// A key found on a node after the scenario ended, clients shut down and faults healed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leftover {
    /// The node's name.
    pub node: String,
    /// The key.
    pub key: String,
    /// Its value.
    pub value: Option<String>,
    /// Its `PTTL`.
    pub pttl: i64,
}

/// A holder: which client held which token, when.
#[derive(Clone, Debug, PartialEq)]
pub struct Holder {
    /// The client.
    pub client: String,
    /// The token.
    pub token: String,
    /// The key.
    pub key: String,
    /// When it acquired.
    pub from: At,
    /// When it stopped claiming the lock: the end of its validity, or the start of its
    /// release if that came first.
    pub until: At,
}

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
            Violation::Rule(_) => "scenario rule",
        }
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1}ms", d.as_secs_f64() * 1000.0)
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (token {}) on {} from {} until {}",
            self.client,
            short(&self.token),
            self.key,
            ms(self.from),
            ms(self.until)
        )
    }
}

fn short(token: &str) -> &str {
    token.get(..8).unwrap_or(token)
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
            } => match claim_ended {
                Some(end) => write!(
                    f,
                    "stale write: {client} (token {}) wrote at {} but its claim ended at {}",
                    short(token),
                    ms(*at),
                    ms(*end)
                ),
                None => write!(
                    f,
                    "stale write: {client} (token {}) wrote at {} without ever holding the lock",
                    short(token),
                    ms(*at)
                ),
            },
            Violation::LeftBehind(l) => write!(
                f,
                "key left behind: {} on {} (value {:?}, pttl {} ms) after every client released \
                 and all faults were healed",
                l.key,
                l.node,
                l.value.as_deref().map(short),
                l.pttl
            ),
            Violation::RemovedEarly {
                node,
                key,
                holder,
                seen_at,
                gone_by,
            } => write!(
                f,
                "token removed early: {key} on node-{node} held {}'s token at {} and was gone by \
                 {}, while {holder} (no owner release, no injected key loss: deleted by a \
                 non-owner or expired before its TTL)",
                holder.client,
                ms(*seen_at),
                ms(*gone_by)
            ),
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
            Violation::Rule(rule) => f.write_str(rule),
        }
    }
}

/// Every holder in `events`, with its claim window (extensions included).
pub fn holders(events: &[Event]) -> Vec<Holder> {
    let mut holders: Vec<Holder> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for event in events {
        if let Event::Acquired {
            client,
            token,
            key,
            acquired,
            valid_until,
            ..
        } = event
        {
            index.insert(token, holders.len());
            holders.push(Holder {
                client: client.clone(),
                token: token.clone(),
                key: key.clone(),
                from: *acquired,
                until: *valid_until,
            });
        }
    }
    for event in events {
        if let Event::Extend {
            token,
            valid_until: Some(v),
            ..
        } = event
        {
            if let Some(&i) = index.get(token.as_str()) {
                holders[i].until = holders[i].until.max(*v);
            }
        }
    }
    for event in events {
        if let Event::ReleaseStarted { token, at, .. } = event {
            if let Some(&i) = index.get(token.as_str()) {
                holders[i].until = holders[i].until.min(*at);
            }
        }
    }
    holders
}

/// Runs every rule and returns the violations found, in a stable order.
pub fn check(
    events: &[Event],
    observations: &[Observation],
    leftovers: &[Leftover],
) -> Vec<Violation> {
    let holders = holders(events);
    let mut found = overlaps(&holders);
    found.extend(write_violations(events, &holders));
    found.extend(leftovers.iter().cloned().map(Violation::LeftBehind));
    found.extend(token_violations(events, observations, &holders));
    found
}

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
        if claim_ended.map_or(true, |end| at > end) {
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
    use super::*;

    fn t(ms: u64) -> At {
        Duration::from_millis(ms)
    }

    fn acquired(client: &str, token: &str, from: u64, until: u64) -> Event {
        Event::Acquired {
            client: client.into(),
            token: token.into(),
            key: "k".into(),
            started: t(from.saturating_sub(2)),
            acquired: t(from),
            valid_until: t(until),
        }
    }

    fn released(client: &str, token: &str, at: u64) -> Event {
        Event::ReleaseStarted {
            client: client.into(),
            token: token.into(),
            at: t(at),
        }
    }

    fn write(client: &str, token: &str, at: u64, read: u64) -> Event {
        Event::Write {
            client: client.into(),
            token: token.into(),
            read_at: t(at - 1),
            wrote_at: t(at),
            read,
            wrote: read + 1,
        }
    }

    fn obs(node: usize, sent: u64, token: Option<&str>, pttl: i64) -> Observation {
        Observation {
            node,
            key: "k".into(),
            sent: t(sent),
            received: t(sent + 1),
            token: token.map(str::to_owned),
            pttl,
        }
    }

    fn categories(v: &[Violation]) -> Vec<&'static str> {
        v.iter().map(Violation::category).collect()
    }

    /// A clean hand-off: A releases, B acquires after; each writes once inside its claim.
    fn clean() -> Vec<Event> {
        vec![
            acquired("a", "ta", 0, 1000),
            write("a", "ta", 10, 0),
            released("a", "ta", 20),
            acquired("b", "tb", 25, 1025),
            write("b", "tb", 30, 1),
            released("b", "tb", 40),
        ]
    }

    #[test]
    fn a_clean_history_has_no_violation() {
        let observations = [
            obs(0, 5, Some("ta"), 995),
            obs(0, 22, None, -2),
            obs(0, 27, Some("tb"), 998),
            obs(0, 35, Some("tb"), 993),
        ];
        assert_eq!(check(&clean(), &observations, &[]), vec![]);
    }

    #[test]
    fn a_release_ends_the_claim_before_validity() {
        let h = holders(&clean());
        assert_eq!(h[0].until, t(20));
        assert_eq!(h[1].until, t(40));
    }

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

    #[test]
    fn an_extension_lengthens_the_claim() {
        let mut events = vec![acquired("a", "ta", 0, 1000)];
        events.push(Event::Extend {
            client: "a".into(),
            token: "ta".into(),
            started: t(800),
            ended: t(805),
            valid_until: Some(t(1800)),
        });
        events.push(acquired("b", "tb", 1200, 2200));
        assert_eq!(categories(&check(&events, &[], &[])), ["overlap"]);
    }

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

    #[test]
    fn leftover_keys_are_reported() {
        let left = Leftover {
            node: "node-1".into(),
            key: "k".into(),
            value: Some("ta".into()),
            pttl: 400,
        };
        assert_eq!(
            categories(&check(&clean(), &[], &[left])),
            ["key left behind"]
        );
    }

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
