//! [`Tls`]: how a manager speaks TLS to its servers, the same on every networked backend, and
//! the one place that turns it into a rustls client configuration (aws-lc-rs, the one crypto
//! provider of the build) and a handshake whose failure names the host and the cause.
// What of it is used depends on the backends compiled in; all of them use all of it.
#![cfg_attr(
    not(all(
        feature = "redis",
        feature = "postgres",
        feature = "etcd",
        feature = "tls"
    )),
    allow(dead_code)
)]

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::types::error::Error;

/// PEM text, given as such or as a file read again for each new connection.
#[derive(Clone, PartialEq, Eq)]
enum Pem {
    File(PathBuf),
    Text(String),
}

impl Pem {
    /// The PEM text now: a file is read again each time, so a renewed certificate on disk is
    /// picked up by the next connection.
    fn read(&self, what: &str) -> Result<Vec<u8>, String> {
        match self {
            Pem::Text(text) => Ok(text.as_bytes().to_vec()),
            Pem::File(path) => std::fs::read(path)
                .map_err(|e| format!("cannot read the {what} file {}: {e}", path.display())),
        }
    }

    fn describe(&self) -> String {
        match self {
            Pem::File(path) => format!("file {}", path.display()),
            Pem::Text(_) => "PEM text".to_string(),
        }
    }
}

