//! TLS to MySQL / MariaDB (`MySqlOptions::tls`, or `require_ssl=true` in the URL), against the
//! test kit's MariaDB requiring TLS of TCP clients, with certificates the kit mints.
//!
//! A lock held and handed over with mutual TLS (accounts made `REQUIRE X509`), tokens
//! increasing; a server certificate that does not verify (another CA, the wrong name, expired)
//! fails `connect` within its timeout with `Error::Tls` naming the server and the cause; a
//! client without the certificate the account requires is refused; plaintext to a server that
//! requires TLS is refused within the timeout, and TLS to a server without it fails with
//! `Error::Tls` saying what to do; a URL that turns the check off is refused.

use crate::tls_servers::{
    blocking, certs, fails_in_time, hold_and_hand_over, mutual, refused_for, unverifiable, CONNECT,
};

use std::time::Duration;

use zklock::{Error, LockManager, Tls};
use zklock_testkit::{ClientAuth, MariaDbServer};

async fn mysql(url: &str, tls: Option<Tls>) -> zklock::Result<LockManager> {
    LockManager::builder(url)
        .connect_timeout(CONNECT)
        .mysql(|my| {
            let my = my.lease(Duration::from_secs(3));
            match tls {
                Some(tls) => my.tls(tls),
                None => my,
            }
        })
        .connect()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_mutual_tls_holds_and_hands_over() {
    let certs = certs();
    let server = blocking(|| {
        MariaDbServer::builder()
            .tls(&certs, ClientAuth::Required)
            .start()
    })
    .unwrap();
    let accepted_before: u64 =
        blocking(|| server.root_sql("SHOW GLOBAL STATUS LIKE 'Ssl_accepts'"))
            .unwrap()
            .split('\t')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
    let a = mysql(&server.url(), Some(mutual(&certs))).await.unwrap();
    let b = mysql(&server.url(), Some(mutual(&certs))).await.unwrap();
    hold_and_hand_over(&a, &b).await;
    let accepted_after: u64 = blocking(|| server.root_sql("SHOW GLOBAL STATUS LIKE 'Ssl_accepts'"))
        .unwrap()
        .split('\t')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        accepted_after >= accepted_before + 2,
        "the sessions spoke TLS"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_refuses_what_does_not_verify_naming_the_server_and_the_cause() {
    let certs = certs();
    for (cert, tls, cause) in unverifiable(&certs) {
        let server = blocking(|| {
            MariaDbServer::builder()
                .tls(&certs, ClientAuth::NotRequired)
                .server_cert(cert)
                .start()
        })
        .unwrap();
        refused_for(mysql(&server.url(), Some(tls)), "127.0.0.1", cause).await;
    }
    // Client certificates required: none given is refused by the server's authentication.
    let server = blocking(|| {
        MariaDbServer::builder()
            .tls(&certs, ClientAuth::Required)
            .start()
    })
    .unwrap();
    let err = fails_in_time(mysql(
        &server.url(),
        Some(Tls::new().ca_file(certs.ca_path())),
    ))
    .await;
    assert!(!err.is_retryable(), "{err}");
    // Plaintext to a server that requires TLS (of an account that needs no certificate: one
    // that does is refused its login first), and TLS to a server without it.
    let server = blocking(|| {
        MariaDbServer::builder()
            .tls(&certs, ClientAuth::NotRequired)
            .start()
    })
    .unwrap();
    // (MariaDB refuses the login, 1045; MySQL 8 says the transport is insecure, 3159, which
    // zklock reports as `Error::Tls` saying to ask for TLS.)
    let err = fails_in_time(mysql(&server.url(), None)).await;
    assert!(!err.is_retryable(), "{err}");
    let plain = blocking(MariaDbServer::start).unwrap();
    let err = fails_in_time(mysql(
        &plain.url(),
        Some(Tls::new().ca_file(certs.ca_path())),
    ))
    .await;
    assert!(
        matches!(&err, Error::Tls { reason, .. } if reason.contains("does not speak TLS")),
        "{err}"
    );
    // A URL that turns the check off.
    let err = mysql(
        &format!("{}?require_ssl=true&verify_identity=false", plain.url()),
        None,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, Error::Config(msg) if msg.contains("always verifies")),
        "{err}"
    );
}
