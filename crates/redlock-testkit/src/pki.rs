//! [`TestPki`]: the certificates of a TLS node set, generated at start with `rcgen` (ECDSA
//! P-256 keys, `ring` backend) and written into a temporary directory.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use tempfile::TempDir;

use crate::HarnessError;

/// One certificate (or CA) and its key, as PEM text and as files.
struct Pair {
    cert_pem: String,
    key_pem: String,
    cert_path: PathBuf,
    key_path: PathBuf,
}

/// The test PKI of one [`NodeSet`](crate::NodeSet) started with
/// [`NodeOptions::tls`](crate::NodeOptions::tls):
///
/// - a CA that signed the server certificate every node of the set presents;
/// - a client certificate and key signed by the same CA, for mutual TLS
///   ([`TlsNodeOptions::require_client_cert`](crate::TlsNodeOptions::require_client_cert));
/// - a second, unrelated CA with its own client certificate, for "wrong CA" tests: a client
///   trusting [`TestPki::other_ca_pem`] must refuse the nodes, and a node requiring client
///   certificates must refuse [`TestPki::other_client_cert_pem`].
///
/// Everything is available as PEM text and as a file in [`TestPki::dir`], a temporary
/// directory removed when the last holder (the set and its nodes) is dropped. Certificates
/// are valid from 1975 to 4096, so a node's fake clock cannot make them expire. `Debug` shows
/// the paths only, never a key.
pub struct TestPki {
    ca: Pair,
    server: Pair,
    client: Pair,
    other_ca: Pair,
    other_client: Pair,
    dir: TempDir,
}

impl TestPki {
    /// Generates a fresh PKI whose server certificate names `server_names` (IP addresses
    /// become IP SANs, anything else DNS SANs) and writes it into a new temporary directory.
    pub fn generate(server_names: &[String]) -> Result<TestPki, HarnessError> {
        let dir = tempfile::Builder::new()
            .prefix("redlock-testkit-pki-")
            .tempdir()
            .map_err(|e| HarnessError::io("create a temporary directory for certificates", e))?;
        let (ca, ca_issuer) = authority("redlock-testkit CA", dir.path(), "ca")?;
        let (other_ca, other_issuer) =
            authority("redlock-testkit other CA", dir.path(), "other-ca")?;
        let server_names = server_names.to_vec();
        let server = leaf(
            "server",
            CertificateParams::new(server_names.clone()).map_err(|e| {
                certificate_error(format!("use the server names {server_names:?}"), e)
            })?,
            ExtendedKeyUsagePurpose::ServerAuth,
            &ca_issuer,
            dir.path(),
        )?;
        let client = leaf(
            "client",
            CertificateParams::default(),
            ExtendedKeyUsagePurpose::ClientAuth,
            &ca_issuer,
            dir.path(),
        )?;
        let other_client = leaf(
            "other-client",
            CertificateParams::default(),
            ExtendedKeyUsagePurpose::ClientAuth,
            &other_issuer,
            dir.path(),
        )?;
        Ok(TestPki {
            ca,
            server,
            client,
            other_ca,
            other_client,
            dir,
        })
    }

    /// The directory holding every file below.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA certificate (PEM) that signed the nodes' server certificate and the client
    /// certificate: what a client trusts to reach the nodes.
    pub fn ca_pem(&self) -> &str {
        &self.ca.cert_pem
    }

    /// [`TestPki::ca_pem`] as a file (`ca.pem`).
    pub fn ca_path(&self) -> &Path {
        &self.ca.cert_path
    }

    /// The client certificate (PEM) signed by the set's CA, for mutual TLS.
    pub fn client_cert_pem(&self) -> &str {
        &self.client.cert_pem
    }

    /// [`TestPki::client_cert_pem`] as a file (`client.pem`).
    pub fn client_cert_path(&self) -> &Path {
        &self.client.cert_path
    }

    /// The key of [`TestPki::client_cert_pem`] (PKCS#8 PEM, `PRIVATE KEY`).
    pub fn client_key_pem(&self) -> &str {
        &self.client.key_pem
    }

    /// [`TestPki::client_key_pem`] as a file (`client.key`).
    pub fn client_key_path(&self) -> &Path {
        &self.client.key_path
    }

    /// An unrelated CA certificate (PEM): trusting it instead of [`TestPki::ca_pem`] must
    /// fail the handshake with every node.
    pub fn other_ca_pem(&self) -> &str {
        &self.other_ca.cert_pem
    }

    /// [`TestPki::other_ca_pem`] as a file (`other-ca.pem`).
    pub fn other_ca_path(&self) -> &Path {
        &self.other_ca.cert_path
    }

    /// A client certificate (PEM) signed by the unrelated CA: a node with
    /// [`require_client_cert`](crate::TlsNodeOptions::require_client_cert) must refuse it.
    pub fn other_client_cert_pem(&self) -> &str {
        &self.other_client.cert_pem
    }