/// How a manager speaks TLS to its servers: which certificate authorities to trust, the client
/// certificate to present when a server asks for one, and the name to check in the server's
/// certificate. The server's certificate is always verified: trust a private CA with
/// [`ca_file`](Tls::ca_file) rather than turning verification off (there is no switch for it).
///
/// Files are read again whenever a new connection is opened (at connect, after a server
/// restart or a failover), so a certificate renewed on disk is used without restarting the
/// service. A key never appears in an error, a log or a `Debug` print.
///
/// Give it to a backend's options (`.redis(|r| r.tls(..))`, `.postgres(|pg| pg.tls(..))`); the
/// connect string still says whether TLS is used (`rediss://`, `sslmode=require`), and these
/// options say how.
///
/// # Examples
///
/// A private CA and a client certificate (mutual TLS), as most production etcd clusters and
/// Redis servers with `tls-auth-clients yes` ask for:
///
/// ```
/// use zklock_core::Tls;
///
/// let tls = Tls::new()
///     .ca_file("/etc/zklock/ca.pem")
///     .client_cert_files("/etc/zklock/client.pem", "/etc/zklock/client.key");
/// assert!(format!("{tls:?}").contains("ca.pem"));
/// ```
///
/// The system's roots (a managed service with a public certificate), checking a name other
/// than the host the connect string gives (connecting by IP address to a server whose
/// certificate names its DNS name):
///
/// ```
/// let tls = zklock_core::Tls::new().server_name("redis.internal.example");
/// # drop(tls);
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Tls {
    ca: Option<Pem>,
    client: Option<(Pem, Pem)>,
    server_name: Option<String>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field(
                "ca",
                &self
                    .ca
                    .as_ref()
                    .map_or("the system's roots".to_string(), Pem::describe),
            )
            .field(
                "client_cert",
                &self.client.as_ref().map(|(cert, _)| cert.describe()),
            )
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl Tls {
    /// TLS verified against the system's roots (`/etc/ssl/certs` on Debian), no client
    /// certificate, the connect string's host checked in the server's certificate.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(zklock_core::Tls::new(), zklock_core::Tls::default());
    /// ```
    pub fn new() -> Tls {
        Tls::default()
    }

    /// Trusts the certificate authorities in this PEM file (one or more certificates) instead
    /// of the system's roots: a private CA, or a self-signed server's own certificate.
    ///
    /// # Examples
    ///
    /// ```
    /// let tls = zklock_core::Tls::new().ca_file("/etc/zklock/ca.pem");
    /// # drop(tls);
    /// ```
    pub fn ca_file(mut self, path: impl AsRef<Path>) -> Tls {
        self.ca = Some(Pem::File(path.as_ref().to_path_buf()));
        self
    }

    /// Trusts the certificate authorities in this PEM text (what [`ca_file`](Tls::ca_file)
    /// would read).
    ///
    /// # Examples
    ///
    /// ```
    /// # let ca_pem = String::new();
    /// let tls = zklock_core::Tls::new().ca_pem(ca_pem); // e.g. from a secret store
    /// # drop(tls);
    /// ```
    pub fn ca_pem(mut self, pem: impl Into<String>) -> Tls {
        self.ca = Some(Pem::Text(pem.into()));
        self
    }

    /// Presents this client certificate (PEM, with its chain) and private key (PEM: PKCS#8,
    /// PKCS#1 or SEC1) to servers that ask for one (Redis's `tls-auth-clients yes`, etcd's
    /// `--client-cert-auth`, PostgreSQL's `cert` authentication, ZooKeeper's
    /// `ssl.clientAuth=need`).
    ///
    /// # Examples
    ///
    /// ```
    /// let tls = zklock_core::Tls::new()
    ///     .ca_file("ca.pem")
    ///     .client_cert_files("client.pem", "client.key");
    /// # drop(tls);
    /// ```
    pub fn client_cert_files(mut self, cert: impl AsRef<Path>, key: impl AsRef<Path>) -> Tls {
        self.client = Some((
            Pem::File(cert.as_ref().to_path_buf()),
            Pem::File(key.as_ref().to_path_buf()),
        ));
        self
    }

    /// Presents this client certificate and key, given as PEM text.
    ///
    /// # Examples
    ///
    /// ```
    /// # let (cert, key) = (String::new(), String::new());
    /// let tls = zklock_core::Tls::new().client_cert_pem(cert, key);
    /// # drop(tls);
    /// ```
    pub fn client_cert_pem(mut self, cert: impl Into<String>, key: impl Into<String>) -> Tls {
        self.client = Some((Pem::Text(cert.into()), Pem::Text(key.into())));
        self
    }

    /// Checks this name in the server's certificate instead of the connect string's host.
    ///
    /// # Examples
    ///
    /// ```
    /// // Connecting to 10.0.0.5, whose certificate is for locks.internal.example:
    /// let tls = zklock_core::Tls::new().server_name("locks.internal.example");
    /// # drop(tls);
    /// ```
    pub fn server_name(mut self, name: impl Into<String>) -> Tls {
        self.server_name = Some(name.into());
        self
    }

    /// The PEM texts as of now (the files read again) and the name to check, for a client that
    /// builds its own TLS configuration (etcd's, through its gRPC stack); errors name `host`.
    pub(crate) fn pem_now(&self, host: &str) -> Result<PemNow, Error> {
        let bad = |reason: String| Error::Tls {
            host: host.to_string(),
            reason,
        };
        let ca = match &self.ca {
            Some(ca) => Some(ca.read("CA").map_err(bad)?),
            None => None,
        };
        let client = match &self.client {
            Some((cert, key)) => Some((
                cert.read("client certificate").map_err(bad)?,
                key.read("client key").map_err(bad)?,
            )),
            None => None,
        };
        Ok(PemNow {
            ca,
            client,
            server_name: self.server_name.clone(),
        })
    }

    /// Whether a CA (rather than the system's roots) was given.
    pub(crate) fn has_ca(&self) -> bool {
        self.ca.is_some()
    }

    /// Whether a client certificate was given.
    pub(crate) fn has_client_cert(&self) -> bool {
        self.client.is_some()
    }

    /// The rustls configuration for a connection opened now (the files read again), or what is
    /// wrong with the settings, as an error naming `host`; `check`: whether the name is checked
    /// too.
    pub(crate) fn client_config(
        &self,
        host: &str,
        check: Check,
    ) -> Result<Arc<ClientConfig>, Error> {
        let bad = |reason: String| Error::Tls {
            host: host.to_string(),
            reason,
        };
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(format!("no TLS version to offer: {e}")))?;
        let mut roots = RootCertStore::empty();
        match &self.ca {
            Some(ca) => {
                let pem = ca.read("CA").map_err(bad)?;
                let certs = certificates(&pem).map_err(|e| bad(format!("the CA {e}")))?;
                if certs.is_empty() {
                    return Err(bad(format!(
                        "the CA ({}) holds no PEM certificate",
                        ca.describe()
                    )));
                }
                for cert in certs {
                    roots
                        .add(cert)
                        .map_err(|e| bad(format!("the CA certificate is not usable: {e}")))?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                for cert in found.certs {
                    let _ = roots.add(cert);
                }
                if roots.is_empty() {
                    return Err(bad(
                        "no CA was given and the system has no root certificates: give the \
                         CA that signed the server's certificate (a CA file)"
                            .to_string(),
                    ));
                }
            }
        }
        let builder = match check {
            Check::Full => builder.with_root_certificates(roots),
            Check::Chain => {
                let full = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|e| bad(format!("the CA is not usable: {e}")))?;
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(ChainOnly(full)))
            }
        };
        let config = match &self.client {
            Some((cert, key)) => {
                let certs = certificates(&cert.read("client certificate").map_err(&bad)?)
                    .map_err(|e| bad(format!("the client certificate {e}")))?;
                if certs.is_empty() {
                    return Err(bad(format!(
                        "the client certificate ({}) holds no PEM certificate",
                        cert.describe()
                    )));
                }
                let key = private_key(&key.read("client key").map_err(&bad)?)
                    .map_err(|e| bad(format!("the client key {e}")))?;
                builder
                    .with_client_auth_cert(certs, key)
                    .map_err(|e| bad(format!("the client certificate and key: {e}")))?
            }
            None => builder.with_no_client_auth(),
        };
        Ok(Arc::new(config))
    }

    /// The name checked in the certificate of the server at `host`.
    pub(crate) fn name_for(&self, host: &str) -> Result<ServerName<'static>, Error> {
        let name = self.server_name.as_deref().unwrap_or(host);
        let name = name.trim_start_matches('[').trim_end_matches(']');
        ServerName::try_from(name.to_string()).map_err(|_| Error::Tls {
            host: host.to_string(),
            reason: format!("{name:?} is not a name a certificate can be checked against"),
        })
    }

    /// Opens TLS on `stream`, connected to `host` (`host:port` is what errors name): the
    /// handshake, its failure as [`Error::Tls`] saying why.
    pub(crate) async fn handshake<S>(
        &self,
        stream: S,
        host: &str,
        port: u16,
        check: Check,
    ) -> Result<tokio_rustls::client::TlsStream<S>, Error>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let at = format!("{host}:{port}");
        let config = self.client_config(&at, check)?;
        let name = self.name_for(host)?;
        tokio_rustls::TlsConnector::from(config)
            .connect(name, stream)
            .await
            .map_err(|e| Error::Tls {
                host: at,
                reason: handshake_failure(&e, self),
            })
    }
}

