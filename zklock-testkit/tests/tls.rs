//! The kit's TLS servers against their own command-line clients: each serves TLS with the
//! kit's certificates, refuses plaintext, and (when told) refuses a client without a certificate
//! of the CA's.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use zklock_testkit::{
    Certs, ClientAuth, EtcdCluster, EtcdServer, PostgresServer, RedisCluster, RedisSentinel,
    RedisServer, Relay, ServerCert, ZkServer,
};

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().expect("the client runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `redis-cli PING` to `port`, with `tls` flags (none: plaintext).
fn redis_ping(port: u16, tls: &[&std::ffi::OsStr]) -> String {
    let out = run(Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(tls)
        .arg("PING"));
    text(&out)
}

#[test]
fn redis_serves_tls_and_refuses_plaintext_and_strangers() {
    let certs = Certs::mint().unwrap();
    let redis = RedisServer::builder()
        .tls(&certs, ClientAuth::Required)
        .start()
        .unwrap();
    let p = redis.port();
    assert_eq!(redis.url(), format!("rediss://127.0.0.1:{p}/"));
    let flags = |ca: &std::path::Path, cert: Option<(&std::path::Path, &std::path::Path)>| {
        let mut v: Vec<std::ffi::OsString> = vec!["--tls".into(), "--cacert".into(), ca.into()];
        if let Some((c, k)) = cert {
            v.extend(["--cert".into(), c.into(), "--key".into(), k.into()]);
        }
        v
    };
    let call = |f: Vec<std::ffi::OsString>| {
        let refs: Vec<&std::ffi::OsStr> = f.iter().map(|s| s.as_os_str()).collect();
        redis_ping(p, &refs)
    };
    let client = Some((certs.client_cert_path(), certs.client_key_path()));
    assert_eq!(call(flags(certs.ca_path(), client)).trim(), "PONG");
    let no_cert = call(flags(certs.ca_path(), None));
    assert!(!no_cert.contains("PONG"), "{no_cert}");
    let stranger = call(flags(
        certs.ca_path(),
        Some((certs.stranger_cert_path(), certs.stranger_key_path())),
    ));
    assert!(!stranger.contains("PONG"), "{stranger}");
    let wrong_ca = call(flags(certs.other_ca_path(), client));
    assert!(!wrong_ca.contains("PONG"), "{wrong_ca}");
    let plain = redis_ping(p, &[]);
    assert!(!plain.contains("PONG"), "{plain}");
    eprintln!("no cert: {no_cert}\nstranger: {stranger}\nwrong ca: {wrong_ca}\nplain: {plain}");
}

#[test]
fn redis_cli_refuses_the_expired_certificate() {
    let certs = Certs::mint().unwrap();
    let redis = RedisServer::builder()
        .tls(&certs, ClientAuth::NotRequired)
        .server_cert(ServerCert::Expired)
        .start()
        .unwrap();
    let ca = certs.ca_path().as_os_str();
    let answer = redis_ping(redis.port(), &["--tls".as_ref(), "--cacert".as_ref(), ca]);
    assert!(answer.contains("certificate verify failed"), "{answer}");
    // redis-cli checks no name: the wrong name's certificate is shown refused by a client
    // that does in servers_present_the_certificate_they_are_told_to.
}

/// `redis-cli --tls` flags trusting the kit's CA and presenting its client certificate.
fn redis_cli_mutual(certs: &Certs) -> Vec<std::ffi::OsString> {
    vec![
        "--tls".into(),
        "--cacert".into(),
        certs.ca_path().into(),
        "--cert".into(),
        certs.client_cert_path().into(),
        "--key".into(),
        certs.client_key_path().into(),
    ]
}

/// `redis-cli PING` to `addr` (`127.0.0.1:PORT`) with `flags`.
fn redis_ping_at(addr: &str, flags: &[std::ffi::OsString]) -> String {
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    let refs: Vec<&std::ffi::OsStr> = flags.iter().map(|s| s.as_os_str()).collect();
    redis_ping(port, &refs)
}

#[test]
fn redis_sentinels_and_their_nodes_serve_tls_only_and_fail_over() {
    let certs = Certs::mint().unwrap();
    let redis = RedisSentinel::builder()
        .tls(&certs, ClientAuth::Required)
        .start()
        .unwrap();
    assert!(redis.is_tls());
    assert_eq!(
        redis.url(),
        format!(
            "rediss+sentinel://{}/zklock",
            redis.sentinel_addrs().join(",")
        )
    );
    assert!(redis.sentinel_urls()[0].starts_with("rediss://127.0.0.1:"));
    let mutual = redis_cli_mutual(&certs);
    for addr in redis.sentinel_addrs().iter().chain(&redis.node_addrs()) {
        assert_eq!(redis_ping_at(addr, &mutual).trim(), "PONG", "{addr}");
        let plain = redis_ping_at(addr, &[]);
        assert!(!plain.contains("PONG"), "{addr}: {plain}");
        let no_cert = redis_ping_at(addr, &mutual[..3]);
        assert!(!no_cert.contains("PONG"), "{addr}: {no_cert}");
    }
    // Replication, the Sentinels' links and the kit's own commands go over TLS.
    let old = redis.primary().unwrap();
    let replies = redis
        .commands(old, &[&["SET", "k", "v"], &["WAIT", "2", "5000"]])
        .unwrap();
    assert_eq!(replies[1].int(), Some(2));
    let new = redis.failover().unwrap();
    assert_ne!(new, old);
    assert_eq!(
        redis.command(new, &["GET", "k"]).unwrap().text().as_deref(),
        Some("v")
    );
}

#[test]
fn a_tls_sentinel_setup_is_killed_frozen_and_restarted_as_in_plaintext() {
    let certs = Certs::mint().unwrap();
    let mut redis = RedisSentinel::builder()
        .tls(&certs, ClientAuth::NotRequired)
        .start()
        .unwrap();
    let old = redis.kill_primary().unwrap();
    let new = redis
        .wait_for_new_primary(old, Duration::from_secs(30))
        .unwrap();
    redis.restart(old).unwrap(); // a replica of the new primary, over TLS
    assert_eq!(redis.wait_settled(Duration::from_secs(30)).unwrap(), new);
    assert_eq!(redis.role(old).as_deref(), Some("slave"));
    let replica = (0..redis.len()).find(|&i| i != new).unwrap();
    redis.pause(replica).unwrap();
    assert_eq!(redis.role(replica), None);
    redis.resume(replica).unwrap();
    redis.kill_sentinel(0).unwrap();
    assert_eq!(redis.primary().unwrap(), new);
    redis.restart_sentinel(0).unwrap();
    assert_eq!(redis.wait_settled(Duration::from_secs(30)).unwrap(), new);
}

#[test]
fn a_redis_cluster_serves_tls_only_and_fails_over() {
    let certs = Certs::mint().unwrap();
    let cluster = RedisCluster::builder()
        .tls(&certs, ClientAuth::Required)
        .start()
        .unwrap();
    assert!(cluster.is_tls());
    assert_eq!(
        cluster.url(),
        format!("rediss+cluster://{}", cluster.addrs().join(","))
    );
    assert!(cluster.urls()[0].starts_with("rediss://127.0.0.1:"));
    let mutual = redis_cli_mutual(&certs);
    for addr in cluster.addrs() {
        assert_eq!(redis_ping_at(&addr, &mutual).trim(), "PONG", "{addr}");
        let plain = redis_ping_at(&addr, &[]);
        assert!(!plain.contains("PONG"), "{addr}: {plain}");
    }
    // The nodes announce their TLS ports: CLUSTER SLOTS names the kit's addresses.
    let slots = cluster.command(0, &["CLUSTER", "SLOTS"]).unwrap();
    let owner = slots.array().unwrap()[0].array().unwrap()[2]
        .array()
        .unwrap()[1]
        .int();
    let ports: Vec<i64> = cluster
        .addrs()
        .iter()
        .map(|a| a.rsplit(':').next().unwrap().parse().unwrap())
        .collect();
    assert!(ports.contains(&owner.unwrap()), "{slots:?}");
    let key_owner = cluster.node_for_key("k").unwrap();
    cluster.command(key_owner, &["SET", "k", "v"]).unwrap();
    let replica = cluster
        .replicas()
        .unwrap()
        .into_iter()
        .find(|&r| cluster.primary_of(r).unwrap() == Some(key_owner))
        .unwrap();
    cluster.failover(replica).unwrap();
    assert_eq!(cluster.node_for_key("k").unwrap(), replica);
    assert_eq!(
        cluster
            .command(replica, &["GET", "k"])
            .unwrap()
            .text()
            .as_deref(),
        Some("v")
    );
}

#[test]
fn a_tls_cluster_is_killed_frozen_and_restarted_as_in_plaintext() {
    let certs = Certs::mint().unwrap();
    let mut cluster = RedisCluster::builder()
        .tls(&certs, ClientAuth::NotRequired)
        .start()
        .unwrap();
    let primary = cluster.primaries().unwrap()[0];
    let replica = cluster
        .replicas()
        .unwrap()
        .into_iter()
        .find(|&r| cluster.primary_of(r).unwrap() == Some(primary))
        .unwrap();
    cluster.kill(primary).unwrap(); // its replica takes over, elected over the TLS bus
    cluster.wait_until_ok(Duration::from_secs(30)).unwrap();
    assert!(cluster.primaries().unwrap().contains(&replica));
    cluster.restart(primary).unwrap();
    cluster.wait_until_ok(Duration::from_secs(30)).unwrap();
    assert_eq!(cluster.primary_of(primary).unwrap(), Some(replica));
    cluster.pause(primary).unwrap();
    assert_eq!(cluster.role(primary), None);
    cluster.resume(primary).unwrap();
    cluster.wait_until_ok(Duration::from_secs(30)).unwrap();
}

/// `etcdctl put k v` at `url` with `flags`; what it printed, and whether it succeeded.
fn etcd_put(url: &str, flags: &[&std::ffi::OsStr]) -> (bool, String) {
    let mut cmd = Command::new("etcdctl");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("ETCDCTL_") {
            cmd.env_remove(name);
        }
    }
    let out = run(cmd
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={url}"))
        .args(["--dial-timeout=2s", "--command-timeout=3s"])
        .args(flags)
        .args(["put", "k", "v"]));
    (out.status.success(), text(&out))
}

