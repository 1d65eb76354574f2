//! Certificates for TLS servers and their clients, minted in-process with rcgen (no `openssl`
//! command, no network): a private CA, good and bad server certificates, client certificates
//! from the CA and from a stranger, all as PEM files in a private directory.

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rcgen::{
    date_time_ymd, BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use tempfile::TempDir;

use crate::workdir;

/// The common name of [`Certs::client_cert_path`]'s certificate.
const CLIENT_NAME: &str = "zklock-client";
/// The common name of the certificate the kit's own probes present to a server that asks for one.
pub(crate) const KIT_NAME: &str = "zklock-testkit";
/// The only name [`Certs::wrong_name_cert_path`]'s certificate is valid for.
const WRONG_NAME: &str = "wrong.example";
/// The names every good server certificate is valid for.
const SERVER_NAMES: [&str; 3] = ["127.0.0.1", "::1", "localhost"];

/// A throwaway public key infrastructure for TLS tests: a private CA, server certificates signed
/// by it (one good, one for the wrong name, one expired), a client certificate signed by it, and a
/// second CA with a client certificate of its own that servers trusting the first must refuse.
///
/// Everything is minted in-process (ECDSA P-256 keys, PKCS#8 PEM, which OpenSSL, PostgreSQL,
/// Go's etcd and Java's ZooKeeper all read) and written as PEM files, keys with mode 0600, in a
/// private temporary directory that lives as long as the last clone of the value: servers started
/// with it keep a clone, so their files stay while they run.
///
/// | file | signed by | valid for |
/// | --- | --- | --- |
/// | [`ca_path`](Self::ca_path) | itself | a CA |
/// | [`server_cert_path`](Self::server_cert_path) | the CA | `127.0.0.1`, `::1`, `localhost` |
/// | [`wrong_name_cert_path`](Self::wrong_name_cert_path) | the CA | `wrong.example` only |
/// | [`expired_cert_path`](Self::expired_cert_path) | the CA | `127.0.0.1`, `::1`, `localhost`, expired in 2001 |
/// | [`client_cert_path`](Self::client_cert_path) | the CA | a client, common name `zklock-client` |
/// | [`other_ca_path`](Self::other_ca_path) | itself | another CA |
/// | [`stranger_cert_path`](Self::stranger_cert_path) | the other CA | a client, common name `zklock-client` |
///
/// The server certificates may also authenticate as clients (etcd's own gateway presents its
/// server certificate to the server), and the client certificates as clients only.
///
/// # Examples
///
/// ```no_run
/// use zklock_testkit::{Certs, ClientAuth, RedisServer};
///
/// let certs = Certs::mint()?;
/// let redis = RedisServer::builder().tls(&certs, ClientAuth::Required).start()?;
/// // A client trusts `certs.ca_path()` and presents `certs.client_cert_path()` with its key.
/// println!("{} {}", redis.url(), certs.ca_path().display()); // rediss://127.0.0.1:PORT/
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone)]
pub struct Certs {
    inner: Arc<Inner>,
}

struct Inner {
    // Field order is drop order; the directory goes last.
    /// What signs a renewed client certificate; locked while one is written.
    ca: Mutex<Ca>,
    ca_pem: String,
    other_ca_pem: String,
    kit: KitIdentity,
    paths: Paths,
    dir: TempDir,
}

/// The CA's name and key, to sign with.
struct Ca {
    params: CertificateParams,
    key: KeyPair,
}

/// The certificate and key (DER) the kit's own probes present, signed by the CA; never renewed.
#[derive(Clone)]
pub(crate) struct KitIdentity {
    pub(crate) cert_der: Vec<u8>,
    pub(crate) key_der: Vec<u8>,
    pub(crate) cert_path: PathBuf,
    pub(crate) key_path: PathBuf,
}

/// Every file's path.
struct Paths {
    ca: PathBuf,
    server: (PathBuf, PathBuf),
    wrong_name: (PathBuf, PathBuf),
    expired: (PathBuf, PathBuf),
    client: (PathBuf, PathBuf),
    other_ca: PathBuf,
    stranger: (PathBuf, PathBuf),
}