/// The system's root certificates as PEM text (for a client that takes its CA as PEM only).
#[cfg(any(feature = "tls", feature = "mysql"))]
pub(crate) fn system_roots_pem() -> String {
    use base64::Engine;
    let mut pem = String::new();
    for cert in rustls_native_certs::load_native_certs().certs {
        let encoded = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
        pem.push_str("-----BEGIN CERTIFICATE-----\n");
        for line in encoded.as_bytes().chunks(64) {
            pem.push_str(&String::from_utf8_lossy(line));
            pem.push('\n');
        }
        pem.push_str("-----END CERTIFICATE-----\n");
    }
    pem
}

/// [`Tls`]'s PEM texts as read at one moment, and the name to check.
pub(crate) struct PemNow {
    pub(crate) ca: Option<Vec<u8>>,
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
    pub(crate) server_name: Option<String>,
}

/// What of the server's certificate is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Check {
    /// The chain to a trusted CA, the validity dates and the name: always, but where
    /// PostgreSQL's `sslmode=verify-ca` asks for less.
    Full,
    /// All but the name (PostgreSQL's `verify-ca`).
    Chain,
}

/// A verifier that accepts a certificate valid for another name than the one connected to,
/// everything else checked by the full verifier it wraps (libpq's `verify-ca`).
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
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
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The certificates in PEM text.
fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    rustls_pemfile::certs(&mut &pem[..])
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("is not PEM: {e}"))
}