#[test]
fn etcd_serves_tls_and_refuses_plaintext_and_strangers() {
    let certs = Certs::mint().unwrap();
    let etcd = EtcdServer::builder()
        .tls(&certs, ClientAuth::Required)
        .start()
        .unwrap();
    let https = etcd.client_url();
    assert_eq!(https, format!("https://127.0.0.1:{}", etcd.port()));
    assert_eq!(etcd.url(), format!("etcds://127.0.0.1:{}", etcd.port()));
    let ca = certs.ca_path().as_os_str();
    let (cert, key) = (
        certs.client_cert_path().as_os_str(),
        certs.client_key_path().as_os_str(),
    );
    let ok = etcd_put(
        &https,
        &[
            "--cacert".as_ref(),
            ca,
            "--cert".as_ref(),
            cert,
            "--key".as_ref(),
            key,
        ],
    );
    assert!(ok.0, "{}", ok.1);
    let no_cert = etcd_put(&https, &["--cacert".as_ref(), ca]);
    assert!(!no_cert.0, "{}", no_cert.1);
    let (s_cert, s_key) = (
        certs.stranger_cert_path().as_os_str(),
        certs.stranger_key_path().as_os_str(),
    );
    let stranger = etcd_put(
        &https,
        &[
            "--cacert".as_ref(),
            ca,
            "--cert".as_ref(),
            s_cert,
            "--key".as_ref(),
            s_key,
        ],
    );
    assert!(!stranger.0, "{}", stranger.1);
    let other_ca = certs.other_ca_path().as_os_str();
    let wrong_ca = etcd_put(
        &https,
        &[
            "--cacert".as_ref(),
            other_ca,
            "--cert".as_ref(),
            cert,
            "--key".as_ref(),
            key,
        ],
    );
    assert!(!wrong_ca.0, "{}", wrong_ca.1);
    let plain = etcd_put(&format!("http://{}", etcd.endpoint()), &[]);
    assert!(!plain.0, "{}", plain.1);
    // The kit's own etcdctl speaks TLS.
    assert_eq!(
        etcd.etcdctl(&["get", "k", "--print-value-only"])
            .unwrap()
            .trim(),
        "v"
    );
    eprintln!(
        "no cert: {}\nstranger: {}\nwrong ca: {}\nplain: {}",
        no_cert.1, stranger.1, wrong_ca.1, plain.1
    );
}