/// Whether a TLS server asks its clients for a certificate signed by [`Certs`]'s CA.
///
/// # Examples
///
/// ```no_run
/// use zklock_testkit::{Certs, ClientAuth, EtcdServer};
///
/// let certs = Certs::mint()?;
/// // etcd's --client-cert-auth: a client without a certificate from the CA is refused.
/// let etcd = EtcdServer::builder().tls(&certs, ClientAuth::Required).start()?;
/// # drop(etcd);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientAuth {
    /// A client must present a certificate signed by the CA, or the server refuses it (Redis's
    /// `tls-auth-clients yes`, PostgreSQL's `cert` authentication, etcd's `--client-cert-auth`,
    /// ZooKeeper's `ssl.clientAuth=need`).
    Required,
    /// A client needs no certificate; only the server proves who it is.
    NotRequired,
}

/// Which of [`Certs`]'s server certificates a TLS server presents; the kit's builders take it in
/// their `server_cert` option.
///
/// # Examples
///
/// ```no_run
/// use zklock_testkit::{Certs, ClientAuth, RedisServer, ServerCert};
///
/// let certs = Certs::mint()?;
/// // A client that checks the server's name must refuse this server.
/// let redis = RedisServer::builder()
///     .tls(&certs, ClientAuth::NotRequired)
///     .server_cert(ServerCert::WrongName)
///     .start()?;
/// # drop(redis);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ServerCert {
    /// [`Certs::server_cert_path`]: valid for `127.0.0.1`, `::1` and `localhost`.
    #[default]
    Valid,
    /// [`Certs::wrong_name_cert_path`]: valid for `wrong.example` only.
    WrongName,
    /// [`Certs::expired_cert_path`]: for the right names, but expired.
    Expired,
}

/// A server's TLS settings as its builder was given them: the certificates, which server
/// certificate it presents, and whether it asks its clients for one.
#[derive(Clone, Debug)]
pub(crate) struct ServerTls {
    pub(crate) certs: Certs,
    pub(crate) client_auth: ClientAuth,
    pub(crate) cert: ServerCert,
}

impl ServerTls {
    /// The settings of a builder given `tls` (its `tls` option) and `cert` (its `server_cert`
    /// option); a server certificate without TLS is a mistake.
    pub(crate) fn from_options(
        tls: Option<(Certs, ClientAuth)>,
        cert: Option<ServerCert>,
    ) -> io::Result<Option<ServerTls>> {
        match (tls, cert) {
            (Some((certs, client_auth)), cert) => Ok(Some(ServerTls {
                certs,
                client_auth,
                cert: cert.unwrap_or_default(),
            })),
            (None, None) => Ok(None),
            (None, Some(cert)) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "server_cert({cert:?}) was given without tls(..): give the certificates too"
                ),
            )),
        }
    }

    /// The certificate the server presents.
    pub(crate) fn cert_path(&self) -> &Path {
        self.certs.server_pair(self.cert).0
    }

    /// Its key.
    pub(crate) fn key_path(&self) -> &Path {
        self.certs.server_pair(self.cert).1
    }

    /// Whether clients must present a certificate.
    pub(crate) fn requires_client_cert(&self) -> bool {
        self.client_auth == ClientAuth::Required
    }
}

impl Certs {
    /// Mints every certificate and writes them into a fresh private directory.
    ///
    /// # Errors
    ///
    /// When a key or certificate cannot be made or a file cannot be written.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let certs = zklock_testkit::Certs::mint()?;
    /// assert!(certs.ca_pem().starts_with("-----BEGIN CERTIFICATE-----"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn mint() -> io::Result<Certs> {
        let dir = workdir::create("certs")?;
        let at = |name: &str| dir.path().join(name);
        let pair = |name: &str| (at(&format!("{name}.pem")), at(&format!("{name}.key")));
        let paths = Paths {
            ca: at("ca.pem"),
            server: pair("server"),
            wrong_name: pair("wrong-name"),
            expired: pair("expired"),
            client: pair("client"),
            other_ca: at("other-ca.pem"),
            stranger: pair("stranger"),
        };

        let ca = Ca::new("zklock testkit CA")?;
        let ca_pem = ca.self_signed_pem()?;
        write_file(&paths.ca, &ca_pem, false)?;
        let other_ca = Ca::new("zklock testkit other CA")?;
        let other_ca_pem = other_ca.self_signed_pem()?;
        write_file(&paths.other_ca, &other_ca_pem, false)?;

