//! How a client reaches a node: its listeners and credentials ([`Node::tls_port`],
//! [`Node::unix_socket`], [`Node::password`], [`Node::pki`]) and the URLs, in the forms
//! fred's `Config::from_url` reads:
//!
//! | way in | URL |
//! |---|---|
//! | plain TCP | `redis://127.0.0.1:PORT`, `redis://:PASSWORD@127.0.0.1:PORT` |
//! | TLS | `rediss://localhost:TLS_PORT`, `rediss://:PASSWORD@localhost:TLS_PORT` |
//! | unix socket | `redis+unix:///DIR/redis.sock`, `redis+unix://:PASSWORD@localhost/DIR/redis.sock` |
//! | ACL user (`*_as`) | `USER:PASSWORD@` in place of `:PASSWORD@` |
//!
//! User names and passwords are percent-encoded (everything but `A-Z a-z 0-9 - . _ ~`);
//! fred decodes them. TLS URLs name `localhost`, a name of the default server certificate,
//! so a client verifies the certificate against it. fred reads a unix URL's credentials only
//! with a host, which it then ignores: hence `localhost` there.

use std::path::Path;

use crate::port::PortReservation;
use crate::{Node, NodeSet, TestPki};

/// The loopback address of the plain port.
const LOOPBACK: &str = "127.0.0.1";
/// The host of TLS and unix URLs (see the module docs).
const LOCALHOST: &str = "localhost";

impl Node {
    /// The TLS port (`--tls-port`), if the node was started with
    /// [`NodeOptions::tls`](crate::NodeOptions::tls); it stays the same across restarts.
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port.as_ref().map(PortReservation::port)
    }

    /// The unix socket (`<dir>/redis.sock`, permissions `700`), if the node was started with
    /// [`NodeOptions::unix_socket`](crate::NodeOptions::unix_socket).
    pub fn unix_socket(&self) -> Option<&Path> {
        self.unix_socket.as_deref()
    }

    /// The certificates of the node's set, if it was started with
    /// [`NodeOptions::tls`](crate::NodeOptions::tls).
    pub fn pki(&self) -> Option<&TestPki> {
        self.pki.as_deref()
    }

    /// The password of the `default` user
    /// ([`NodeOptions::password`](crate::NodeOptions::password)), if any.
    pub fn password(&self) -> Option<&str> {
        self.opts.password.as_deref()
    }

    /// `redis://127.0.0.1:PORT`, or `redis://:PASSWORD@127.0.0.1:PORT` with
    /// [`NodeOptions::password`](crate::NodeOptions::password).
    pub fn url(&self) -> String {
        tcp_url("redis", LOOPBACK, self.port(), None, self.password())
    }

    /// `redis://USER:PASSWORD@127.0.0.1:PORT`: the plain port as an ACL user (see
    /// [`NodeOptions::acl_users`](crate::NodeOptions::acl_users)).
    pub fn url_as(&self, user: &str, password: &str) -> String {
        tcp_url("redis", LOOPBACK, self.port(), Some(user), Some(password))
    }

    /// `rediss://localhost:TLS_PORT` (with `:PASSWORD@` when the node has a password), if the
    /// node was started with [`NodeOptions::tls`](crate::NodeOptions::tls). Clients trust
    /// [`TestPki::ca_pem`](crate::TestPki::ca_pem).
    pub fn tls_url(&self) -> Option<String> {
        let port = self.tls_port()?;
        Some(tcp_url("rediss", LOCALHOST, port, None, self.password()))
    }

    /// `rediss://USER:PASSWORD@localhost:TLS_PORT`, if the node has a TLS port.
    pub fn tls_url_as(&self, user: &str, password: &str) -> Option<String> {
        let port = self.tls_port()?;
        Some(tcp_url(
            "rediss",
            LOCALHOST,
            port,
            Some(user),
            Some(password),
        ))
    }

    /// `redis+unix:///DIR/redis.sock`, or `redis+unix://:PASSWORD@localhost/DIR/redis.sock`
    /// with a password, if the node was started with
    /// [`NodeOptions::unix_socket`](crate::NodeOptions::unix_socket). fred reads it with its
    /// `unix-sockets` feature.
    pub fn unix_url(&self) -> Option<String> {
        Some(unix_url(self.unix_socket()?, None, self.password()))
    }

    /// `redis+unix://USER:PASSWORD@localhost/DIR/redis.sock`, if the node has a unix socket.
    pub fn unix_url_as(&self, user: &str, password: &str) -> Option<String> {
        Some(unix_url(self.unix_socket()?, Some(user), Some(password)))
    }
}

impl NodeSet {
    /// [`Node::url`] of every node, in index order: `redis://127.0.0.1:PORT`, with
    /// `:PASSWORD@` when the set has a password.
    pub fn urls(&self) -> Vec<String> {
        self.iter().map(Node::url).collect()
    }

    /// [`Node::url_as`] of every node, in index order.
    pub fn urls_as(&self, user: &str, password: &str) -> Vec<String> {
        self.iter().map(|n| n.url_as(user, password)).collect()
    }

    /// [`Node::tls_url`] of every node, in index order; `None` unless the set was started
    /// with [`NodeOptions::tls`](crate::NodeOptions::tls).
    pub fn tls_urls(&self) -> Option<Vec<String>> {
        self.iter().map(Node::tls_url).collect()
    }

    /// [`Node::tls_url_as`] of every node, in index order; `None` without TLS.
    pub fn tls_urls_as(&self, user: &str, password: &str) -> Option<Vec<String>> {
        self.iter().map(|n| n.tls_url_as(user, password)).collect()
    }

