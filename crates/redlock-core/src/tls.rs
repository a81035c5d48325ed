//! TLS for `rediss://` nodes: which certificate authorities to trust, the client
//! certificate for mutual TLS, and how the server's name is checked.
//!
//! One stack: rustls with the *ring* provider (fred's `enable-rustls-ring`). It needs no C
//! toolchain, cmake or system OpenSSL to build (aws-lc-rs and native-tls do), and it is the
//! stack most Rust services already link. The settings are plain data, so that they can be
//! read from a configuration file; [`TlsConfig`] builds the rustls client configuration once,
//! at connect, and every `rediss://` node shares it.

use std::fmt;
use std::path::PathBuf;

use crate::error::ConfigError;

/// TLS settings for the `rediss://` nodes of a node set (needs the `tls` feature).
///
/// Each PEM item is given either inline (`*_pem`) or as a file (`*_file`), not both.
/// Without `ca_*`, the system's trusted roots are used.
///
/// ```toml
/// [tls]
/// ca_file = "/etc/redis/tls/ca.crt"
/// # Mutual TLS: the client's certificate and key.
/// client_cert_file = "/etc/redis/tls/client.crt"
/// client_key_file = "/etc/redis/tls/client.key"
/// # Check the server's certificate against this name instead of the URL's host.
/// # server_name = "redis.internal"
/// ```
///
/// `Debug` never shows the client key.
#[derive(Clone, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(default, deny_unknown_fields)
)]
pub struct TlsConfig {
    /// A PEM file of the certificate authorities that sign the nodes' certificates. With
    /// neither this nor `ca_pem`, the system's trusted roots.
    pub ca_file: Option<PathBuf>,
    /// The same, inline PEM text.
    pub ca_pem: Option<String>,
    /// Trust the system's roots as well as `ca_*`. Defaults to `false` when `ca_*` is given.
    pub system_roots: bool,
    /// The client certificate (chain) for mutual TLS, a PEM file. Needs a client key.
    pub client_cert_file: Option<PathBuf>,
    /// The same, inline PEM text.
    pub client_cert_pem: Option<String>,
    /// The client certificate's private key, a PEM file (PKCS#8, PKCS#1 or SEC1).
    pub client_key_file: Option<PathBuf>,
    /// The same, inline PEM text. Never shown by `Debug` or any error.
    pub client_key_pem: Option<String>,
    /// The name the nodes' certificates must be valid for, instead of each URL's host (for
    /// nodes reached by address whose certificates name a host).
    pub server_name: Option<String>,
    /// Skip the check that a node's certificate is valid for its name. The certificate
    /// must still be signed by a trusted authority and be current. Defaults to `false`:
    /// prefer `server_name` to switching the check off.
    pub skip_name_check: bool,
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = |pem: &Option<String>| pem.as_ref().map(|_| "<PEM>");
        f.debug_struct("TlsConfig")
            .field("ca_file", &self.ca_file)
            .field("ca_pem", &shown(&self.ca_pem))
            .field("system_roots", &self.system_roots)
            .field("client_cert_file", &self.client_cert_file)
            .field("client_cert_pem", &shown(&self.client_cert_pem))
            .field("client_key_file", &self.client_key_file)
            .field(
                "client_key_pem",
                &self.client_key_pem.as_ref().map(|_| "***"),
            )
            .field("server_name", &self.server_name)
            .field("skip_name_check", &self.skip_name_check)
            .finish()
    }
}

/// One PEM item, from a file or inline. (Without the `tls` feature only its presence is
/// checked.)
#[cfg_attr(not(feature = "tls"), allow(dead_code))]
enum Source<'a> {
    File(&'a PathBuf),
    Inline(&'a str),
    None,
}

impl TlsConfig {
    fn source<'a>(
        what: &'static str,
        file: &'a Option<PathBuf>,
        pem: &'a Option<String>,
    ) -> Result<Source<'a>, ConfigError> {
        match (file, pem) {
            (Some(_), Some(_)) => Err(tls_error(
                what,
                "given both as a file and inline: give one of them",
            )),
            (Some(path), None) => Ok(Source::File(path)),
            (None, Some(text)) => Ok(Source::Inline(text)),
            (None, None) => Ok(Source::None),
        }
    }

    /// Checks that the settings are complete, without reading any file.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        Self::source("the CA certificates", &self.ca_file, &self.ca_pem)?;
        let cert = Self::source(
            "the client certificate",
            &self.client_cert_file,
            &self.client_cert_pem,
        )?;
        let key = Self::source(
            "the client key",
            &self.client_key_file,
            &self.client_key_pem,
        )?;
        match (&cert, &key) {
            (Source::None, Source::None)
            | (Source::File(_) | Source::Inline(_), Source::File(_) | Source::Inline(_)) => {}
            (Source::None, _) => {
                return Err(tls_error(
                    "the client key",
                    "given without a client certificate: give both for mutual TLS, or neither",
                ))
            }
            (_, Source::None) => {
                return Err(tls_error(
                    "the client certificate",
                    "given without its private key: give both for mutual TLS, or neither",
                ))
            }
        }
        if let Some(name) = &self.server_name {
            if name.trim().is_empty() {
                return Err(tls_error(
                    "the server name",
                    "is empty: give the name the nodes' certificates are issued for, or leave it out",
                ));
            }
        }
        Ok(())
    }
}

