//! Hand-made histories for the checker's unit tests.

use std::time::Duration;

use super::{Observation, Violation};
use crate::history::{At, Event};

pub(super) fn t(ms: u64) -> At {
    Duration::from_millis(ms)
}

pub(super) fn acquired(client: &str, token: &str, from: u64, until: u64) -> Event {
    Event::Acquired {
        client: client.into(),
        token: token.into(),
        key: "k".into(),
        started: t(from.saturating_sub(2)),
        acquired: t(from),
        valid_until: t(until),
        fencing: None,
        owner: None,
    }
}

/// A hold of the reentrant lock of `owner`.
pub(super) fn held_by(client: &str, token: &str, owner: &str, from: u64, until: u64) -> Event {
    let Event::Acquired {
        client,
        token,
        key,
        started,
        acquired,
        valid_until,
        fencing,
        ..
    } = acquired(client, token, from, until)
    else {
        unreachable!()
    };
    Event::Acquired {
        client,
        token,
        key,
        started,
        acquired,
        valid_until,
        fencing,
        owner: Some(owner.into()),
    }
}

/// `event` (an acquisition) on `key`.
pub(super) fn on_key(mut event: Event, key: &str) -> Event {
    if let Event::Acquired { key: k, .. } = &mut event {
        *k = key.into();
    }
    event
}

/// Semaphore `name` declared, its holders' keys under `keys`.
pub(super) fn semaphore(name: &str, keys: &str, permits: u32) -> Event {
    Event::Semaphore {
        name: name.into(),
        keys: keys.into(),
        permits,
    }
}

/// Read-write lock `name` declared, its writers on `w`, its readers on `r`.
pub(super) fn rwlock(name: &str) -> Event {
    Event::RwLock {
        name: name.into(),
        writers: "w".into(),
        readers: "r".into(),
    }
}

/// A fenced acquisition that began at `started` and handed out `fencing` at `acquired`,
/// released at once (its claim ends 1 ms later).
pub(super) fn fenced_between(
    client: &str,
    token: &str,
    started: u64,
    acquired: u64,
    fencing: u64,
) -> Event {
    Event::Acquired {
        client: client.into(),
        token: token.into(),
        key: "k".into(),
        started: t(started),
        acquired: t(acquired),
        valid_until: t(acquired + 1),
        fencing: Some(fencing),
        owner: None,
    }
}

/// `event` (an acquisition) as a hold of a reentrant lock's `owner`.
pub(super) fn with_owner(mut event: Event, owner: &str) -> Event {
    if let Event::Acquired { owner: o, .. } = &mut event {
        *o = Some(owner.into());
    }
    event
}

pub(super) fn released(client: &str, token: &str, at: u64) -> Event {
    Event::ReleaseStarted {
        client: client.into(),
        token: token.into(),
        at: t(at),
    }
}

pub(super) fn write(client: &str, token: &str, at: u64, read: u64) -> Event {
    Event::Write {
        client: client.into(),
        token: token.into(),
        read_at: t(at - 1),
        wrote_at: t(at),
        read,
        wrote: read + 1,
    }
}

pub(super) fn obs(node: usize, sent: u64, token: Option<&str>, pttl: i64) -> Observation {
    Observation {
        node,
        key: "k".into(),
        sent: t(sent),
        received: t(sent + 1),
        token: token.map(str::to_owned),
        pttl,
        holds: Vec::new(),
    }
}

pub(super) fn categories(v: &[Violation]) -> Vec<&'static str> {
    v.iter().map(Violation::category).collect()
}

/// A clean hand-off: A releases, B acquires after; each writes once inside its claim.
pub(super) fn clean() -> Vec<Event> {
    vec![
        acquired("a", "ta", 0, 1000),
        write("a", "ta", 10, 0),
        released("a", "ta", 20),
        acquired("b", "tb", 25, 1025),
        write("b", "tb", 30, 1),
        released("b", "tb", 40),
    ]
}
