//! [`NodeOptions`]: how each node of a set is configured, and [`TlsNodeOptions`] for its TLS
//! listener. The secrets in them (the password, the passwords of ACL users) never show in
//! their `Debug` output.

use std::fmt;

use crate::access;

/// How each node is configured.
///
/// Secrets (`password`, the `>password` rules of `acl_users`) are redacted in its `Debug`
/// output and in every error and log tail the harness produces.
#[derive(Clone, Default)]
pub struct NodeOptions {
    /// `--appendonly yes --appendfsync always`, so data survives [`Node::restart`] and even
    /// [`Node::kill`]. Default `false`: `--save "" --appendonly no`, no persistence at all.
    ///
    /// [`Node::restart`]: crate::Node::restart
    /// [`Node::kill`]: crate::Node::kill
    pub appendonly_always: bool,
    /// Extra `redis-server` arguments, appended last (so they override the defaults),
    /// e.g. `["--hz", "100"]`.
    pub extra_args: Vec<String>,
    /// Run the server with a fake wall clock steered through [`Node::clock`] (jump, rate).
    /// Default `false`: the real clock. Needs a C compiler the first time (see
    /// [`ClockShim`](crate::ClockShim)).
    ///
    /// [`Node::clock`]: crate::Node::clock
    pub fake_clock: bool,
    /// `--requirepass`: the password of the `default` user. Default `None`: no password.
    ///
    /// The harness's own connections (readiness probe, [`RedisAt`](crate::RedisAt),
    /// [`NodeSet::nodes_holding`](crate::NodeSet::nodes_holding)) then authenticate with it,
    /// and every URL the harness hands out carries it (`redis://:PASSWORD@127.0.0.1:PORT`,
    /// percent-encoded). Must not be empty.
    pub password: Option<String>,
    /// Extra ACL users, one full rule line each without the word `user`, e.g.
    /// `"locker on >secret ~redlock:* &* +set +eval"`. Default: none.
    ///
    /// Each line becomes a `user` directive on the command line (`--user locker on >secret
    /// ...`), so the users exist as soon as the server answers. The rule is split at
    /// whitespace, one ACL rule per word, as in `redis.conf`: passwords cannot contain spaces.
    /// The `default` user stays as it is (no password unless [`NodeOptions::password`]);
    /// redefining `default` here would lock the harness's own probes out.
    pub acl_users: Vec<String>,
    /// A TLS listener on a second port ([`Node::tls_port`]) with certificates generated at
    /// start (see [`TestPki`](crate::TestPki)). Default `None`: plain TCP only.
    ///
    /// The plain `--port` stays open: the harness probes and inspects the node through it.
    ///
    /// [`Node::tls_port`]: crate::Node::tls_port
    pub tls: Option<TlsNodeOptions>,
    /// Also listen on a unix socket, `<node dir>/redis.sock` with permissions `700`
    /// ([`Node::unix_socket`]). Default `false`. The TCP port stays open for the harness.
    ///
    /// [`Node::unix_socket`]: crate::Node::unix_socket
    pub unix_socket: bool,
}

/// The TLS listener of a node ([`NodeOptions::tls`]).
///
/// The server presents a certificate signed by the set's CA ([`TestPki::ca_pem`]) whose
/// subject alternative names are `server_names`.
///
/// [`TestPki::ca_pem`]: crate::TestPki::ca_pem
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsNodeOptions {
    /// `--tls-auth-clients yes`: refuse clients that present no certificate signed by the
    /// set's CA (mutual TLS; use [`TestPki::client_cert_pem`](crate::TestPki::client_cert_pem)).
    /// Default `false` (`--tls-auth-clients no`).
    pub require_client_cert: bool,
    /// The subject alternative names of the server certificate: a name that parses as an IP
    /// address becomes an IP SAN, any other a DNS SAN. Default `["localhost", "127.0.0.1"]`.
    /// Must not be empty (TLS clients check the host they dial against these names).
    pub server_names: Vec<String>,
}

impl Default for TlsNodeOptions {
    fn default() -> Self {
        TlsNodeOptions {
            require_client_cert: false,
            server_names: vec!["localhost".to_owned(), "127.0.0.1".to_owned()],
        }
    }
}

impl fmt::Debug for NodeOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let acl_users: Vec<String> = self
            .acl_users
            .iter()
            .map(|rule| access::redact_rule(rule))
            .collect();
        f.debug_struct("NodeOptions")
            .field("appendonly_always", &self.appendonly_always)
            .field("extra_args", &self.extra_args)
            .field("fake_clock", &self.fake_clock)
            .field(
                "password",
                &self.password.as_ref().map(|_| access::REDACTED),
            )
            .field("acl_users", &acl_users)
            .field("tls", &self.tls)
            .field("unix_socket", &self.unix_socket)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_every_secret() {
        let opts = NodeOptions {
            password: Some("hunter2".to_owned()),
            acl_users: vec!["locker on >s3cret <old ~redlock:* +set".to_owned()],
            ..NodeOptions::default()
        };
        let shown = format!("{opts:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("old"),
            "{shown}"
        );
        assert!(
            shown.contains("locker on >*** <*** ~redlock:* +set"),
            "{shown}"
        );
        assert!(shown.contains("password: Some(\"***\")"), "{shown}");
    }

    #[test]
    fn tls_defaults_name_localhost_and_loopback() {
        let tls = TlsNodeOptions::default();
        assert!(!tls.require_client_cert);
        assert_eq!(tls.server_names, ["localhost", "127.0.0.1"]);
    }
}
