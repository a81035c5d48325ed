//! Why a node's connection failed, kept so that rounds can say it: a wrong password or a
//! database out of range is reported with the server's own words instead of fred's generic
//! "connection closed".

use std::sync::{Arc, Mutex, PoisonError};

use fred::clients::Client;
use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::EventInterface;
use tokio::sync::broadcast::error::RecvError;

use crate::report::NodeOutcome;
use crate::server_error::{ServerError, ServerErrorKind};

/// Why a node's connection failed (or was closed), as fred reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ConnectFailure {
    /// The server refused the credentials: `NOAUTH` (it needs a password and none was
    /// given), `WRONGPASS`, or a password given to a server that has none.
    Auth(String),
    /// The server refused the database of the URL (`SELECT`: index out of range).
    Database(String),
    /// The TLS handshake failed: an untrusted or expired certificate, a name mismatch, or a
    /// server that wants a client certificate.
    Tls(String),
    /// The server requires a client certificate (mutual TLS) and got none it accepts: it
    /// said so with a `certificate required` alert. With TLS 1.3 the client sees the alert
    /// only after its side of the handshake, on the first read.
    ClientCertRequired(String),
    /// A TLS connection without a client certificate was closed or reset by the server:
    /// what a server that requires client certificates does when the alert is lost (the
    /// client wrote before reading it, and the server answered with a reset).
    TlsClosed(String),
    /// Anything else: refused, reset, unreachable, protocol errors.
    Other(String),
}

/// What the wording of a node's connection failures depends on besides fred's error.
#[derive(Clone, Default)]
pub(crate) struct FailureContext {
    /// The node's password, masked should fred's text ever contain it.
    pub(crate) password: Option<String>,
    /// The node is reached over TLS and the TLS settings give no client certificate: a
    /// connection the server closes may be a refusal of mutual TLS.
    pub(crate) tls_without_client_cert: bool,
}

impl ConnectFailure {
    fn from_fred(e: &FredError, context: &FailureContext) -> ConnectFailure {
        let mut details = e.details().trim().to_string();
        if let Some(password) = context.password.as_deref().filter(|p| !p.is_empty()) {
            details = details.replace(password, "***");
        }
        let upper = details.to_ascii_uppercase();
        if *e.kind() == ErrorKind::Auth
            || upper.starts_with("NOAUTH")
            || upper.starts_with("WRONGPASS")
            || (upper.starts_with("ERR") && upper.contains("AUTH"))
        {
            ConnectFailure::Auth(details)
        } else if upper.contains("DB INDEX") || upper.contains("SELECT IS NOT ALLOWED") {
            ConnectFailure::Database(details)
        } else if upper.contains("CERTIFICATEREQUIRED") || upper.contains("CERTIFICATE REQUIRED") {
            // rustls: `AlertReceived(CertificateRequired)`; OpenSSL: `certificate required`.
            ConnectFailure::ClientCertRequired(details)
        } else if is_tls_kind(e)
            || upper.contains("CERTIFICATE")
            || upper.contains("HANDSHAKE")
            || upper.contains("TLS")
        {
            ConnectFailure::Tls(details)
        } else if context.tls_without_client_cert
            && ["CLOSED", "RESET", "BROKEN PIPE", "EOF", "END OF FILE"]
                .iter()
                .any(|word| upper.contains(word))
        {
            ConnectFailure::TlsClosed(format!("{:?}: {details}", e.kind()))
        } else {
            ConnectFailure::Other(format!("{:?}: {details}", e.kind()))
        }
    }