#[test]
fn etcd_can_present_the_expired_or_wrong_name_certificate() {
    let certs = Certs::mint().unwrap();
    for which in [ServerCert::Expired, ServerCert::WrongName] {
        let etcd = EtcdServer::builder()
            .tls(&certs, ClientAuth::NotRequired)
            .server_cert(which)
            .start()
            .unwrap();
        let refused = etcd_put(
            &etcd.client_url(),
            &["--cacert".as_ref(), certs.ca_path().as_os_str()],
        );
        assert!(!refused.0, "{}", refused.1);
        eprintln!("{which:?}: {}", refused.1);
        etcd.etcdctl(&["put", "k", "v"]).unwrap();
    }
}

#[test]
fn an_etcd_cluster_serves_tls() {
    let certs = Certs::mint().unwrap();
    let etcd = EtcdCluster::builder(3)
        .tls(&certs, ClientAuth::Required)
        .start()
        .unwrap();
    assert!(etcd.url().starts_with("etcds://"));
    assert!(etcd.client_urls().iter().all(|u| u.starts_with("https://")));
    etcd.member_etcdctl(0, &["put", "k", "v"]).unwrap();
    assert_eq!(
        etcd.member_etcdctl(2, &["get", "k", "--print-value-only"])
            .unwrap()
            .trim(),
        "v"
    );
    assert!(etcd.leader().is_some());
}