/// The first private key in PEM text.
fn private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    rustls_pemfile::private_key(&mut &pem[..])
        .map_err(|e| format!("is not PEM: {e}"))?
        .ok_or_else(|| "holds no PEM private key (PKCS#8, PKCS#1 or SEC1)".to_string())
}

/// Why a TLS handshake failed, for a user: the certificate that did not verify and what to do,
/// a client certificate the server refused, or a peer that does not speak TLS.
pub(crate) fn handshake_failure(err: &std::io::Error, tls: &Tls) -> String {
    let cause = match err
        .get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::InvalidCertificate(cert)) => match cert {
            CertificateError::UnknownIssuer | CertificateError::BadSignature => Cause::UnknownCa,
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                Cause::WrongName
            }
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => Cause::Expired,
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                Cause::NotYetValid
            }
            other => Cause::Other(format!(
                "the server's certificate does not verify: {other:?}"
            )),
        },
        Some(rustls::Error::AlertReceived(alert)) => Cause::Alert(format!("{alert:?}")),
        Some(rustls::Error::InvalidMessage(_))
        | Some(rustls::Error::InappropriateMessage { .. }) => Cause::Plaintext,
        Some(other) => Cause::Other(other.to_string()),
        None if err.kind() == std::io::ErrorKind::UnexpectedEof => Cause::Closed,
        None => Cause::Other(err.to_string()),
    };
    cause.reason(tls)
}

/// The reason of a TLS failure that a client reported only as text (rustls's error printed
/// inside another library's), if the text holds one.
pub(crate) fn failure_in_text(text: &str, tls: &Tls) -> Option<String> {
    let cause = if text.contains("UnknownIssuer") || text.contains("BadSignature") {
        Cause::UnknownCa
    } else if text.contains("NotValidForName") || text.contains("not valid for name") {
        Cause::WrongName
    } else if text.contains("invalid peer certificate: Expired")
        || text.contains("certificate expired")
    {
        Cause::Expired
    } else if let Some((_, alert)) = text.split_once("received fatal alert: ") {
        let alert: String = alert
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        Cause::Alert(alert)
    } else if text.contains("corrupt message") || text.contains("InappropriateMessage") {
        Cause::Plaintext
    } else if text.contains("tls handshake eof") {
        Cause::Closed
    } else {
        return None;
    };
    Some(cause.reason(tls))
}

/// Why a server closed a connection right after the TLS handshake, for a user: under TLS 1.3
/// a server refuses a client certificate (or the lack of one) only then, as the client first
/// writes.
pub(crate) fn closed_after_handshake(tls: &Tls) -> String {
    if tls.has_client_cert() {
        "the server closed the connection right after the TLS handshake: it probably does not \
         accept the client certificate given (not signed by a CA it trusts, or expired)"
            .to_string()
    } else {
        "the server closed the connection right after the TLS handshake: it probably asks for a \
         client certificate, and none was given"
            .to_string()
    }
}