    /// What a round reports for a command refused because of this failure. A server that
    /// refused the password or database answered: that is a server error (of the
    /// connection's handshake, reported as the command `connect`), and no retry fixes it; anything else is
    /// a connection error.
    pub(crate) fn outcome(&self) -> NodeOutcome {
        match self {
            ConnectFailure::Auth(reason) => NodeOutcome::ServerError(ServerError::of_kind(
                ServerErrorKind::Auth,
                "connect",
                reason.clone(),
            )),
            ConnectFailure::Database(reason) => NodeOutcome::ServerError(ServerError::of_kind(
                ServerErrorKind::Database,
                "connect",
                reason.clone(),
            )),
            ConnectFailure::Tls(_)
            | ConnectFailure::ClientCertRequired(_)
            | ConnectFailure::TlsClosed(_)
            | ConnectFailure::Other(_) => NodeOutcome::ConnectionError(self.to_string()),
        }
    }
}

impl std::fmt::Display for ConnectFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectFailure::Auth(reason) => write!(
                f,
                "authentication failed ({reason}): {}",
                ServerErrorKind::Auth.advice()
            ),
            ConnectFailure::Database(reason) => write!(
                f,
                "the server refused the database ({reason}): {}",
                ServerErrorKind::Database.advice()
            ),
            ConnectFailure::Tls(reason) => write!(
                f,
                "TLS handshake failed ({reason}): check that the CA in the TLS settings \
                 (`tls.ca_file`) signed the node's certificate, that the certificate is valid \
                 for the host in the URL (or set `tls.server_name`), and, if the server \
                 requires client certificates, that `tls.client_cert_file` and \
                 `tls.client_key_file` are set"
            ),
            ConnectFailure::ClientCertRequired(reason) => write!(
                f,
                "the node requires a client certificate (mutual TLS) and got none it accepts \
                 ({reason}): set `tls.client_cert_file` and `tls.client_key_file` (or \
                 `tls.client_cert_pem` and `tls.client_key_pem`) to a certificate signed by a \
                 CA the node trusts"
            ),
            ConnectFailure::TlsClosed(reason) => write!(
                f,
                "not connected: the node closed the TLS connection ({reason}); if the node \
                 requires a client certificate (mutual TLS), set `tls.client_cert_file` and \
                 `tls.client_key_file` (the TLS settings give none)"
            ),
            ConnectFailure::Other(reason) => {
                write!(f, "not connected (last connection error: {reason})")
            }
        }
    }
}

#[cfg(feature = "tls")]
fn is_tls_kind(e: &FredError) -> bool {
    *e.kind() == ErrorKind::Tls
}

#[cfg(not(feature = "tls"))]
fn is_tls_kind(_: &FredError) -> bool {
    false
}

/// Records every connection error fred reports for `client` in `last`, and clears it when
/// the connection is (re-)established, then calls `on_reconnect` (fred announces the first
/// connection as a reconnection too). Ends when the client is closed or dropped.
pub(crate) fn watch_connection(
    client: &Client,
    last: Arc<Mutex<Option<ConnectFailure>>>,
    context: FailureContext,
    on_reconnect: impl Fn() + Send + 'static,
) {
    let mut errors = client.error_rx();
    let mut reconnects = client.reconnect_rx();
    tokio::spawn(async move {
        let set = |value: Option<ConnectFailure>| {
            *last.lock().unwrap_or_else(PoisonError::into_inner) = value;
        };
        loop {
            tokio::select! {
                // fred sends an attempt's error before the next attempt's success: read
                // errors first so that a success is never overwritten by an older error.
                biased;
                error = errors.recv() => match error {
                    Ok((error, _)) => {
                        set(Some(ConnectFailure::from_fred(&error, &context)));
                    }
                    Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => break,
                },
                up = reconnects.recv() => match up {
                    // A lagged reader missed reconnections: at least one came.
                    Ok(_) | Err(RecvError::Lagged(_)) => {
                        set(None);
                        on_reconnect();
                    }
                    Err(RecvError::Closed) => break,
                },
            }
        }
    });
}

