//! The release channel's wire format: what a node publishes when it frees a key or hands
//! it over to a fair waiter, and how a client reads it. The Lua that writes it (included in
//! the release scripts) and the parser live here together, from the same separators.
//!
//! | message | meaning |
//! | --- | --- |
//! | `<token> <key>` | `key` was released by the lock holding `token`; nobody queued is told |
//! | `<token>\t<waiter> <key>` | released, and `waiter` heads the key's queue: its client wakes it |
//! | `<token>\t<waiter>\t<waiter>~<n> <key>` | handed over to `waiter`, a fair one, under the token `<waiter>~<n>` (its attempt `n`) |
//!
//! Tokens and waiter ids hold no white space (both are checked before they reach a node),
//! so the first space ends the fields; keys may hold spaces. A message that names a waiter
//! `"<tag>:<rest>"` goes to the channel `"<channel>:<tag>"`, which only that waiter's
//! client subscribes to; the others go to `<channel>` itself. The token lets a client that
//! hears one release from several nodes count it once.

/// Separates a waiter id from its attempt number in a hand-over token: neither waiter ids
/// nor callers' tokens may hold it, or one waiter's id could begin another's token, and the
/// first would take that key on (or delete it) as its own.
pub const HANDOVER_MARK: char = '~';

/// Separates the message's fields (the token, the next waiter, the hand-over token).
const FIELD: char = '\t';

/// Separates the fields from the key.
const KEY: char = ' ';

/// Separates a waiter's client tag from the rest of its id, and a channel from the tag.
const TAG: char = ':';

/// The Lua functions the release scripts build messages with, written with the separators
/// above (a unit test checks that they agree):
///
/// - `release_message(token, waiter, handed, key)`: the message; `waiter` and `handed` may
///   be `nil`;
/// - `handover_token(waiter, number)`: the token a hand-over sets the key to;
/// - `handover_waiter(token)`: the waiter of a hand-over token, `nil` for another token;
/// - `handed_to(value, waiter)`: whether a key's `value` is a hand-over token of `waiter`;
/// - `waiter_channel(channel, waiter)`: the channel a message naming `waiter` goes to.
macro_rules! message_lua {
    () => {
        r#"local function release_message(token, waiter, handed, key)
  local fields = token
  if waiter then fields = fields .. "\t" .. waiter end
  if handed then fields = fields .. "\t" .. handed end
  return fields .. " " .. key
end
local function handover_token(waiter, number)
  return waiter .. "~" .. number
end
local function handover_waiter(token)
  return string.match(token, "^([^~]+)~%d+$")
end
local function handed_to(value, waiter)
  return type(value) == "string" and string.sub(value, 1, #waiter + 1) == waiter .. "~"
end
local function waiter_channel(channel, waiter)
  local tag = string.match(waiter, "^([^:]+):")
  if tag then return channel .. ":" .. tag end
  return channel
end
"#
    };
}
pub(crate) use message_lua;

/// What a release message says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release<'a> {
    /// The key was released by the lock with `token`; `head` is the queue's next waiter,
    /// whose client wakes it, when the queue has one.
    Announced {
        /// The released lock's token.
        token: &'a str,
        /// The key.
        key: &'a str,
        /// The queue's next waiter.
        head: Option<&'a str>,
    },
    /// The key was handed over to the queue's next waiter, a fair one, under `handed`.
    Handed {
        /// The released lock's token.
        token: &'a str,
        /// The waiter it was handed to.
        head: &'a str,
        /// The token the key now holds: `"<head>~<attempt>"`.
        handed: &'a str,
        /// The key.
        key: &'a str,
    },
}

impl<'a> Release<'a> {
    /// Reads a message; `None` for text that is not one.
    pub fn parse(text: &'a str) -> Option<Self> {
        let (fields, key) = text.split_once(KEY)?;
        let mut fields = fields.split(FIELD);
        let token = fields.next()?;
        Some(match (fields.next(), fields.next()) {
            (Some(head), Some(handed)) => Release::Handed {
                token,
                head,
                handed,
                key,
            },
            (head, _) => Release::Announced { token, key, head },
        })
    }