/// Why a server closed a connection during the TLS handshake or right after it, for a user,
/// when the client cannot tell which (it saw a reset, a broken pipe or a closed stream): the
/// port speaks no TLS (a plaintext server drops the client's hello), or, under TLS 1.3, the
/// server refused the client certificate (or the lack of one), which it does only as the
/// client first writes.
pub(crate) fn closed_in_handshake(tls: &Tls) -> String {
    let certificate = if tls.has_client_cert() {
        "does not accept the client certificate given (not signed by a CA it trusts, or expired)"
    } else {
        "asks for a client certificate, and none was given"
    };
    format!(
        "the server closed the connection during or right after the TLS handshake: the port \
         probably does not speak TLS, or the server {certificate}"
    )
}

/// What went wrong in a TLS handshake.
enum Cause {
    UnknownCa,
    WrongName,
    Expired,
    NotYetValid,
    /// The server sent this alert (often: it refused the client certificate, or wanted one).
    Alert(String),
    Plaintext,
    Closed,
    Other(String),
}

impl Cause {
    fn reason(self, tls: &Tls) -> String {
        match self {
            Cause::UnknownCa if tls.has_ca() => "the server's certificate is not signed by the CA \
                 given: give the CA that signed it"
                .to_string(),
            Cause::UnknownCa => "the server's certificate is not signed by a CA the system \
                 trusts: give the CA that signed it (a private CA)"
                .to_string(),
            Cause::WrongName => "the server's certificate is not valid for this host name: \
                 connect with a name the certificate lists, or set the server name to check"
                .to_string(),
            Cause::Expired => {
                "the server's certificate has expired: renew it on the server".to_string()
            }
            Cause::NotYetValid => {
                "the server's certificate is not valid yet (check the clocks)".to_string()
            }
            Cause::Alert(alert) if !tls.has_client_cert() => format!(
                "the server refused the handshake ({alert}): it asks for a client certificate, \
                 and none was given"
            ),
            Cause::Alert(alert) => format!(
                "the server refused the handshake ({alert}): it does not accept the client \
                 certificate given (not signed by a CA it trusts, or expired)"
            ),
            Cause::Plaintext => {
                "the server does not speak TLS on this port (a plaintext port?)".to_string()
            }
            Cause::Closed => "the server closed the connection during the handshake (a \
                 plaintext port, or a client certificate it refused)"
                .to_string(),
            Cause::Other(text) => text,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_names_files_but_never_shows_a_key() {
        let tls = Tls::new()
            .ca_pem("-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n")
            .client_cert_pem("CERT", "-----BEGIN PRIVATE KEY-----\nSECRET\n");
        let shown = format!("{tls:?}");
        assert!(!shown.contains("SECRET"), "{shown}");
        assert!(shown.contains("PEM text"), "{shown}");
        let tls = Tls::new().client_cert_files("/c.pem", "/secret/k.pem");
        let shown = format!("{tls:?}");
        assert!(shown.contains("/c.pem"), "{shown}");
        assert!(!shown.contains("k.pem"), "{shown}");
    }

    #[test]
    fn a_failure_printed_by_another_library_is_read_back() {
        let tls = Tls::new().ca_file("/ca.pem");
        let text = "grpc request error: message: \"invalid peer certificate: UnknownIssuer\"";
        assert!(failure_in_text(text, &tls)
            .unwrap()
            .contains("not signed by the CA given"));
        let text = "error: received fatal alert: CertificateRequired";
        assert!(failure_in_text(text, &tls)
            .unwrap()
            .contains("none was given"));
        assert_eq!(failure_in_text("connection refused", &tls), None);
    }

    #[test]
    fn bad_settings_name_the_host_and_what_is_wrong() {
        let err = Tls::new()
            .ca_file("/nonexistent/ca.pem")
            .client_config("db:5432", Check::Full)
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("db:5432") && text.contains("/nonexistent/ca.pem"),
            "{text}"
        );
        let err = Tls::new()
            .ca_pem("not a certificate")
            .client_config("db:5432", Check::Full)
            .unwrap_err();
        assert!(err.to_string().contains("no PEM certificate"), "{err}");
    }
}
