//! TLS to Redis (`rediss://`, `RedisOptions::tls`) and PostgreSQL (libpq's `sslmode`,
//! `sslrootcert`, `sslcert`, `sslkey`; `PostgresOptions::tls`), against the test kit's servers
//! on TLS ports with certificates the kit mints (a private CA, a server certificate for
//! 127.0.0.1, one for the wrong name, an expired one, a client certificate, another CA's).
//!
//! On each: a lock held and handed over with mutual TLS, tokens increasing; a server
//! certificate that does not verify (another CA, the wrong name, expired), a missing or refused
//! client certificate, and TLS spoken to a plaintext port each fail `connect` within its
//! timeout with `Error::Tls` naming the server and the cause; plaintext to a TLS port fails
//! within the timeout too; and a client certificate renewed on disk is read again by the next
//! connection of a running manager.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use zklock::{Error, LockManager, Tls};
use zklock_testkit::{Certs, ClientAuth, EtcdServer, PostgresServer, RedisServer, ServerCert};

/// The managers' connect timeout: every failure must come within it.
pub(crate) const CONNECT: Duration = Duration::from_secs(5);

pub(crate) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

pub(crate) fn certs() -> Certs {
    blocking(Certs::mint).expect("mint the test certificates")
}

/// The kit's CA and its client certificate.
pub(crate) fn mutual(certs: &Certs) -> Tls {
    Tls::new()
        .ca_file(certs.ca_path())
        .client_cert_files(certs.client_cert_path(), certs.client_key_path())
}

pub(crate) async fn redis(url: &str, tls: Option<Tls>) -> zklock::Result<LockManager> {
    LockManager::builder(url)
        .connect_timeout(CONNECT)
        .redis(|r| {
            let r = r.lease(Duration::from_secs(3));
            match tls {
                Some(tls) => r.tls(tls),
                None => r,
            }
        })
        .connect()
        .await
}

async fn postgres(url: &str, tls: Option<Tls>) -> zklock::Result<LockManager> {
    LockManager::builder(url)
        .connect_timeout(CONNECT)
        .postgres(|pg| {
            let pg = pg.lease(Duration::from_secs(3));
            match tls {
                Some(tls) => pg.tls(tls),
                None => pg,
            }
        })
        .connect()
        .await
}

/// Two managers exclude each other and hand the lock over with a larger token.
pub(crate) async fn hold_and_hand_over(a: &LockManager, b: &LockManager) {
    let held = a.lock("tls_key").await.expect("granted over TLS");
    assert!(b.try_lock("tls_key").await.unwrap().is_none(), "excluded");
    let first = held.fencing_token();
    held.release().await.unwrap();
    let next = b.lock("tls_key").await.expect("handed over");
    assert!(next.fencing_token() > first);
    next.release().await.unwrap();
}

/// `connect` fails within the timeout with `Error::Tls` naming `host` and saying `cause`.
pub(crate) async fn refused_for<F>(connect: F, host: &str, cause: &str)
where
    F: std::future::Future<Output = zklock::Result<LockManager>>,
{
    let started = Instant::now();
    let err = connect.await.expect_err("the connection is refused");
    assert!(
        started.elapsed() < CONNECT + Duration::from_secs(1),
        "failed after {:?}",
        started.elapsed()
    );
    match &err {
        Error::Tls { host: at, reason } => {
            assert!(at.contains(host), "{err}");
            assert!(reason.contains(cause), "{err}");
        }
        other => panic!("not a TLS error: {other}"),
    }
}

/// `connect` fails (with any error) within the timeout.
pub(crate) async fn fails_in_time<F>(connect: F) -> Error
where
    F: std::future::Future<Output = zklock::Result<LockManager>>,
{
    let started = Instant::now();
    let err = connect.await.expect_err("the connection fails");
    assert!(
        started.elapsed() < CONNECT + Duration::from_secs(1),
        "failed after {:?}: {err}",
        started.elapsed()
    );
    err
}

