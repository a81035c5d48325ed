//! Holders and their claim windows: who claimed which key, from its acquisition until its
//! validity ended (extensions included) or its release began.

use std::collections::HashMap;
use std::fmt;

use super::{ms, short};
use crate::history::{At, Event};

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
    /// The owner, for a hold of a reentrant lock.
    pub owner: Option<String>,
}

impl Holder {
    /// Whether `self` and `other` may claim the key at once: two holds of one reentrant
    /// lock's owner share it (the owner is one party, its holds counted on the nodes).
    pub fn shares_with(&self, other: &Holder) -> bool {
        self.owner.is_some() && self.owner == other.owner
    }
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
        )?;
        match &self.owner {
            Some(owner) => write!(f, " (a hold of owner {})", short(owner)),
            None => Ok(()),
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
            owner,
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
                owner: owner.clone(),
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

#[cfg(test)]
mod tests {
    use super::super::check;
    use super::super::fixtures::*;
    use super::*;

    #[test]
    fn a_release_ends_the_claim_before_validity() {
        let h = holders(&clean());
        assert_eq!(h[0].until, t(20));
        assert_eq!(h[1].until, t(40));
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
}