        let server_names: Vec<String> = SERVER_NAMES.iter().map(|n| n.to_string()).collect();
        ca.sign(&server(server_names.clone())?)?
            .write(&paths.server)?;
        ca.sign(&server(vec![WRONG_NAME.to_string()])?)?
            .write(&paths.wrong_name)?;
        let mut expired = server(server_names)?;
        expired.not_before = date_time_ymd(2000, 1, 1);
        expired.not_after = date_time_ymd(2001, 1, 1);
        ca.sign(&expired)?.write(&paths.expired)?;
        ca.sign(&client(CLIENT_NAME))?.write(&paths.client)?;
        other_ca
            .sign(&client(CLIENT_NAME))?
            .write(&paths.stranger)?;
        let kit = ca.sign(&client(KIT_NAME))?;
        let kit_paths = pair("kit-client");
        kit.write(&kit_paths)?;
        let kit = KitIdentity {
            cert_der: kit.cert_der,
            key_der: kit.key.serialize_der(),
            cert_path: kit_paths.0,
            key_path: kit_paths.1,
        };

        Ok(Certs {
            inner: Arc::new(Inner {
                ca: Mutex::new(ca),
                ca_pem,
                other_ca_pem,
                kit,
                paths,
                dir,
            }),
        })
    }

    /// The directory holding every file.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let certs = zklock_testkit::Certs::mint()?;
    /// assert!(certs.ca_path().starts_with(certs.dir()));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn dir(&self) -> &Path {
        self.inner.dir.path()
    }

    /// The CA's certificate (PEM), what clients and servers trust.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let certs = zklock_testkit::Certs::mint()?;
    /// let ca = std::fs::read_to_string(certs.ca_path())?;
    /// assert_eq!(ca, certs.ca_pem());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn ca_path(&self) -> &Path {
        &self.inner.paths.ca
    }

    /// The CA's certificate, in PEM.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let certs = zklock_testkit::Certs::mint()?;
    /// assert!(certs.ca_pem().contains("BEGIN CERTIFICATE"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn ca_pem(&self) -> &str {
        &self.inner.ca_pem
    }

    /// The good server certificate (PEM): signed by the CA, valid for `127.0.0.1`, `::1` and
    /// `localhost`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let certs = zklock_testkit::Certs::mint()?;
    /// let (cert, key) = (certs.server_cert_path(), certs.server_key_path());
    /// # let _ = (cert, key);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn server_cert_path(&self) -> &Path {
        &self.inner.paths.server.0
    }

    /// The key of [`server_cert_path`](Self::server_cert_path)'s certificate (PKCS#8 PEM, mode
    /// 0600).
    ///
    /// # Examples
    ///
    /// See [`server_cert_path`](Self::server_cert_path).
    pub fn server_key_path(&self) -> &Path {
        &self.inner.paths.server.1
    }

    /// A server certificate signed by the CA for `wrong.example` only: a client that checks the
    /// name it connects to (`127.0.0.1`, `localhost`) must refuse it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let certs = zklock_testkit::Certs::mint()?;
    /// let (cert, key) = (certs.wrong_name_cert_path(), certs.wrong_name_key_path());
    /// # let _ = (cert, key);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn wrong_name_cert_path(&self) -> &Path {
        &self.inner.paths.wrong_name.0
    }

    /// The key of [`wrong_name_cert_path`](Self::wrong_name_cert_path)'s certificate.
    ///
    /// # Examples
    ///
    /// See [`wrong_name_cert_path`](Self::wrong_name_cert_path).
    pub fn wrong_name_key_path(&self) -> &Path {
        &self.inner.paths.wrong_name.1
    }

    /// A server certificate signed by the CA for `127.0.0.1`, `::1` and `localhost`, valid only
    /// during the year 2000: every client must refuse it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let certs = zklock_testkit::Certs::mint()?;
    /// let (cert, key) = (certs.expired_cert_path(), certs.expired_key_path());
    /// # let _ = (cert, key);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn expired_cert_path(&self) -> &Path {
        &self.inner.paths.expired.0
    }

    /// The key of [`expired_cert_path`](Self::expired_cert_path)'s certificate.
    ///
    /// # Examples
    ///
    /// See [`expired_cert_path`](Self::expired_cert_path).
    pub fn expired_key_path(&self) -> &Path {
        &self.inner.paths.expired.1
    }

    /// The client certificate (PEM), signed by the CA, with the common name
    /// [`client_name`](Self::client_name): what a client presents to a server that asks.
    /// [`renew_client`](Self::renew_client) replaces it in place.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let certs = zklock_testkit::Certs::mint()?;
    /// let (cert, key) = (certs.client_cert_path(), certs.client_key_path());
    /// # let _ = (cert, key);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn client_cert_path(&self) -> &Path {
        &self.inner.paths.client.0
    }

    /// The key of [`client_cert_path`](Self::client_cert_path)'s certificate (PKCS#8 PEM, mode
    /// 0600).
    ///
    /// # Examples
    ///
    /// See [`client_cert_path`](Self::client_cert_path).
    pub fn client_key_path(&self) -> &Path {
        &self.inner.paths.client.1
    }

    /// The client certificate as it is on disk now (PEM).
    ///
    /// # Errors
    ///
    /// When the file cannot be read.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let certs = zklock_testkit::Certs::mint()?;
    /// let before = certs.client_cert_pem()?;
    /// certs.renew_client()?;
    /// assert_ne!(certs.client_cert_pem()?, before);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn client_cert_pem(&self) -> io::Result<String> {
        fs::read_to_string(self.client_cert_path())
    }

    /// The client certificate's key as it is on disk now (PKCS#8 PEM).
    ///
    /// # Errors
    ///
    /// When the file cannot be read.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let certs = zklock_testkit::Certs::mint()?;
    /// assert!(certs.client_key_pem()?.contains("BEGIN PRIVATE KEY"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn client_key_pem(&self) -> io::Result<String> {
        fs::read_to_string(self.client_key_path())
    }

    /// The common name of the client certificates, `zklock-client`: the role a PostgreSQL
    /// server with [`ClientAuth::Required`] lets them log in as (besides `postgres`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let certs = zklock_testkit::Certs::mint()?;
    /// assert_eq!(certs.client_name(), "zklock-client");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn client_name(&self) -> &str {
        CLIENT_NAME
    }

    /// A second CA's certificate (PEM), unrelated to the first: a client trusting it refuses
    /// every server certificate of these `Certs`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let certs = zklock_testkit::Certs::mint()?;
    /// assert_ne!(std::fs::read_to_string(certs.other_ca_path())?, certs.ca_pem());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn other_ca_path(&self) -> &Path {
        &self.inner.paths.other_ca
    }

    /// The second CA's certificate, in PEM.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let certs = zklock_testkit::Certs::mint()?;
    /// assert_ne!(certs.other_ca_pem(), certs.ca_pem());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn other_ca_pem(&self) -> &str {
        &self.inner.other_ca_pem
    }

    /// A client certificate signed by the other CA (with the same common name as the good
    /// one): a server that asks for client certificates must refuse it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let certs = zklock_testkit::Certs::mint()?;
    /// let (cert, key) = (certs.stranger_cert_path(), certs.stranger_key_path());
    /// # let _ = (cert, key);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn stranger_cert_path(&self) -> &Path {
        &self.inner.paths.stranger.0
    }

    /// The key of [`stranger_cert_path`](Self::stranger_cert_path)'s certificate.
    ///
    /// # Examples
    ///
    /// See [`stranger_cert_path`](Self::stranger_cert_path).
    pub fn stranger_key_path(&self) -> &Path {
        &self.inner.paths.stranger.1
    }

    /// Mints a new client certificate and key, signed by the same CA with the same common name,
    /// and puts them in place of the old ones at [`client_cert_path`](Self::client_cert_path)
    /// and [`client_key_path`](Self::client_key_path): a certificate rotation, for a test that
    /// a long-lived client picks up the files on disk.
    ///
    /// Each file is replaced whole (written aside, then renamed over the old one): a reader sees
    /// the old file or the new one, never a part. The key is replaced first, then the
    /// certificate, so a reader that reads both in between gets a certificate that does not
    /// match its key.
    ///
    /// # Errors
    ///
    /// When the certificate cannot be made or the files cannot be written.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let certs = zklock_testkit::Certs::mint()?;
    /// let old = certs.client_cert_pem()?;
    /// certs.renew_client()?;
    /// assert_ne!(certs.client_cert_pem()?, old);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn renew_client(&self) -> io::Result<()> {
        let ca = self.inner.ca.lock().unwrap_or_else(|e| e.into_inner());
        ca.sign(&client(CLIENT_NAME))?
            .write(&self.inner.paths.client)
    }

    /// The certificate and key a server presents for `which`.
    pub(crate) fn server_pair(&self, which: ServerCert) -> (&Path, &Path) {
        let (cert, key) = match which {
            ServerCert::Valid => &self.inner.paths.server,
            ServerCert::WrongName => &self.inner.paths.wrong_name,
            ServerCert::Expired => &self.inner.paths.expired,
        };
        (cert, key)
    }

    /// What the kit's own probes present to a server that asks for a client certificate.
    pub(crate) fn kit_identity(&self) -> &KitIdentity {
        &self.inner.kit
    }
}

