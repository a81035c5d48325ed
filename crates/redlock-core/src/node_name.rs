//! A node's name as the library shows it: its URL with every part that may be a secret
//! masked.

use std::fmt;
use std::sync::Arc;

/// A node's URL with any password masked, as it appears in reports, errors and logs.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct NodeName(Arc<str>);

impl NodeName {
    /// The name of the node at `url`: the URL with any password replaced by `***`, and a
    /// user given without a password too (`redis://secret@host` is read as a user name,
    /// but is often meant as the password), and any query (`?sentinelPassword=...`). Of an
    /// unparsable URL with an `@` in it, everything between the scheme and the last `@`
    /// (where a user and password would be) is replaced by `***`, so that an error can
    /// still show which node's URL is wrong. Use it wherever a node URL is shown.
    pub fn redacted(url: &str) -> Self {
        let shown = match url::Url::parse(url) {
            // An `@` past the host: a password with a `/`, `?` or `#` in it, not
            // percent-encoded, ended the host early, so part of it reads as the path.
            Ok(parsed) if after_host_has_at(&parsed) => masked_query(masked_user_info(url)),
            // Unusable input is rejected elsewhere; never echo what may hold a password.
            Ok(parsed) if parsed.cannot_be_a_base() && url.contains('@') => {
                masked_query(masked_user_info(url))
            }
            Ok(parsed) if parsed.cannot_be_a_base() => masked_query(url.to_string()),
            Ok(mut parsed) => {
                if parsed.password().is_some() {
                    let _ = parsed.set_password(Some("***"));
                } else if !parsed.username().is_empty() {
                    let _ = parsed.set_username("***");
                }
                if parsed.query().is_some() {
                    parsed.set_query(Some("***"));
                }
                parsed.to_string()
            }
            Err(_) if url.contains('@') => masked_query(masked_user_info(url)),
            Err(_) => masked_query(url.to_string()),
        };
        NodeName(shown.into())
    }

    /// The masked URL.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The masked URL, shared (for metric labels: a clone of the `Arc`, no copy).
    pub(crate) fn shared(&self) -> Arc<str> {
        self.0.clone()
    }
}

/// Whether the path, query or fragment of `url` holds an `@`.
fn after_host_has_at(url: &url::Url) -> bool {
    let has_at = |part: Option<&str>| part.is_some_and(|part| part.contains('@'));
    has_at(Some(url.path())) || has_at(url.query()) || has_at(url.fragment())
}

/// `shown` with everything after its first `?` replaced by `***`: the query of a URL that
/// did not parse may still hold a password (`?password=...`, `?sentinelPassword=...`).
fn masked_query(shown: String) -> String {
    match shown.find('?') {
        Some(at) => format!("{}?***", &shown[..at]),
        None => shown,
    }
}

/// `url` with what lies between its scheme's `://` (or its start) and its last `@`
/// replaced by `***`: a password may hold any character, `@` included, but not past the
/// last `@`.
fn masked_user_info(url: &str) -> String {
    let at = url.rfind('@').unwrap_or(0);
    let start = url.find("://").map_or(0, |i| i + 3);
    if start > at {
        return "<unparsable URL>".to_string();
    }
    format!("{}***{}", &url[..start], &url[at..])
}

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_mask_passwords() {
        assert_eq!(
            NodeName::redacted("redis://u:secret@h:1/2").as_str(),
            "redis://u:***@h:1/2"
        );
        assert_eq!(NodeName::redacted("redis://h:1").as_str(), "redis://h:1");
        // A user without a password (often a password meant), and a query (fred reads
        // `sentinelPassword` there): neither shows, since either may be a secret.
        assert_eq!(
            NodeName::redacted("redis://s3cret@h:1").as_str(),
            "redis://***@h:1"
        );
        assert_eq!(
            NodeName::redacted("redis://h:1/0?sentinelPassword=s3cret").as_str(),
            "redis://h:1/0?***"
        );
        assert_eq!(
            NodeName::redacted("rediss://u:p@h:1?x=1").as_str(),
            "rediss://u:***@h:1?***"
        );
        // Unparsable: the user and password go, the host stays to say which node.
        assert_eq!(NodeName::redacted("x:y@z ::").as_str(), "***@z ::");
        assert_eq!(
            NodeName::redacted("redis://u:p@ss/w@[::1:2").as_str(),
            "redis://***@[::1:2"
        );
        assert_eq!(
            NodeName::redacted("redis://h@st:1@").as_str(),
            "redis://***@"
        );
        assert_eq!(NodeName::redacted("a@b://c").as_str(), "<unparsable URL>");
        // Unparsable with a query: the query goes too, never echoed as given.
        assert_eq!(
            NodeName::redacted("redis://h:65536/0?password=s3cret").as_str(),
            "redis://h:65536/0?***"
        );
        assert_eq!(
            NodeName::redacted("redis://u:p@h:65536?sentinelPassword=s3cret").as_str(),
            "redis://***@h:65536?***"
        );
        assert_eq!(NodeName::redacted("h?password=x").as_str(), "h?***");
        // A password whose `/`, `?` or `#` was not percent-encoded parses with part of it
        // in the path, query or fragment: none of it shows.
        for url in [
            "redis://u:p@s/w@h:1",
            "redis://u:p@s?w@h:1",
            "redis://u:p@s#w@h:1",
            "redis://:p/w@h:1",
        ] {
            let shown = NodeName::redacted(url);
            assert!(!shown.as_str().contains('w'), "{url} shown as {shown}");
        }
    }
}
