//! Locks over TLS: a ZooKeeper the test kit starts with a secure client port and a throwaway
//! certificate, and managers connecting with zookeeper-client's TLS options.

use crate::common;

use std::time::Duration;

use common::*;
use zklock::{zookeeper_client, Error, LockManager};

fn tls_options(ca_pem: &str) -> zookeeper_client::TlsOptions {
    zookeeper_client::TlsOptions::new()
        .with_pem_ca(ca_pem)
        .expect("the test kit's certificate parses")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_exclude_each_other_over_tls_and_plain_or_untrusted_clients_are_refused() {
    let zk = zklock_testkit::ZkServer::builder().tls().start().unwrap();
    let secure = zk.secure_connect_string().expect("a secure port");
    let ca = zk.tls_ca_pem().expect("a certificate").to_string();
    let connect = |connect: String, tls: zookeeper_client::TlsOptions| {
        LockManager::builder(connect)
            .zookeeper(|zk| zk.session_timeout(Duration::from_secs(4)))
            .connect_timeout(Duration::from_secs(3))
            .zookeeper(|zk| zk.tls(tls))
            .connect()
    };

    let a = connect(secure.clone(), tls_options(&ca)).await.unwrap();
    let b = connect(secure.clone(), tls_options(&ca)).await.unwrap();
    let held = a.lock("tls_key").await.unwrap();
    assert!(held.is_held());
    assert!(b.try_lock("tls_key").await.unwrap().is_none());
    let first = held.fencing_token();
    held.release().await.unwrap();
    let next = b.lock("tls_key").await.unwrap();
    assert!(next.fencing_token() > first);
    next.release().await.unwrap();

    // The port really speaks TLS: a plain client cannot start a session there.
    let plain = LockManager::builder(secure.clone())
        .zookeeper(|zk| zk.session_timeout(Duration::from_secs(2)))
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await;
    assert!(matches!(plain, Err(Error::Unreachable { .. })), "{plain:?}");

    // A client that does not trust the server's certificate is refused with a clear error.
    let stranger = connect(secure.clone(), tls_options(UNRELATED_CERT)).await;
    match stranger {
        Err(e @ Error::Unreachable { .. }) => {
            assert!(e.to_string().contains("check the connect string"), "{e}")
        }
        other => panic!("an untrusted server must be refused: {other:?}"),
    }

    // Nothing was left behind by any of it.
    a.flush().await;
    b.flush().await;
    assert!(children(&a, &a.path_of("tls_key").unwrap())
        .await
        .is_empty());
}

/// A self-signed certificate (CN=unrelated, for 127.0.0.1) that no test server presents.
const UNRELATED_CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBijCCATGgAwIBAgIIRAZEg0AB3z8wCgYIKoZIzj0EAwIwKzEVMBMGA1UEChMM
emtsb2NrIHRlc3RzMRIwEAYDVQQDEwl1bnJlbGF0ZWQwIBcNMjYxMTIyMDIyNTUz
WhgPMjEyNjEwMjkwMjI1NTNaMCsxFTATBgNVBAoTDHprbG9jayB0ZXN0czESMBAG
A1UEAxMJdW5yZWxhdGVkMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAET/8QEuLH
xSP8pUJux9F6JJzGHb+JTenqB+mbAM9L1c4vRbu5zg0IR0RXeldOPGDQWIBXiuNd
5M9cv+/icuw/QKM9MDswHQYDVR0OBBYEFNZ9Vm1tZ1tnzJ+is0KUwXVf/ODaMBoG
A1UdEQQTMBGHBH8AAAGCCWxvY2FsaG9zdDAKBggqhkjOPQQDAgNHADBEAiAHBmlc
bRRcBWRvEG4/lxHNLNZzlzfT/c6LszRqw8JqBQIgS8tlrtpVFT5GA3qnlsTa14G9
SsWsmNzqxy0ujpxGXs4=
-----END CERTIFICATE-----
";