/// `psql -c 'SELECT 1'` with the connection string `conninfo`; whether it answered 1, and
/// what it printed.
fn psql(conninfo: &str) -> (bool, String) {
    let bin = std::fs::read_dir("/usr/lib/postgresql")
        .unwrap()
        .flatten()
        .map(|e| e.path().join("bin/psql"))
        .filter(|p| p.exists())
        .max()
        .expect("Debian's postgresql");
    let out = run(Command::new(bin)
        .env("PGCONNECT_TIMEOUT", "5")
        .args(["-X", "-A", "-t", "-c", "SELECT 1", "-d", conninfo]));
    (out.status.success() && text(&out).trim() == "1", text(&out))
}

#[test]
fn postgres_serves_tls_and_refuses_plaintext_and_strangers() {
    let certs = Certs::mint().unwrap();
    let pg = PostgresServer::builder()
        .tls(&certs, ClientAuth::Required)
        .start()
        .unwrap();
    assert_eq!(pg.psql("SHOW ssl").unwrap().trim(), "on");
    let base = format!("host=127.0.0.1 port={} dbname=postgres", pg.port());
    let d = |p: &std::path::Path| p.display().to_string();
    let client = format!(
        "sslcert={} sslkey={}",
        d(certs.client_cert_path()),
        d(certs.client_key_path())
    );
    let verify = format!("sslmode=verify-full sslrootcert={}", d(certs.ca_path()));
    // The client certificate logs in as postgres (pg_ident maps it) and as its own name.
    let ok = psql(&format!("{base} user=postgres {verify} {client}"));
    assert!(ok.0, "{}", ok.1);
    pg.psql(&format!("CREATE ROLE \"{}\" LOGIN", certs.client_name()))
        .unwrap();
    let own = psql(&format!(
        "{base} user={} {verify} {client}",
        certs.client_name()
    ));
    assert!(own.0, "{}", own.1);
    // The URL form, as tokio-postgres and libpq users write it.
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
        pg.url(),
        d(certs.ca_path()),
        d(certs.client_cert_path()),
        d(certs.client_key_path())
    );
    let by_url = psql(&url);
    assert!(by_url.0, "{}", by_url.1);

    let no_cert = psql(&format!("{base} user=postgres {verify}"));
    assert!(
        !no_cert.0 && no_cert.1.contains("certificate"),
        "{}",
        no_cert.1
    );
    let stranger = psql(&format!(
        "{base} user=postgres {verify} sslcert={} sslkey={}",
        d(certs.stranger_cert_path()),
        d(certs.stranger_key_path())
    ));
    assert!(!stranger.0, "{}", stranger.1);
    let wrong_ca = psql(&format!(
        "{base} user=postgres sslmode=verify-ca sslrootcert={} {client}",
        d(certs.other_ca_path())
    ));
    assert!(
        !wrong_ca.0 && wrong_ca.1.contains("certificate verify failed"),
        "{}",
        wrong_ca.1
    );
    let plain = psql(&format!("{base} user=postgres sslmode=disable"));
    assert!(!plain.0 && plain.1.contains("no encryption"), "{}", plain.1);
    eprintln!(
        "no cert: {}\nstranger: {}\nwrong ca: {}\nplain: {}",
        no_cert.1, stranger.1, wrong_ca.1, plain.1
    );
}

