//! The compare-token Lua scripts. Each checks that the key still holds our token before it
//! touches it, so a holder whose lock expired can never delete or extend a newer holder's
//! key (guarantee G3).

use std::sync::LazyLock;

/// A Lua script with its SHA-1, computed once.
#[derive(Debug)]
pub struct Script {
    source: &'static str,
    sha: String,
}

impl Script {
    /// A script from its source.
    pub fn new(source: &'static str) -> Self {
        Script {
            source,
            sha: fred::util::sha1_hash(source),
        }
    }

    /// The Lua source.
    pub fn source(&self) -> &'static str {
        self.source
    }

    /// The SHA-1 that `EVALSHA` names it by.
    pub fn sha(&self) -> &str {
        &self.sha
    }
}

/// `KEYS[1]` = key, `ARGV[1]` = token: delete the key if it holds the token. Returns 1 when
/// deleted, 0 otherwise.
pub static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0"#,
    )
});

/// `KEYS[1]` = key, `ARGV[1]` = token, `ARGV[2]` = TTL in ms: reset the key's TTL if it
/// holds the token. Returns 1 when extended, 0 otherwise. `PEXPIRE` on a missing key does
/// nothing, so an extension never recreates a lock that expired.
pub static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("PEXPIRE", KEYS[1], ARGV[2])
end
return 0"#,
    )
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha_matches_the_source() {
        // SHA-1 of the empty string, as Redis would compute it for SCRIPT LOAD "".
        assert_eq!(
            Script::new("").sha(),
            "da39a3ee5e6b4b0d3255bfef95601890afd80709"
        );
        assert_eq!(RELEASE.sha().len(), 40);
        assert_ne!(RELEASE.sha(), EXTEND.sha());
    }
}