impl fmt::Debug for Certs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // No key material.
        f.debug_struct("Certs")
            .field("dir", &self.dir())
            .finish_non_exhaustive()
    }
}

/// A certificate and its key, just signed.
struct Signed {
    cert_pem: String,
    cert_der: Vec<u8>,
    key: KeyPair,
}

impl Signed {
    /// Writes the certificate to `paths.0` and the key (mode 0600) to `paths.1`, each replacing
    /// its file whole, the key first.
    fn write(&self, paths: &(PathBuf, PathBuf)) -> io::Result<()> {
        write_file(&paths.1, &self.key.serialize_pem(), true)?;
        write_file(&paths.0, &self.cert_pem, false)
    }
}

impl Ca {
    fn new(name: &str) -> io::Result<Ca> {
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params
            .distinguished_name
            .push(DnType::OrganizationName, "zklock testkit");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        set_validity(&mut params);
        Ok(Ca {
            params,
            key: KeyPair::generate().map_err(rcgen_error)?,
        })
    }

    fn self_signed_pem(&self) -> io::Result<String> {
        Ok(self
            .params
            .self_signed(&self.key)
            .map_err(rcgen_error)?
            .pem())
    }

    /// Signs `params` with a fresh key.
    fn sign(&self, params: &CertificateParams) -> io::Result<Signed> {
        let key = KeyPair::generate().map_err(rcgen_error)?;
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).map_err(rcgen_error)?;
        Ok(Signed {
            cert_pem: cert.pem(),
            cert_der: cert.der().to_vec(),
            key,
        })
    }
}