#[test]
fn postgres_can_present_the_expired_or_wrong_name_certificate() {
    let certs = Certs::mint().unwrap();
    let verify = format!(
        "sslmode=verify-full sslrootcert={}",
        certs.ca_path().display()
    );
    let expired = PostgresServer::builder()
        .tls(&certs, ClientAuth::NotRequired)
        .server_cert(ServerCert::Expired)
        .start()
        .unwrap();
    let refused = psql(&format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres {verify}",
        expired.port()
    ));
    // libpq says no more than that (the handshake test below names the expiry).
    assert!(
        !refused.0 && refused.1.contains("certificate verify failed"),
        "{}",
        refused.1
    );
    let wrong = PostgresServer::builder()
        .tls(&certs, ClientAuth::NotRequired)
        .server_cert(ServerCert::WrongName)
        .start()
        .unwrap();
    let refused = psql(&format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres {verify}",
        wrong.port()
    ));
    assert!(
        !refused.0 && refused.1.contains("wrong.example"),
        "{}",
        refused.1
    );
    // Without a client certificate required, a verifying client with the CA gets in.
    let ok = psql(&format!(
        "host=localhost port={} user=postgres dbname=postgres sslmode=verify-ca sslrootcert={}",
        wrong.port(),
        certs.ca_path().display()
    ));
    assert!(ok.0, "{}", ok.1);
}