    /// [`Node::unix_url`] of every node, in index order; `None` unless the set was started
    /// with [`NodeOptions::unix_socket`](crate::NodeOptions::unix_socket).
    pub fn unix_urls(&self) -> Option<Vec<String>> {
        self.iter().map(Node::unix_url).collect()
    }

    /// [`Node::unix_url_as`] of every node, in index order; `None` without unix sockets.
    pub fn unix_urls_as(&self, user: &str, password: &str) -> Option<Vec<String>> {
        self.iter().map(|n| n.unix_url_as(user, password)).collect()
    }
}

/// `SCHEME://[USER][:PASSWORD@]HOST:PORT`.
fn tcp_url(
    scheme: &str,
    host: &str,
    port: u16,
    user: Option<&str>,
    password: Option<&str>,
) -> String {
    format!("{scheme}://{}{host}:{port}", userinfo(user, password))
}

/// `redis+unix:///PATH`, or `redis+unix://[USER]:PASSWORD@localhost/PATH`.
fn unix_url(path: &Path, user: Option<&str>, password: Option<&str>) -> String {
    let auth = userinfo(user, password);
    let host = if auth.is_empty() { "" } else { LOCALHOST };
    format!("redis+unix://{auth}{host}{}", path.display())
}

/// `USER:PASSWORD@`, `:PASSWORD@`, `USER@` or nothing, percent-encoded.
fn userinfo(user: Option<&str>, password: Option<&str>) -> String {
    match (user, password) {
        (None, None) => String::new(),
        (user, None) => format!("{}@", encode(user.unwrap_or_default())),
        (user, Some(password)) => {
            format!("{}:{}@", encode(user.unwrap_or_default()), encode(password))
        }
    }
}

/// Percent-encodes every byte but the unreserved characters of RFC 3986.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_urls() {
        assert_eq!(
            tcp_url("redis", LOOPBACK, 7000, None, None),
            "redis://127.0.0.1:7000"
        );
        assert_eq!(
            tcp_url("redis", LOOPBACK, 7000, None, Some("pw")),
            "redis://:pw@127.0.0.1:7000"
        );
        assert_eq!(
            tcp_url("rediss", LOCALHOST, 7001, Some("locker"), Some("s3")),
            "rediss://locker:s3@localhost:7001"
        );
    }

    #[test]
    fn unix_urls() {
        let path = Path::new("/tmp/n/redis.sock");
        assert_eq!(unix_url(path, None, None), "redis+unix:///tmp/n/redis.sock");
        assert_eq!(
            unix_url(path, None, Some("pw")),
            "redis+unix://:pw@localhost/tmp/n/redis.sock"
        );
        assert_eq!(
            unix_url(path, Some("u"), Some("pw")),
            "redis+unix://u:pw@localhost/tmp/n/redis.sock"
        );
    }

    #[test]
    fn credentials_are_percent_encoded() {
        assert_eq!(encode("a-Z.0_~"), "a-Z.0_~");
        assert_eq!(encode("p@ss:w/rd %é"), "p%40ss%3Aw%2Frd%20%25%C3%A9");
        assert_eq!(userinfo(Some("u"), None), "u@");
        assert_eq!(userinfo(None, Some("a b")), ":a%20b@");
    }

    /// fred's own parser reads the credentials back. (`rediss` URLs are left to the `url`
    /// test below: fred's parser builds a TLS connector for them when a TLS feature is on.)
    #[test]
    fn fred_reads_the_credentials_back() {
        let password = "p@ss:w/rd %é";
        let plain = tcp_url("redis", LOOPBACK, 7000, None, Some(password));
        let config = fred::prelude::Config::from_url(&plain).unwrap();
        assert_eq!(config.username, None);
        assert_eq!(config.password.as_deref(), Some(password));
        let user = tcp_url("redis", LOOPBACK, 7001, Some("lock er"), Some(password));
        let config = fred::prelude::Config::from_url(&user).unwrap();
        assert_eq!(config.username.as_deref(), Some("lock er"));
        assert_eq!(config.password.as_deref(), Some(password));
        let server = config.server.hosts()[0].clone();
        assert_eq!((&*server.host, server.port), (LOOPBACK, 7001));
    }

    #[test]
    fn tls_urls_parse_back() {
        let tls =
            url::Url::parse(&tcp_url("rediss", LOCALHOST, 7001, Some("u"), Some("a b"))).unwrap();
        assert_eq!(tls.scheme(), "rediss");
        assert_eq!((tls.host_str(), tls.port()), (Some(LOCALHOST), Some(7001)));
        assert_eq!((tls.username(), tls.password()), ("u", Some("a%20b")));
    }

    /// Unix URLs as fred's `from_url_unix` reads them (it needs fred's `unix-sockets` feature,
    /// which the testkit does not enable): `url::Url`, percent-decoded credentials and the raw
    /// path.
    #[test]
    fn unix_urls_parse_back_as_fred_reads_them() {
        let password = "p@ss:w/rd %é";
        let path = Path::new("/tmp/redlock-testkit-node-0-AbC/redis.sock");
        let unix = url::Url::parse(&unix_url(path, Some("locker"), Some(password))).unwrap();
        assert_eq!(unix.scheme(), "redis+unix");
        assert_eq!(unix.username(), "locker");
        assert_eq!(decode(unix.password().unwrap()), password);
        assert_eq!(Path::new(unix.path()), path);
        let bare = url::Url::parse(&unix_url(path, None, None)).unwrap();
        assert_eq!(Path::new(bare.path()), path);
        assert_eq!(bare.password(), None);
    }

    fn decode(text: &str) -> String {
        let bytes = text.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%' {
                out.push(u8::from_str_radix(&text[i + 1..i + 3], 16).unwrap());
                i += 3;
            } else {
                out.push(bytes[i]);
                i += 1;
            }
        }
        String::from_utf8(out).unwrap()
    }
}