/// Sorts a fred error from `command` into what a report can say about the node.
pub(crate) fn failure(e: &FredError, command: &'static str) -> NodeOutcome {
    match e.kind() {
        ErrorKind::Timeout => NodeOutcome::TimedOut,
        // fred's own words, under `Unknown`, for a command it could not write because the
        // connection had just gone: not a reply of the server, which would start with an
        // error code (ERR, NOSCRIPT, ...).
        ErrorKind::Unknown if is_unrouted(e) => {
            NodeOutcome::ConnectionError(format!("{:?}: {}", e.kind(), e.details()))
        }
        // Redis error replies (NOAUTH, NOPERM, OOM, READONLY, script errors) arrive as
        // `Unknown` (or, for some, `Auth`, `InvalidArgument`, `InvalidCommand`, `Permission`).
        ErrorKind::Unknown
        | ErrorKind::Auth
        | ErrorKind::InvalidArgument
        | ErrorKind::InvalidCommand => {
            NodeOutcome::ServerError(ServerError::new(command, e.details().to_string()))
        }
        _ => NodeOutcome::ConnectionError(format!("{:?}: {}", e.kind(), e.details())),
    }
}

/// Whether fred failed a command because it would have written it a second time, which
/// the one attempt a command has forbids: on a cluster member, after a `MOVED` or `ASK`
/// (see [`ServerErrorKind::Redirected`](crate::ServerErrorKind::Redirected)).
///
/// fred has no error kind of its own for this: the text is fred 10's (its command's
/// write-attempt check, `protocol/command.rs`). Check it again on a fred upgrade; the
/// moved-slot test of `tests/cluster_member.rs` fails if it changes.
pub(crate) fn is_redirected(e: &FredError) -> bool {
    *e.kind() == ErrorKind::Unknown && e.details() == "Too many failed write attempts."
}

/// Whether fred failed a command because this client's tasks are gone (it was quit, or
/// the runtime it was connected in stopped), which it reports under `Unknown` like a
/// server's error reply: "Failed to send command to router." or "Client is not
/// initialized.".
pub(crate) fn is_stopped(e: &FredError) -> bool {
    *e.kind() == ErrorKind::Unknown
        && (e.details().starts_with("Failed to send command to router")
            || e.details().starts_with("Client is not initialized"))
}