#[test]
fn a_tls_postgres_restarts_and_has_a_standby() {
    let certs = Certs::mint().unwrap();
    let mut pg = PostgresServer::builder()
        .tls(&certs, ClientAuth::Required)
        .start()
        .unwrap();
    pg.psql("CREATE TABLE t (); ").unwrap();
    pg.restart().unwrap();
    let standby = pg.start_standby(None).unwrap();
    assert!(standby.is_tls());
    assert_eq!(
        standby.psql("SELECT pg_is_in_recovery()").unwrap().trim(),
        "t"
    );
    assert_eq!(standby.psql("SHOW ssl").unwrap().trim(), "on");
    standby.promote().unwrap();
    // Through a relay, the standby copies and follows over TLS with the kit's certificate.
    let relay = Relay::start(&format!("127.0.0.1:{}", pg.port())).unwrap();
    let relayed = pg.start_standby(Some(relay.port())).unwrap();
    assert_eq!(
        relayed.psql("SELECT pg_is_in_recovery()").unwrap().trim(),
        "t"
    );
    let sql = "SELECT count(*) FROM pg_stat_replication r JOIN pg_stat_ssl s USING (pid) \
               WHERE r.client_addr IS NOT NULL AND s.ssl";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while pg.psql(sql).unwrap().trim() != "1" {
        assert!(
            std::time::Instant::now() < deadline,
            "no replication over TLS"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// A verifying rustls client (the CA at `ca`, the name `name`, a client certificate and key
/// when given) on 127.0.0.1:`port`: sends `request` once the handshake is done and returns
/// the first bytes of the answer, or why there are none (a refused client certificate shows
/// as an alert when the answer is read).
fn tls_exchange(
    port: u16,
    ca: &Path,
    name: &str,
    client: Option<(&Path, &Path)>,
    request: &[u8],
) -> Result<Vec<u8>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match client {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_file(cert).unwrap()],
                PrivateKeyDer::from_pem_file(key).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    let name = ServerName::try_from(name.to_string()).unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut stream = rustls::StreamOwned::new(conn, tcp);
    stream.write_all(request).map_err(|e| e.to_string())?;
    let mut answer = [0u8; 64];
    let n = stream.read(&mut answer).map_err(|e| e.to_string())?;
    if n == 0 {
        return Err("closed without an answer".to_string());
    }
    Ok(answer[..n].to_vec())
}

/// ZooKeeper's ConnectRequest (protocol 0, no session, 10 s), framed.
fn zk_connect_request() -> Vec<u8> {
    let mut body = Vec::new();
    body.extend(0i32.to_be_bytes());
    body.extend(0i64.to_be_bytes());
    body.extend(10_000i32.to_be_bytes());
    body.extend(0i64.to_be_bytes());
    body.extend(16i32.to_be_bytes());
    body.extend([0u8; 16]);
    let mut framed = (body.len() as i32).to_be_bytes().to_vec();
    framed.extend(body);
    framed
}

#[test]
fn zookeeper_requires_client_certificates_of_the_ca() {
    let certs = Certs::mint().unwrap();
    let zk = ZkServer::builder()
        .tls_with(&certs, ClientAuth::Required)
        .start()
        .unwrap();
    assert_eq!(zk.tls_ca_pem(), Some(certs.ca_pem()));
    let port = zk.secure_port().unwrap();
    let request = zk_connect_request();
    let client = Some((certs.client_cert_path(), certs.client_key_path()));
    let answer = tls_exchange(port, certs.ca_path(), "127.0.0.1", client, &request);
    assert!(answer.as_ref().is_ok_and(|a| a.len() >= 4), "{answer:?}");
    let no_cert = tls_exchange(port, certs.ca_path(), "127.0.0.1", None, &request);
    assert!(no_cert.is_err(), "{no_cert:?}");
    let stranger = Some((certs.stranger_cert_path(), certs.stranger_key_path()));
    let refused = tls_exchange(port, certs.ca_path(), "localhost", stranger, &request);
    assert!(refused.is_err(), "{refused:?}");
    let wrong_ca = tls_exchange(port, certs.other_ca_path(), "127.0.0.1", client, &request);
    assert!(
        wrong_ca
            .as_ref()
            .is_err_and(|e| e.contains("UnknownIssuer")),
        "{wrong_ca:?}"
    );
    eprintln!("no cert: {no_cert:?}\nstranger: {refused:?}\nwrong ca: {wrong_ca:?}");
}

/// That `answer` is good (by `good`) when `refusal` is `None`, else an error naming it.
fn expect(
    which: ServerCert,
    refusal: Option<&str>,
    answer: Result<Vec<u8>, String>,
    good: impl Fn(&[u8]) -> bool,
) {
    match refusal {
        None => assert!(answer.as_deref().is_ok_and(good), "{which:?}: {answer:?}"),
        Some(reason) => assert!(
            answer.as_ref().is_err_and(|e| e.contains(reason)),
            "{which:?}: {answer:?}"
        ),
    }
}

#[test]
fn servers_present_the_certificate_they_are_told_to() {
    let certs = Certs::mint().unwrap();
    let ca = certs.ca_path();
    let client = Some((certs.client_cert_path(), certs.client_key_path()));
    for (which, refusal) in [
        (ServerCert::Valid, None),
        (ServerCert::Expired, Some("certificate expired")),
        (ServerCert::WrongName, Some("not valid for name")),
    ] {
        let zk = ZkServer::builder()
            .tls_with(&certs, ClientAuth::Required)
            .server_cert(which)
            .start()
            .unwrap();
        let port = zk.secure_port().unwrap();
        let answer = tls_exchange(port, ca, "127.0.0.1", client, &zk_connect_request());
        expect(which, refusal, answer, |a| a.len() >= 4);

        let redis = RedisServer::builder()
            .tls(&certs, ClientAuth::Required)
            .server_cert(which)
            .start()
            .unwrap();
        let answer = tls_exchange(redis.port(), ca, "127.0.0.1", client, b"PING\r\n");
        expect(which, refusal, answer, |a| a == b"+PONG\r\n");

        let etcd = EtcdServer::builder()
            .tls(&certs, ClientAuth::NotRequired)
            .server_cert(which)
            .start()
            .unwrap();
        let health = b"GET /health HTTP/1.0\r\n\r\n";
        let answer = tls_exchange(etcd.port(), ca, "127.0.0.1", None, health);
        expect(which, refusal, answer, |a| a.starts_with(b"HTTP/1.0 200"));
    }
    // The wrong name's certificate is good for its own name.
    let redis = RedisServer::builder()
        .tls(&certs, ClientAuth::NotRequired)
        .server_cert(ServerCert::WrongName)
        .start()
        .unwrap();
    let answer = tls_exchange(redis.port(), ca, "wrong.example", None, b"PING\r\n");
    assert_eq!(answer.as_deref(), Ok(&b"+PONG\r\n"[..]));
}
