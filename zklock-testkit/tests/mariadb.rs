//! The test kit's MariaDB against Debian's mariadb-server: a server answers and takes a user
//! lock, its accounts and what each may do, a durable row across a crash, lost commits, pause and
//! resume, ending a session, servers in parallel, and cleanup on drop.

use std::io;
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use zklock_testkit::MariaDbServer;

fn process_alive(pid: u32) -> bool {
    // A zombie still has a /proc entry; its state is Z.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z')
        })
        .unwrap_or(false)
}

/// The `mariadb` client as `user` (password `zklock`) over TCP to `db`'s `zklock` database.
fn client(db: &MariaDbServer, user: &str) -> Command {
    let mut cmd = Command::new("mariadb");
    cmd.arg("--no-defaults")
        .args(["--protocol=TCP", "-h", "127.0.0.1", "-P"])
        .arg(db.port().to_string())
        .args([
            "-u",
            user,
            "-pzklock",
            "-N",
            "-B",
            "--connect-timeout=5",
            "zklock",
        ])
        .stdin(Stdio::null());
    cmd
}

/// Runs `sql` as `user` (see [`client`]).
fn sql_as(db: &MariaDbServer, user: &str, sql: &str) -> Output {
    client(db, user).arg("-e").arg(sql).output().unwrap()
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "mariadb failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn a_server_answers_and_takes_a_user_lock() {
    let started = Instant::now();
    let db = MariaDbServer::start().unwrap();
    eprintln!("mariadb: one server ready in {:?}", started.elapsed());
    let port = db.port();
    assert_eq!(
        db.url(),
        format!("mysql://zklock:zklock@127.0.0.1:{port}/zklock")
    );
    assert_eq!(
        db.narrow_url(),
        format!("mysql://zklock_narrow:zklock@127.0.0.1:{port}/zklock")
    );
    assert_eq!(db.root_sql("SELECT GET_LOCK('x', 0)").unwrap(), "1");
    assert_eq!(db.root_sql("SELECT 1; SELECT 2").unwrap(), "1\n2");
    assert_eq!(
        db.root_sql("SELECT @@port, @@bind_address, @@innodb_flush_log_at_trx_commit")
            .unwrap(),
        format!("{port}\t127.0.0.1\t2")
    );
    let err = db.root_sql("SELECT * FROM no_such_table").unwrap_err();
    assert!(err.to_string().contains("No database selected"), "{err}");
    let log = std::fs::read_to_string(db.log_path()).unwrap();
    assert!(log.contains("ready for connections"), "{log}");
    // As root, the server runs as Debian's mysql user.
    let pid = db.pid().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert!(!uid.split_whitespace().skip(1).any(|id| id == "0"), "{uid}");
    }
}