/// A server certificate's parameters for `names` (IP addresses or DNS names), usable for
/// client authentication too.
fn server(names: Vec<String>) -> io::Result<CertificateParams> {
    let mut params = CertificateParams::new(names.clone()).map_err(rcgen_error)?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, &names[0]);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params);
    Ok(params)
}

/// A client certificate's parameters, with the common name `name`.
fn client(name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params);
    params
}

/// From 2020 to 2100: valid today, and on any clock a test moves.
fn set_validity(params: &mut CertificateParams) {
    params.not_before = date_time_ymd(2020, 1, 1);
    params.not_after = date_time_ymd(2100, 1, 1);
}

/// Writes `text` to a new file beside `path` and renames it over `path`; `secret` files get
/// mode 0600 (from the start), others 0644.
fn write_file(path: &Path, text: &str, secret: bool) -> io::Result<()> {
    let mut aside = path.as_os_str().to_owned();
    aside.push(".new");
    let aside = PathBuf::from(aside);
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(&aside)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    fs::rename(&aside, path)
}

fn rcgen_error(e: rcgen::Error) -> io::Error {
    io::Error::other(format!("cannot mint a certificate: {e}"))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn every_file_is_pem_and_keys_are_private() {
        let certs = Certs::mint().unwrap();
        for cert in [
            certs.ca_path(),
            certs.server_cert_path(),
            certs.wrong_name_cert_path(),
            certs.expired_cert_path(),
            certs.client_cert_path(),
            certs.other_ca_path(),
            certs.stranger_cert_path(),
        ] {
            let text = fs::read_to_string(cert).unwrap();
            assert!(text.starts_with("-----BEGIN CERTIFICATE-----"), "{cert:?}");
        }
        for key in [
            certs.server_key_path(),
            certs.wrong_name_key_path(),
            certs.expired_key_path(),
            certs.client_key_path(),
            certs.stranger_key_path(),
        ] {
            let text = fs::read_to_string(key).unwrap();
            assert!(text.starts_with("-----BEGIN PRIVATE KEY-----"), "{key:?}");
            let mode = fs::metadata(key).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{key:?}");
        }
    }

    #[test]
    fn renewal_replaces_the_client_pair_and_the_files_live_with_the_last_clone() {
        let certs = Certs::mint().unwrap();
        let (cert, key) = (
            certs.client_cert_pem().unwrap(),
            certs.client_key_pem().unwrap(),
        );
        certs.renew_client().unwrap();
        assert_ne!(certs.client_cert_pem().unwrap(), cert);
        assert_ne!(certs.client_key_pem().unwrap(), key);
        let dir = certs.dir().to_path_buf();
        let clone = certs.clone();
        drop(certs);
        assert!(dir.is_dir());
        drop(clone);
        assert!(!dir.exists());
    }
}