/// Whether fred failed a command for want of a connection to route it to ("Failed to route
/// command."), which it reports under `Unknown` like a server's error reply.
pub(crate) fn is_unrouted(e: &FredError) -> bool {
    e.details().starts_with("Failed to route command")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(kind: ErrorKind, details: &str, password: Option<&str>) -> ConnectFailure {
        let context = FailureContext {
            password: password.map(str::to_string),
            tls_without_client_cert: false,
        };
        ConnectFailure::from_fred(&FredError::new(kind, details.to_string()), &context)
    }

    #[test]
    fn refused_credentials_and_databases_are_server_errors_that_say_what_to_fix() {
        for (kind, details) in [
            (ErrorKind::Auth, "WRONGPASS invalid username-password pair"),
            (ErrorKind::Auth, "NOAUTH Authentication required."),
            (
                ErrorKind::Unknown,
                "ERR AUTH <password> called without any password configured",
            ),
        ] {
            let failure = classify(kind, details, Some("pw"));
            assert_eq!(failure, ConnectFailure::Auth(details.to_string()));
            let NodeOutcome::ServerError(error) = failure.outcome() else {
                panic!("{failure:?}");
            };
            assert_eq!(error.kind, ServerErrorKind::Auth);
            let text = error.to_string();
            assert!(text.contains(details) && text.contains("check the user name and password"));
        }
        let failure = classify(ErrorKind::Unknown, "ERR DB index is out of range", None);
        assert!(
            matches!(failure, ConnectFailure::Database(_)),
            "{failure:?}"
        );
        assert!(failure.to_string().contains("database number"), "{failure}");
    }

    #[test]
    fn other_connection_errors_stay_connection_errors() {
        let failure = classify(ErrorKind::IO, "Connection refused", None);
        let NodeOutcome::ConnectionError(text) = failure.outcome() else {
            panic!("{failure:?}");
        };
        assert!(text.contains("Connection refused"), "{text}");
    }

    #[test]
    fn a_password_echoed_in_an_error_is_masked() {
        let failure = classify(ErrorKind::Auth, "WRONGPASS for hunter2", Some("hunter2"));
        assert!(!failure.to_string().contains("hunter2"), "{failure}");
        assert!(!format!("{failure:?}").contains("hunter2"), "{failure:?}");
    }

    #[test]
    fn a_refused_client_certificate_says_which_settings_to_set() {
        let alert = "Custom { kind: InvalidData, error: AlertReceived(CertificateRequired) }";
        for details in [alert, "tlsv13 alert certificate required"] {
            let failure = classify(ErrorKind::IO, details, None);
            assert!(
                matches!(failure, ConnectFailure::ClientCertRequired(_)),
                "{failure:?}"
            );
            let text = failure.to_string();
            assert!(text.contains("requires a client certificate"), "{text}");
            assert!(text.contains("`tls.client_cert_file`"), "{text}");
        }
    }

    #[test]
    fn a_tls_connection_closed_without_a_client_certificate_points_at_the_setting() {
        let without = FailureContext {
            password: None,
            tls_without_client_cert: true,
        };
        for details in [
            "Connection reset by peer (os error 104)",
            "Connection closed.",
            "unexpected end of file",
        ] {
            let error = FredError::new(ErrorKind::IO, details.to_string());
            let failure = ConnectFailure::from_fred(&error, &without);
            let NodeOutcome::ConnectionError(text) = failure.outcome() else {
                panic!("{failure:?}");
            };
            assert!(text.contains(details), "{text}");
            assert!(text.contains("`tls.client_cert_file`"), "{text}");
            // Plain TCP, or a client certificate given: no such advice.
            let plain = ConnectFailure::from_fred(&error, &FailureContext::default());
            assert!(!plain.to_string().contains("tls."), "{plain}");
        }
        // A node that is down is not a certificate question.
        let refused = FredError::new(ErrorKind::IO, "Connection refused (os error 111)");
        let failure = ConnectFailure::from_fred(&refused, &without);
        assert!(matches!(failure, ConnectFailure::Other(_)), "{failure:?}");
    }

    /// fred's words for a client whose tasks are gone (quit, or its runtime stopped) are
    /// told from a server's error reply, which `failure` alone would call them.
    #[test]
    fn a_client_whose_tasks_are_gone_is_told_from_a_server_reply() {
        for details in [
            "Failed to send command to router.",
            "Client is not initialized.",
        ] {
            assert!(
                is_stopped(&FredError::new(ErrorKind::Unknown, details)),
                "{details}"
            );
        }
        for details in [
            "Failed to route command.",
            "ERR Failed to send command to router.",
        ] {
            assert!(
                !is_stopped(&FredError::new(ErrorKind::Unknown, details)),
                "{details}"
            );
        }
    }

    /// A command fred could not route (its connection had just gone) is a connection error:
    /// a release that met one is sent again, and its report does not point at the server's
    /// version. Read as a server error, it would be reported as "EVALSHA refused (error
    /// reply): Failed to route command.: ... check that the node is a Redis master of
    /// version 6.2 or later", and the release would not be sent again.
    #[test]
    fn a_command_fred_could_not_route_is_a_connection_error() {
        for kind in [ErrorKind::Unknown, ErrorKind::Routing] {
            let e = FredError::new(kind, "Failed to route command.");
            assert!(
                matches!(failure(&e, "EVALSHA"), NodeOutcome::ConnectionError(_)),
                "{:?}",
                failure(&e, "EVALSHA")
            );
        }
        let reply = FredError::new(ErrorKind::Unknown, "ERR unknown command 'EVALSHA'");
        assert!(matches!(
            failure(&reply, "EVALSHA"),
            NodeOutcome::ServerError(_)
        ));
    }
}