#[test]
fn the_zklock_account_makes_tables_and_sees_every_session() {
    let db = MariaDbServer::start().unwrap();
    let made = sql_as(
        &db,
        "zklock",
        "CREATE TABLE locks (name VARCHAR(64) PRIMARY KEY, token BIGINT NOT NULL); \
         INSERT INTO locks VALUES ('a', 1); SELECT token FROM locks WHERE name = 'a'",
    );
    assert_eq!(stdout(&made), "1");
    let grants = stdout(&sql_as(&db, "zklock", "SHOW GRANTS"));
    assert!(
        grants.contains("GRANT PROCESS ON *.* TO `zklock`@`127.0.0.1`"),
        "{grants}"
    );
    assert!(
        grants.contains("GRANT ALL PRIVILEGES ON `zklock`.* TO `zklock`@`127.0.0.1`"),
        "{grants}"
    );
    // The Unix socket takes 'zklock'@'localhost'.
    let socket = db.log_path().parent().unwrap().join("mysqld.sock");
    let out = Command::new("mariadb")
        .arg("--no-defaults")
        .arg(format!("--socket={}", socket.display()))
        .args(["-u", "zklock", "-pzklock", "-N", "-B", "zklock", "-e"])
        .arg("SELECT CURRENT_USER(), COUNT(*) FROM locks")
        .output()
        .unwrap();
    assert_eq!(stdout(&out), "zklock@localhost\t1");
    // A wrong password is refused.
    let out = Command::new("mariadb")
        .args(["--no-defaults", "--protocol=TCP", "-h", "127.0.0.1", "-P"])
        .arg(db.port().to_string())
        .args(["-u", "zklock", "-pwrong", "-e", "SELECT 1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("Access denied"));
}

#[test]
fn the_narrow_account_uses_rows_but_makes_no_table() {
    let db = MariaDbServer::start().unwrap();
    db.root_sql("CREATE TABLE zklock.locks (name VARCHAR(64) PRIMARY KEY, token BIGINT)")
        .unwrap();
    let create = sql_as(&db, "zklock_narrow", "CREATE TABLE mine (id INT)");
    assert!(!create.status.success());
    let denied = String::from_utf8_lossy(&create.stderr);
    assert!(denied.contains("CREATE command denied"), "{denied}");
    let rows = sql_as(
        &db,
        "zklock_narrow",
        "INSERT INTO locks VALUES ('a', 1); UPDATE locks SET token = 2 WHERE name = 'a'; \
         SELECT token FROM locks; DELETE FROM locks; SELECT COUNT(*) FROM locks",
    );
    assert_eq!(stdout(&rows), "2\n0");
    for forbidden in [
        "DROP TABLE locks",
        "ALTER TABLE locks ADD c INT",
        "SHOW PROCESSLIST",
    ] {
        let out = sql_as(&db, "zklock_narrow", forbidden);
        if forbidden.starts_with("SHOW") {
            // Allowed, but only its own session shows.
            assert_eq!(stdout(&out).lines().count(), 1, "{forbidden}");
        } else {
            assert!(!out.status.success(), "{forbidden} was allowed");
        }
    }
    // User locks need no grant.
    assert_eq!(
        stdout(&sql_as(&db, "zklock_narrow", "SELECT GET_LOCK('n', 0)")),
        "1"
    );
}

#[test]
fn a_durable_server_keeps_a_row_across_a_crash() {
    let mut db = MariaDbServer::builder().durable().start().unwrap();
    assert_eq!(
        db.root_sql("SELECT @@innodb_flush_log_at_trx_commit")
            .unwrap(),
        "1"
    );
    let port = db.port();
    db.root_sql(
        "CREATE TABLE zklock.kept (id INT PRIMARY KEY); INSERT INTO zklock.kept VALUES (7)",
    )
    .unwrap();
    let pid = db.pid().unwrap();
    db.stop().unwrap();
    assert!(!process_alive(pid));
    assert_eq!(db.pid(), None);
    assert!(db.root_sql("SELECT 1").is_err());
    db.stop().unwrap(); // already stopped: nothing to do
    let restarted = Instant::now();
    db.restart().unwrap();
    eprintln!(
        "mariadb: restarted after a crash in {:?}",
        restarted.elapsed()
    );
    assert_eq!(db.port(), port);
    assert_ne!(db.pid(), Some(pid));
    assert_eq!(db.root_sql("SELECT id FROM zklock.kept").unwrap(), "7");
    // The accounts are kept too, and a restart of a running server works.
    db.restart().unwrap();
    assert_eq!(stdout(&sql_as(&db, "zklock", "SELECT id FROM kept")), "7");
}

#[test]
fn a_server_that_loses_last_commits_loses_them_in_a_crash() {
    let mut db = MariaDbServer::builder()
        .lose_last_commits()
        .start()
        .unwrap();
    assert_eq!(
        db.root_sql("SELECT @@innodb_flush_log_at_trx_commit")
            .unwrap(),
        "0"
    );
    db.root_sql("CREATE TABLE zklock.t (id INT PRIMARY KEY)")
        .unwrap();
    // Once a second the log reaches the disk: a commit just before the crash is lost unless
    // the crash came just after that second's flush. Three tries.
    thread::sleep(Duration::from_millis(1500));
    let mut lost = 0;
    for i in 0..3 {
        db.root_sql(&format!("INSERT INTO zklock.t VALUES ({i})"))
            .unwrap();
        db.stop().unwrap();
        db.restart().unwrap();
        let found = db.root_sql(&format!("SELECT COUNT(*) FROM zklock.t WHERE id = {i}"));
        if found.unwrap() == "0" {
            lost += 1;
        }
    }
    assert!(lost > 0, "no commit was lost in 3 crashes");
    // The table itself, made long before, is there.
    db.root_sql("SELECT COUNT(*) FROM zklock.t").unwrap();
}

#[test]
fn a_paused_server_times_out_until_resumed() {
    let db = MariaDbServer::start().unwrap();
    // A session in a query before the pause, which would end in 2 s.
    let mut before = client(&db, "zklock")
        .args(["-e", "SELECT SLEEP(2); SELECT 'answered'"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let sleeping = "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                    WHERE INFO LIKE 'SELECT SLEEP(2)%'";
    let deadline = Instant::now() + Duration::from_secs(10);
    while db.root_sql(sleeping).unwrap() != "1" {
        assert!(
            Instant::now() < deadline,
            "the session never started its query"
        );
        thread::sleep(Duration::from_millis(20));
    }
    db.pause().unwrap();
    assert!(db.is_paused());
    let asked = Instant::now();
    let err = db.root_sql("SELECT 1").unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
    assert!(
        asked.elapsed() >= Duration::from_secs(4),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(before.try_wait().unwrap(), None, "a paused server answered");
    db.resume().unwrap();
    assert!(!db.is_paused());
    assert_eq!(db.root_sql("SELECT 1").unwrap(), "1");
    assert!(before.wait().unwrap().success());
}

/// A session of `zklock_narrow` that holds the user lock `name` and then sleeps a minute.
fn holder(db: &MariaDbServer, name: &str) -> Child {
    client(db, "zklock_narrow")
        .arg("-e")
        .arg(format!("SELECT GET_LOCK('{name}', 0); SELECT SLEEP(60)"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn kill_connection_ends_a_session_and_frees_its_lock() {
    let db = MariaDbServer::start().unwrap();
    let mut held = holder(&db, "held");
    let deadline = Instant::now() + Duration::from_secs(10);
    let id: u64 = loop {
        let holder = db.root_sql("SELECT IS_USED_LOCK('held')").unwrap();
        if holder != "NULL" {
            break holder.parse().unwrap();
        }
        assert!(Instant::now() < deadline, "the lock was never taken");
        thread::sleep(Duration::from_millis(20));
    };
    // With PROCESS, the zklock account sees the other account's session.
    let seen = sql_as(
        &db,
        "zklock",
        "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = 'zklock_narrow'",
    );
    assert_eq!(stdout(&seen), id.to_string());
    db.kill_connection(id).unwrap();
    let status = held.wait().unwrap();
    assert!(!status.success());
    assert_eq!(db.root_sql("SELECT IS_FREE_LOCK('held')").unwrap(), "1");
    assert!(db.kill_connection(id).is_err(), "no such session any more");
}

#[test]
fn servers_started_in_parallel_get_their_own_ports_and_data() {
    let started = Instant::now();
    let servers: Vec<MariaDbServer> = (0..3)
        .map(|_| thread::spawn(MariaDbServer::start))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap().unwrap())
        .collect();
    eprintln!(
        "mariadb: 3 servers in parallel ready in {:?}",
        started.elapsed()
    );
    let mut ports: Vec<u16> = servers.iter().map(MariaDbServer::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 3);
    for (i, db) in servers.iter().enumerate() {
        db.root_sql(&format!(
            "CREATE TABLE zklock.mine (id INT); INSERT INTO zklock.mine VALUES ({i})"
        ))
        .unwrap();
    }
    for (i, db) in servers.iter().enumerate() {
        assert_eq!(
            db.root_sql("SELECT id FROM zklock.mine").unwrap(),
            i.to_string()
        );
        assert_eq!(db.root_sql("SELECT @@port").unwrap(), db.port().to_string());
    }
}

#[test]
fn drop_kills_the_server_even_when_paused_and_removes_its_files() {
    let db = MariaDbServer::start().unwrap();
    let pid = db.pid().unwrap();
    let dir = db.log_path().parent().unwrap().to_path_buf();
    assert!(dir.join("data").is_dir());
    db.pause().unwrap();
    drop(db);
    assert!(!process_alive(pid));
    assert!(!dir.exists(), "{} is left", dir.display());
}