/// The server certificates a client must refuse, each with the client's settings and the cause
/// its error must give: one signed by another CA than the client trusts, one for another
/// name, an expired one.
pub(crate) fn unverifiable(certs: &Certs) -> [(ServerCert, Tls, &'static str); 3] {
    [
        (
            ServerCert::Valid,
            Tls::new().ca_file(certs.other_ca_path()),
            "not signed by the CA given",
        ),
        (
            ServerCert::WrongName,
            Tls::new().ca_file(certs.ca_path()),
            "not valid for this host name",
        ),
        (
            ServerCert::Expired,
            Tls::new().ca_file(certs.ca_path()),
            "expired",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_mutual_tls_holds_and_hands_over() {
    let certs = certs();
    let server = blocking(|| {
        RedisServer::builder()
            .tls(&certs, ClientAuth::Required)
            .start()
    })
    .unwrap();
    let url = server.url();
    assert!(url.starts_with("rediss://"), "{url}");
    let a = redis(&url, Some(mutual(&certs))).await.unwrap();
    let b = redis(&url, Some(mutual(&certs))).await.unwrap();
    hold_and_hand_over(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_refuses_what_does_not_verify_naming_the_server_and_the_cause() {
    let certs = certs();
    let host = "127.0.0.1";
    for (cert, tls, cause) in unverifiable(&certs) {
        let server = blocking(|| {
            RedisServer::builder()
                .tls(&certs, ClientAuth::NotRequired)
                .server_cert(cert)
                .start()
        })
        .unwrap();
        refused_for(redis(&server.url(), Some(tls)), host, cause).await;
    }
    // A server that asks for a client certificate: none given, or one of another CA.
    let server = blocking(|| {
        RedisServer::builder()
            .tls(&certs, ClientAuth::Required)
            .start()
    })
    .unwrap();
    let port = server.port().to_string();
    refused_for(
        redis(&server.url(), Some(Tls::new().ca_file(certs.ca_path()))),
        &port,
        "client certificate",
    )
    .await;
    let stranger = Tls::new()
        .ca_file(certs.ca_path())
        .client_cert_files(certs.stranger_cert_path(), certs.stranger_key_path());
    let err = fails_in_time(redis(&server.url(), Some(stranger))).await;
    assert!(matches!(err, Error::Tls { .. }), "{err}");
    // Plaintext to the TLS port, and TLS to a plaintext port.
    let plain_url = server.url().replacen("rediss://", "redis://", 1);
    fails_in_time(redis(&plain_url, None)).await;
    let plain = blocking(RedisServer::start).unwrap();
    let tls_url = plain.url().replacen("redis://", "rediss://", 1);
    refused_for(
        redis(&tls_url, Some(Tls::new().ca_file(certs.ca_path()))),
        host,
        "",
    )
    .await;
}

/// A client certificate's files, copied where a manager reads them, so that the test can put
/// another pair in their place.
struct ClientFiles {
    _dir: tempfile::TempDir,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
}

impl ClientFiles {
    fn of(certs: &Certs) -> ClientFiles {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("client.pem"), dir.path().join("client.key"));
        let files = ClientFiles {
            _dir: dir,
            cert,
            key,
        };
        files.install(certs.client_cert_path(), certs.client_key_path());
        files
    }

    fn install(&self, cert: &Path, key: &Path) {
        std::fs::copy(cert, &self.cert).unwrap();
        std::fs::copy(key, &self.key).unwrap();
    }

    fn tls(&self, certs: &Certs) -> Tls {
        Tls::new()
            .ca_file(certs.ca_path())
            .client_cert_files(&self.cert, &self.key)
    }
}

/// A running manager `m`, connected with `files`, reads them again for its next connection:
/// a certificate the server refuses is installed and the server restarted (`restart`, which
/// ends every connection), so the next acquire presents it and fails; the renewed one is
/// installed, and the next acquire gets in, with no new manager.
async fn renewed_certificate_is_read_again(
    m: &LockManager,
    certs: &Certs,
    files: &ClientFiles,
    restart: impl FnOnce(),
) {
    m.lock("rotated").await.unwrap().release().await.unwrap();
    files.install(certs.stranger_cert_path(), certs.stranger_key_path());
    blocking(restart);
    let refused = m.lock_timeout("rotated", Duration::from_secs(3)).await;
    assert!(refused.is_err(), "the refused certificate was presented");
    blocking(|| certs.renew_client()).unwrap();
    files.install(certs.client_cert_path(), certs.client_key_path());
    let held = m
        .lock_timeout("rotated", Duration::from_secs(10))
        .await
        .expect("the renewed certificate is read for the next connection");
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_reads_a_renewed_client_certificate_for_its_next_connection() {
    let certs = certs();
    let mut server = blocking(|| {
        RedisServer::builder()
            .tls(&certs, ClientAuth::Required)
            .start()
    })
    .unwrap();
    let files = ClientFiles::of(&certs);
    let m = redis(&server.url(), Some(files.tls(&certs))).await.unwrap();
    renewed_certificate_is_read_again(&m, &certs, &files, || server.restart().unwrap()).await;
}

/// The libpq parameters of the kit's certificates.
fn libpq(url: &str, certs: &Certs, mode: &str) -> String {
    format!(
        "{url}?sslmode={mode}&sslrootcert={}&sslcert={}&sslkey={}",
        certs.ca_path().display(),
        certs.client_cert_path().display(),
        certs.client_key_path().display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_mutual_tls_holds_and_hands_over_with_libpq_parameters_or_the_builder() {
    let certs = certs();
    let server = blocking(|| {
        PostgresServer::builder()
            .tls(&certs, ClientAuth::Required)
            .start()
    })
    .unwrap();
    let a = postgres(&libpq(&server.url(), &certs, "verify-full"), None)
        .await
        .unwrap();
    let b = postgres(&server.url(), Some(mutual(&certs))).await.unwrap();
    hold_and_hand_over(&a, &b).await;
    // verify-ca: the chain checked, not the name (the server's certificate names 127.0.0.1,
    // the URL says localhost).
    let by_name = server.url().replacen("127.0.0.1", "localhost", 1);
    let c = postgres(&libpq(&by_name, &certs, "verify-ca"), None)
        .await
        .unwrap();
    c.lock("tls_key").await.unwrap().release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refuses_what_does_not_verify_naming_the_server_and_the_cause() {
    let certs = certs();
    for (cert, tls, cause) in unverifiable(&certs) {
        let server = blocking(|| {
            PostgresServer::builder()
                .tls(&certs, ClientAuth::NotRequired)
                .server_cert(cert)
                .start()
        })
        .unwrap();
        refused_for(postgres(&server.url(), Some(tls)), "127.0.0.1", cause).await;
    }
    // Client certificates required: none given is refused by the server's authentication.
    let server = blocking(|| {
        PostgresServer::builder()
            .tls(&certs, ClientAuth::Required)
            .start()
    })
    .unwrap();
    let err = fails_in_time(postgres(
        &server.url(),
        Some(Tls::new().ca_file(certs.ca_path())),
    ))
    .await;
    assert!(!err.is_retryable(), "{err}");
    // Plaintext to a server that takes TLS only, and TLS to a server without it.
    fails_in_time(postgres(&format!("{}?sslmode=disable", server.url()), None)).await;
    let plain = blocking(common::pg_server);
    let err = fails_in_time(postgres(
        &plain.url(),
        Some(Tls::new().ca_file(certs.ca_path())),
    ))
    .await;
    assert!(matches!(err, Error::Tls { .. }), "{err}");
}

async fn etcd(url: &str, tls: Option<Tls>) -> zklock::Result<LockManager> {
    LockManager::builder(url)
        .connect_timeout(CONNECT)
        .etcd(|e| {
            let e = e.lease(Duration::from_secs(3));
            match tls {
                Some(tls) => e.tls(tls),
                None => e,
            }
        })
        .connect()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_mutual_tls_holds_and_hands_over() {
    let certs = certs();
    let server = blocking(|| {
        EtcdServer::builder()
            .tls(&certs, ClientAuth::Required)
            .start()
    })
    .unwrap();
    let url = server.url();
    assert!(url.starts_with("etcds://"), "{url}");
    let a = etcd(&url, Some(mutual(&certs))).await.unwrap();
    let b = etcd(&url, Some(mutual(&certs))).await.unwrap();
    hold_and_hand_over(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_refuses_what_does_not_verify_naming_the_server_and_the_cause() {
    let certs = certs();
    let server = blocking(|| {
        EtcdServer::builder()
            .tls(&certs, ClientAuth::Required)
            .start()
    })
    .unwrap();
    let host = format!("127.0.0.1:{}", server.port());
    let other_ca = Tls::new()
        .ca_file(certs.other_ca_path())
        .client_cert_files(certs.client_cert_path(), certs.client_key_path());
    refused_for(etcd(&server.url(), Some(other_ca)), &host, "not signed").await;
    let no_client_cert = Tls::new().ca_file(certs.ca_path());
    refused_for(
        etcd(&server.url(), Some(no_client_cert)),
        &host,
        "client certificate",
    )
    .await;
    // TLS to a plaintext member.
    let plain = blocking(EtcdServer::start).unwrap();
    let tls_url = plain.url().replacen("etcd://", "etcds://", 1);
    let err = fails_in_time(etcd(&tls_url, Some(Tls::new().ca_file(certs.ca_path())))).await;
    assert!(matches!(err, Error::Tls { .. }), "{err}");
}

async fn zookeeper(connect: &str, tls: Tls) -> zklock::Result<LockManager> {
    LockManager::builder(connect)
        .connect_timeout(CONNECT)
        .zookeeper(|zk| zk.session_timeout(Duration::from_secs(4)).tls_settings(tls))
        .connect()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_with_client_certificates_holds_and_refuses_a_client_without_one() {
    let certs = certs();
    let server = blocking(|| {
        zklock_testkit::ZkServer::builder()
            .tls_with(&certs, ClientAuth::Required)
            .start()
    })
    .unwrap();
    let secure = server.secure_connect_string().expect("a secure port");
    let a = zookeeper(&secure, mutual(&certs)).await.unwrap();
    let b = zookeeper(&secure, mutual(&certs)).await.unwrap();
    hold_and_hand_over(&a, &b).await;
    // The server asks for a client certificate: without one, or with another CA's, no session.
    fails_in_time(zookeeper(&secure, Tls::new().ca_file(certs.ca_path()))).await;
    let stranger = Tls::new()
        .ca_file(certs.ca_path())
        .client_cert_files(certs.stranger_cert_path(), certs.stranger_key_path());
    fails_in_time(zookeeper(&secure, stranger)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_reads_a_renewed_client_certificate_for_its_next_connection() {
    let certs = certs();
    let mut server = blocking(|| {
        PostgresServer::builder()
            .tls(&certs, ClientAuth::Required)
            .start()
    })
    .unwrap();
    let files = ClientFiles::of(&certs);
    let m = postgres(&server.url(), Some(files.tls(&certs)))
        .await
        .unwrap();
    renewed_certificate_is_read_again(&m, &certs, &files, || server.restart().unwrap()).await;
}