fn tls_error(what: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Tls {
        what: what.to_string(),
        reason: reason.into(),
    }
}

#[cfg(feature = "tls")]
pub(crate) use build::connector;

#[cfg(feature = "tls")]
mod build {
    use std::sync::Arc;

    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::client::WebPkiServerVerifier;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
    use rustls::{
        CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
    };

    use super::{tls_error, Source, TlsConfig};
    use crate::error::ConfigError;

    /// The rustls client configuration for `settings` (the system roots and name checks
    /// when `None`), built once for every `rediss://` node.
    pub(crate) fn connector(
        settings: Option<&TlsConfig>,
    ) -> Result<fred::types::config::TlsConnector, ConfigError> {
        let default = TlsConfig::default();
        let settings = settings.unwrap_or(&default);
        settings.check()?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        let ca = TlsConfig::source("the CA certificates", &settings.ca_file, &settings.ca_pem)?;
        let custom_ca = !matches!(ca, Source::None);
        if !custom_ca || settings.system_roots {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                // A system root rustls cannot parse is skipped, as browsers do.
                let _ = roots.add(cert);
            }
            if roots.is_empty() && !custom_ca {
                return Err(tls_error(
                    "the system's trusted roots",
                    "none could be loaded (is the ca-certificates package installed?): give \
                     the CA that signs the nodes' certificates as `ca_file`",
                ));
            }
        }
        let ca_certs = certificates("the CA certificates", &ca)?;
        for cert in ca_certs {
            roots.add(cert).map_err(|e| {
                tls_error(
                    "the CA certificates",
                    format!("not a usable CA certificate ({e})"),
                )
            })?;
        }
        let verifier =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| {
                    tls_error(
                        "the CA certificates",
                        format!("cannot verify with them ({e})"),
                    )
                })?;
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_error("the TLS provider", e.to_string()))?;
        let builder = if settings.skip_name_check {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyName { inner: verifier }))
        } else {
            builder.with_webpki_verifier(verifier)
        };
        let cert = TlsConfig::source(
            "the client certificate",
            &settings.client_cert_file,
            &settings.client_cert_pem,
        )?;
        let config = match cert {
            Source::None => builder.with_no_client_auth(),
            cert => {
                let chain = certificates("the client certificate", &cert)?;
                let key = TlsConfig::source(
                    "the client key",
                    &settings.client_key_file,
                    &settings.client_key_pem,
                )?;
                let key = private_key(&key)?;
                builder.with_client_auth_cert(chain, key).map_err(|e| {
                    tls_error(
                        "the client certificate",
                        format!("does not go with the client key ({e})"),
                    )
                })?
            }
        };
        Ok(config.into())
    }

    /// The most a certificate or key file may hold: PEM bundles are kilobytes (a system's
    /// whole root store, a few hundred).
    const MAX_PEM_BYTES: u64 = 16 << 20;

    fn read(what: &'static str, source: &Source<'_>) -> Result<Option<Vec<u8>>, ConfigError> {
        match source {
            Source::File(path) => read_file(path)
                .map(Some)
                .map_err(|e| tls_error(what, format!("cannot read `{}`: {e}", path.display()))),
            Source::Inline(text) => Ok(Some(text.as_bytes().to_vec())),
            Source::None => Ok(None),
        }
    }

    /// A regular file of at most [`MAX_PEM_BYTES`]: a device (`/dev/zero`) would be read
    /// until memory runs out, and a named pipe would block the connecting task for ever.
    fn read_file(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
        use std::io::Read;
        if !std::fs::metadata(path)?.is_file() {
            return Err(std::io::Error::other(
                "it is not a regular file (a device, a pipe or a directory)",
            ));
        }
        let mut bytes = Vec::new();
        std::fs::File::open(path)?
            .take(MAX_PEM_BYTES + 1)
            .read_to_end(&mut bytes)?;
        if bytes.len() as u64 > MAX_PEM_BYTES {
            return Err(std::io::Error::other(
                "it is larger than 16 MiB, and certificates and keys are a few kilobytes",
            ));
        }
        Ok(bytes)
    }

    fn certificates(
        what: &'static str,
        source: &Source<'_>,
    ) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
        let Some(bytes) = read(what, source)? else {
            return Ok(Vec::new());
        };
        let certs = CertificateDer::pem_slice_iter(&bytes)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| tls_error(what, format!("not valid PEM ({e})")))?;
        if certs.is_empty() {
            return Err(tls_error(
                what,
                "holds no `BEGIN CERTIFICATE` block: give PEM certificates",
            ));
        }
        Ok(certs)
    }

    fn private_key(source: &Source<'_>) -> Result<PrivateKeyDer<'static>, ConfigError> {
        let what = "the client key";
        let Some(bytes) = read(what, source)? else {
            return Err(tls_error(what, "is missing"));
        };
        // The parser's message could quote the key: say only what kind of problem it is.
        PrivateKeyDer::from_pem_slice(&bytes).map_err(|_| {
            tls_error(
                what,
                "holds no usable private key (PEM `PRIVATE KEY`, `RSA PRIVATE KEY` or `EC \
                 PRIVATE KEY`)",
            )
        })
    }

    /// Verifies the chain, the dates and the signatures, but accepts a certificate issued
    /// for another name (`skip_name_check`).
    #[derive(Debug)]
    struct AnyName {
        inner: Arc<WebPkiServerVerifier>,
    }

    impl ServerCertVerifier for AnyName {
        fn verify_server_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            intermediates: &[CertificateDer<'_>],
            server_name: &ServerName<'_>,
            ocsp_response: &[u8],
            now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            match self.inner.verify_server_cert(
                end_entity,
                intermediates,
                server_name,
                ocsp_response,
                now,
            ) {
                Err(rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                )) => Ok(ServerCertVerified::assertion()),
                other => other,
            }
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.inner.verify_tls12_signature(message, cert, dss)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.inner.verify_tls13_signature(message, cert, dss)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.inner.supported_verify_schemes()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incomplete_or_doubled_settings_are_typed_errors() {
        let both = TlsConfig {
            ca_file: Some("ca.pem".into()),
            ca_pem: Some("-----BEGIN CERTIFICATE-----".into()),
            ..Default::default()
        };
        assert!(matches!(both.check(), Err(ConfigError::Tls { .. })));
        let key_only = TlsConfig {
            client_key_pem: Some("secret key".into()),
            ..Default::default()
        };
        let err = key_only.check().unwrap_err();
        assert!(
            err.to_string().contains("without a client certificate"),
            "{err}"
        );
        let cert_only = TlsConfig {
            client_cert_file: Some("client.pem".into()),
            ..Default::default()
        };
        assert!(cert_only.check().is_err());
        assert!(TlsConfig::default().check().is_ok());
    }

    /// A device or a huge file as a certificate file is a typed error, at once: reading
    /// `/dev/zero` whole would go on until memory runs out.
    #[cfg(feature = "tls")]
    #[test]
    fn a_device_or_a_huge_file_is_no_certificate_file() {
        let refused = |path: &std::path::Path| {
            let tls = TlsConfig {
                ca_file: Some(path.to_path_buf()),
                ..Default::default()
            };
            match connector(Some(&tls)) {
                Err(e @ ConfigError::Tls { .. }) => e.to_string(),
                Err(other) => panic!("{other:?}"),
                Ok(_) => panic!("{path:?} was taken for certificates"),
            }
        };
        let zero = refused(std::path::Path::new("/dev/zero"));
        assert!(zero.contains("not a regular file"), "{zero}");
        let dir = std::env::temp_dir().join(format!("redlock-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let huge = dir.join("huge.pem");
        // Sparse: no disk is used.
        std::fs::File::create(&huge)
            .unwrap()
            .set_len(17 << 20)
            .unwrap();
        let text = refused(&huge);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(text.contains("larger than 16 MiB"), "{text}");
    }

    #[test]
    fn debug_never_shows_the_client_key() {
        let tls = TlsConfig {
            client_cert_pem: Some("CERT".into()),
            client_key_pem: Some("-----BEGIN PRIVATE KEY-----\nsecret".into()),
            ..Default::default()
        };
        let shown = format!("{tls:?}");
        assert!(
            !shown.contains("secret") && !shown.contains("BEGIN"),
            "{shown}"
        );
    }
}