    /// The key released.
    pub fn key(&self) -> &'a str {
        match *self {
            Release::Announced { key, .. } | Release::Handed { key, .. } => key,
        }
    }
}

/// The message as the scripts write it.
impl std::fmt::Display for Release<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Release::Announced {
                token,
                key,
                head: None,
            } => write!(f, "{token}{KEY}{key}"),
            Release::Announced {
                token,
                key,
                head: Some(head),
            } => write!(f, "{token}{FIELD}{head}{KEY}{key}"),
            Release::Handed {
                token,
                head,
                handed,
                key,
            } => write!(f, "{token}{FIELD}{head}{FIELD}{handed}{KEY}{key}"),
        }
    }
}

/// The text of the token a release hands a key over under, to `waiter` for its attempt
/// `number`.
pub fn handover_token_text(waiter: &str, number: u64) -> String {
    format!("{waiter}{HANDOVER_MARK}{number}")
}

/// A waiter id `"<tag>:<rest>"`: releases that name it go to the channel of the client
/// with `tag` alone ([`waiter_channel`]).
pub fn tagged_waiter(tag: &str, rest: &str) -> String {
    format!("{tag}{TAG}{rest}")
}

/// The channel that messages naming a waiter of the client with `tag` go to.
pub fn waiter_channel(channel: &str, tag: &str) -> String {
    format!("{channel}{TAG}{tag}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_reads_back_as_written() {
        for release in [
            Release::Announced {
                token: "tok",
                key: "a key",
                head: None,
            },
            Release::Announced {
                token: "tok",
                key: "a key",
                head: Some("c1:w1"),
            },
            Release::Handed {
                token: "tok",
                head: "c1:w1",
                handed: "c1:w1~3",
                key: "a key",
            },
        ] {
            let text = release.to_string();
            assert_eq!(Release::parse(&text), Some(release), "{text:?}");
            assert_eq!(release.key(), "a key");
        }
        assert_eq!(Release::parse("no-key"), None);
    }

    #[test]
    fn the_wire_form_is_the_documented_one() {
        let handed = Release::Handed {
            token: "tok",
            head: "w",
            handed: &handover_token_text("w", 3),
            key: "k",
        }
        .to_string();
        assert_eq!(handed, "tok\tw\tw~3 k");
        assert_eq!(
            waiter_channel("redlock:released", "c1"),
            "redlock:released:c1"
        );
    }

    /// The Lua writes the same separators the parser reads.
    #[test]
    fn the_lua_uses_the_same_separators() {
        let lua = message_lua!();
        let field = FIELD.escape_default();
        assert!(
            lua.contains(&format!(r#"fields .. "{field}" .. waiter"#)),
            "{lua}"
        );
        assert!(
            lua.contains(&format!(r#"fields .. "{field}" .. handed"#)),
            "{lua}"
        );
        assert!(
            lua.contains(&format!(r#"fields .. "{KEY}" .. key"#)),
            "{lua}"
        );
        assert!(
            lua.contains(&format!(r#"waiter .. "{HANDOVER_MARK}" .. number"#)),
            "{lua}"
        );
        assert!(
            lua.contains(&format!(r#"waiter .. "{HANDOVER_MARK}""#)),
            "{lua}"
        );
        assert!(
            lua.contains(&format!(r#"channel .. "{TAG}" .. tag"#)),
            "{lua}"
        );
        assert!(lua.contains(&format!(r#""^([^{TAG}]+){TAG}""#)), "{lua}");
        let mark = HANDOVER_MARK;
        assert!(
            lua.contains(&format!(r#""^([^{mark}]+){mark}%d+$""#)),
            "{lua}"
        );
    }
}