    /// [`TestPki::other_client_cert_pem`] as a file (`other-client.pem`).
    pub fn other_client_cert_path(&self) -> &Path {
        &self.other_client.cert_path
    }

    /// The key of [`TestPki::other_client_cert_pem`] (PKCS#8 PEM).
    pub fn other_client_key_pem(&self) -> &str {
        &self.other_client.key_pem
    }

    /// [`TestPki::other_client_key_pem`] as a file (`other-client.key`).
    pub fn other_client_key_path(&self) -> &Path {
        &self.other_client.key_path
    }

    /// The server certificate (PEM) every node of the set presents, signed by the CA.
    pub fn server_cert_pem(&self) -> &str {
        &self.server.cert_pem
    }

    /// [`TestPki::server_cert_pem`] as a file (`server.pem`; `--tls-cert-file`).
    pub fn server_cert_path(&self) -> &Path {
        &self.server.cert_path
    }

    /// The server's key as a file (`server.key`; `--tls-key-file`).
    pub fn server_key_path(&self) -> &Path {
        &self.server.key_path
    }
}

impl fmt::Debug for TestPki {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestPki")
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

/// A self-signed CA named `name`, written as `<file>.pem` / `<file>.key`, and its issuer.
fn authority(
    name: &str,
    dir: &Path,
    file: &str,
) -> Result<(Pair, Issuer<'static, KeyPair>), HarnessError> {
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().map_err(|e| certificate_error(format!("key {name}"), e))?;
    let cert = params
        .self_signed(&key)
        .map_err(|e| certificate_error(format!("sign {name}"), e))?;
    let pair = write_pair(dir, file, cert.pem(), key.serialize_pem())?;
    Ok((pair, Issuer::new(params, key)))
}

/// An end-entity certificate (`server` or a client) for `usage`, signed by `issuer`.
fn leaf(
    file: &str,
    mut params: CertificateParams,
    usage: ExtendedKeyUsagePurpose,
    issuer: &Issuer<'_, KeyPair>,
    dir: &Path,
) -> Result<Pair, HarnessError> {
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, format!("redlock-testkit {file}"));
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![usage];
    // Lets OpenSSL (redis-server) and webpki (rustls) chain the leaf to its CA by key id.
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().map_err(|e| certificate_error(format!("key {file}"), e))?;
    let cert = params
        .signed_by(&key, issuer)
        .map_err(|e| certificate_error(format!("sign {file}"), e))?;
    write_pair(dir, file, cert.pem(), key.serialize_pem())
}

fn write_pair(
    dir: &Path,
    file: &str,
    cert_pem: String,
    key_pem: String,
) -> Result<Pair, HarnessError> {
    let cert_path = dir.join(format!("{file}.pem"));
    let key_path = dir.join(format!("{file}.key"));
    for (path, text) in [(&cert_path, &cert_pem), (&key_path, &key_pem)] {
        fs::write(path, text)
            .map_err(|e| HarnessError::io(format!("write {}", path.display()), e))?;
    }
    Ok(Pair {
        cert_pem,
        key_pem,
        cert_path,
        key_path,
    })
}

fn certificate_error(step: String, source: rcgen::Error) -> HarnessError {
    HarnessError::Certificates {
        step,
        reason: source.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_distinct_pem_files() {
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let pki = TestPki::generate(&names).unwrap();
        for (pem, path) in [
            (pki.ca_pem(), pki.ca_path()),
            (pki.client_cert_pem(), pki.client_cert_path()),
            (pki.other_ca_pem(), pki.other_ca_path()),
            (pki.other_client_cert_pem(), pki.other_client_cert_path()),
            (pki.server_cert_pem(), pki.server_cert_path()),
        ] {
            assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"), "{pem}");
            assert_eq!(fs::read_to_string(path).unwrap(), pem);
            assert!(path.starts_with(pki.dir()));
        }
        for (pem, path) in [
            (pki.client_key_pem(), pki.client_key_path()),
            (pki.other_client_key_pem(), pki.other_client_key_path()),
        ] {
            assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"), "{pem}");
            assert_eq!(fs::read_to_string(path).unwrap(), pem);
        }
        assert!(fs::read_to_string(pki.server_key_path())
            .unwrap()
            .starts_with("-----BEGIN PRIVATE KEY-----"));
        assert_ne!(pki.ca_pem(), pki.other_ca_pem());
        let shown = format!("{pki:?}");
        assert!(!shown.contains("PRIVATE KEY"), "{shown}");
    }

    #[test]
    fn the_directory_goes_with_the_pki() {
        let pki = TestPki::generate(&["localhost".to_owned()]).unwrap();
        let dir = pki.dir().to_owned();
        drop(pki);
        assert!(!dir.exists());
    }

    #[test]
    fn invalid_server_names_are_an_error() {
        let err = TestPki::generate(&["b\u{fc}cher.example".to_owned()]).unwrap_err();
        assert!(matches!(err, HarnessError::Certificates { .. }), "{err}");
    }
}
