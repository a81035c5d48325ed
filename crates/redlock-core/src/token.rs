//! Lock tokens: the proof of ownership that every compare-and-delete checks.

use std::fmt;

use fred::bytes_utils::Str;

use crate::error::ArgumentError;
use crate::message::HANDOVER_MARK;

/// A random value that identifies one acquisition attempt.
///
/// A UUID v4 (122 random bits from `rand`'s thread generator, a ChaCha12 CSPRNG seeded and
/// reseeded from the operating system's, with no system call per token): unguessable and
/// never reused, so a stale holder can never delete or extend a newer holder's key. Its `Debug`
/// and `Display` show only a prefix, so logs do not carry a value that could release the
/// lock.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Token(Str);

impl Token {
    /// A fresh random token.
    pub fn random() -> Self {
        let id = uuid::Builder::from_random_bytes(rand::random()).into_uuid();
        Token(Str::from(id.simple().to_string()))
    }

    /// A token from a caller's own value (for example one stored to release a lock from
    /// another process). It must be unique per acquisition: reusing a token lets two
    /// attempts pass for one owner. An acquisition refuses a token with `~` in it (the mark
    /// of a key handed over to a fair waiter); a release or extension takes one, such as a
    /// handed-over lock's token.
    pub fn from_string(value: impl Into<String>) -> Self {
        Token(Str::from(value.into()))
    }

    /// The full value, as stored in Redis.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub(crate) fn as_fred(&self) -> &Str {
        &self.0
    }

    /// Checks a token before it is stored: not empty, at most [`MAX_TOKEN_LEN`] bytes, and
    /// no white space or control characters (release notifications carry `"<token> <key>"`,
    /// so a space in a token would name the wrong key).
    pub(crate) fn check(&self) -> Result<(), ArgumentError> {
        let reason = if self.0.is_empty() {
            "it is empty"
        } else if self.0.len() > MAX_TOKEN_LEN {
            "it is longer than 512 bytes"
        } else if has_space_or_control(&self.0) {
            "it contains white space or control characters"
        } else {
            return Ok(());
        };
        Err(ArgumentError::InvalidToken {
            reason: reason.into(),
        })
    }

    /// Checks a caller's token for an acquisition, beside [`check`](Self::check): no `~`.
    /// Only the nodes' release scripts write hand-over tokens (`"<waiter>~<number>"`, see
    /// `support::handover_token`), and a lock whose token looked like one
    /// would be taken on by that fair waiter's next attempt while its holder still held it.
    /// Releases and extensions take such a token: a handed-over lock's.
    pub(crate) fn check_not_handover(&self) -> Result<(), ArgumentError> {
        if self.0.contains(HANDOVER_MARK) {
            return Err(ArgumentError::InvalidToken {
                reason: "it contains '~', which marks a key handed over to a fair waiter".into(),
            });
        }
        Ok(())
    }
}

/// The longest caller-given token, in bytes: far more than any unique identifier needs, and
/// every round sends it to every node.
pub const MAX_TOKEN_LEN: usize = 512;

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({self})")
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&abbreviated(&self.0))
    }
}

/// The first eight characters of a value that lets its bearer act as a lock's holder (a
/// token, an owner), then `…`: enough to tell values apart in logs, not to use one.
pub(crate) fn abbreviated(secret: &str) -> String {
    let prefix: String = secret.chars().take(8).collect();
    format!("{prefix}…")
}

/// Whether `text` has white space or control characters; printable ASCII (every token this
/// library makes) is told apart by its bytes alone.
fn has_space_or_control(text: &str) -> bool {
    !text.bytes().all(|b| b.is_ascii_graphic())
        && text.chars().any(|c| c.is_whitespace() || c.is_control())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_tokens_are_unique_and_128_bit_hex() {
        let a = Token::random();
        let b = Token::random();
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 32);
        assert!(a.as_str().chars().all(|c| c.is_ascii_hexdigit()));
        // A UUID v4: version nibble 4, RFC 4122 variant (8, 9, a or b).
        assert_eq!(&a.as_str()[12..13], "4");
        assert!("89ab".contains(&a.as_str()[16..17]));
        let many: std::collections::HashSet<Token> = (0..10_000).map(|_| Token::random()).collect();
        assert_eq!(many.len(), 10_000);
    }

    #[test]
    fn an_acquisition_token_may_not_look_like_a_hand_over() {
        assert!(Token::random().check_not_handover().is_ok());
        assert!(Token::from_string("worker-1~7").check().is_ok());
        assert!(matches!(
            Token::from_string("worker-1~7").check_not_handover(),
            Err(ArgumentError::InvalidToken { .. })
        ));
        let handed = Token::from_string(crate::message::handover_token_text("w", 1));
        assert!(handed.check_not_handover().is_err());
    }

    #[test]
    fn caller_tokens_are_checked() {
        assert!(Token::random().check().is_ok());
        assert!(Token::from_string("job-17/attempt-2").check().is_ok());
        assert!(Token::from_string("café-7").check().is_ok());
        for bad in [
            String::new(),
            "two words".into(),
            "tab\there".into(),
            "nul\0".into(),
            "no\u{a0}break".into(),
            "x".repeat(MAX_TOKEN_LEN + 1),
        ] {
            assert!(
                matches!(
                    Token::from_string(bad.clone()).check(),
                    Err(ArgumentError::InvalidToken { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn debug_and_display_do_not_leak_the_token() {
        let t = Token::from_string("0123456789abcdef0123456789abcdef");
        assert_eq!(t.to_string(), "01234567…");
        assert!(!format!("{t:?}").contains("89abcdef0123"));
    }
}
