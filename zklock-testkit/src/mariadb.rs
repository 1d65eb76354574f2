//! A real MariaDB for tests and demos: Debian's `mariadb-server` on a free loopback port with a
//! throwaway data directory, run as an unprivileged user when the tests run as root, with a
//! `zklock` database, a `zklock` account and a narrow `zklock_narrow` one; stopped (as in a
//! crash), restarted, paused (SIGSTOP) and resumed like
//! [`PostgresServer`](crate::PostgresServer).

use std::ffi::CString;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::certs::{Certs, ClientAuth, ServerCert, ServerTls};
use crate::daemon::{binary, on_free_ports, restart, Daemon, Log, Readiness};
use crate::ports::PortLease;
use crate::workdir;

/// How long a fresh server gets to answer a query.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Ports tried before giving up (a port claimed by no test may still be taken by another program).
const PORT_ATTEMPTS: usize = 5;
/// How long the kit's `mariadb` client waits for a connection and the server's greeting, in
/// seconds (a paused server accepts connections but never greets).
const CONNECT_TIMEOUT_SECS: u32 = 5;
/// The name of the server's Unix socket in its directory.
const SOCKET: &str = "mysqld.sock";

/// What the kit makes once a fresh server answers: the `zklock` database, the `zklock` account
/// (everything on it, and `PROCESS` to see every session) and the narrow `zklock_narrow` one
/// (rows of existing tables only). `@'127.0.0.1'` for TCP (the server resolves no names),
/// `@'localhost'` for the Unix socket.
const ACCOUNTS: &str = "\
    CREATE DATABASE zklock CHARACTER SET utf8mb4;\n\
    CREATE USER 'zklock'@'127.0.0.1' IDENTIFIED BY 'zklock', \
        'zklock'@'localhost' IDENTIFIED BY 'zklock';\n\
    GRANT ALL PRIVILEGES ON zklock.* TO 'zklock'@'127.0.0.1', 'zklock'@'localhost';\n\
    GRANT PROCESS ON *.* TO 'zklock'@'127.0.0.1', 'zklock'@'localhost';\n\
    CREATE USER 'zklock_narrow'@'127.0.0.1' IDENTIFIED BY 'zklock', \
        'zklock_narrow'@'localhost' IDENTIFIED BY 'zklock';\n\
    GRANT SELECT, INSERT, UPDATE, DELETE ON zklock.* \
        TO 'zklock_narrow'@'127.0.0.1', 'zklock_narrow'@'localhost';\n";

/// Settings of `mariadbd` for a small, fast server, given to `mariadb-install-db` too (which
/// passes them to the `mariadbd --bootstrap` it runs) so that the files it makes fit them.
const SMALL: &[&str] = &[
    "--innodb-buffer-pool-size=16M",
    "--innodb-log-file-size=8M",
    "--skip-log-bin",
    "--performance-schema=OFF",
    "--character-set-server=utf8mb4",
    "--collation-server=utf8mb4_general_ci",
];

/// When InnoDB writes and flushes its redo log: `innodb_flush_log_at_trx_commit`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Flush {
    /// `2`: written to the operating system at every commit, flushed to disk once a second. A
    /// crash of the server loses nothing; a crash of the machine, the last second.
    #[default]
    ToTheSystem,
    /// `1`: written and flushed at every commit, as production servers run.
    EveryCommit,
    /// `0`: written and flushed once a second: a crash of the server loses the last second.
    EverySecond,
}

impl Flush {
    /// The `mariadbd` settings of this mode.
    fn settings(self) -> [&'static str; 2] {
        match self {
            Flush::ToTheSystem => [
                "--innodb-flush-log-at-trx-commit=2",
                "--innodb-doublewrite=OFF",
            ],
            Flush::EveryCommit => [
                "--innodb-flush-log-at-trx-commit=1",
                "--innodb-doublewrite=ON",
            ],
            Flush::EverySecond => [
                "--innodb-flush-log-at-trx-commit=0",
                "--innodb-doublewrite=OFF",
            ],
        }
    }
}

/// A MariaDB server (`mariadbd`) on a free loopback port with a temporary data directory.
///
/// `mariadb-install-db` makes the data directory (no test database; `root` logs in without a
/// password, from 127.0.0.1 and the Unix socket only), and the server runs with
/// `--bind-address=127.0.0.1`, `--skip-name-resolve`, a 16 MB buffer pool, an 8 MB redo log, no
/// binary log, no performance schema, `utf8mb4`, a temporary directory of its own, and reads no
/// option file (`--no-defaults`: nothing of `/etc/mysql` applies). Its redo log is written to the operating system at every
/// commit and flushed to disk once a second (`innodb_flush_log_at_trx_commit=2`): a
/// [`stop`](Self::stop) (a crash of the server) loses no commit, a crash of the machine would;
/// [`MariaDbServerBuilder::durable`] flushes at every commit, and
/// [`MariaDbServerBuilder::lose_last_commits`] only once a second, so that a `stop` loses the
/// last second of commits.
///
/// Once it answers, the kit makes, as `root`:
///
/// - the database `zklock` (`utf8mb4`);
/// - the account `zklock` with the password `zklock`, as `'zklock'@'127.0.0.1'` (TCP) and
///   `'zklock'@'localhost'` (the Unix socket), with `ALL PRIVILEGES ON zklock.*` (make, alter and
///   drop tables, and use their rows: what a lock table's owner needs) and `PROCESS` on `*.*`, so
///   that it sees every session in `SHOW PROCESSLIST` and `information_schema.PROCESSLIST` (who
///   waits in `GET_LOCK`, and for what), not only its own. [`url`](Self::url) logs in as it;
/// - the account `zklock_narrow` with the password `zklock`, from the same two hosts, with
///   `SELECT, INSERT, UPDATE, DELETE ON zklock.*` only: it uses the rows of tables that exist
///   and may not make one (no `CREATE`), as an application account with least privilege.
///   [`narrow_url`](Self::narrow_url) logs in as it.
///
/// `GET_LOCK` and its kin need no grant.
///
/// When the tests run as root, the server runs as the `mysql` user of Debian's package (or
/// `nobody`), `--user=mysql`, which owns the directory. Dropping it kills the server and removes
/// the directory; so does the death of the test process (a watchdog kills the server then).
///
/// The binaries are `$ZKLOCK_MARIADBD` if set, else `/usr/sbin/mariadbd`, and
/// `$ZKLOCK_MARIADB_INSTALL_DB` and `$ZKLOCK_MARIADB` if set, else `/usr/bin/mariadb-install-db`
/// and `/usr/bin/mariadb` (Debian's `mariadb-server` package, which `scripts/setup` installs),
/// else each from `PATH`.
///
/// # Examples
///
/// ```no_run
/// use zklock_testkit::MariaDbServer;
///
/// let db = MariaDbServer::start()?;
/// println!("MariaDB at {}", db.url()); // mysql://zklock:zklock@127.0.0.1:PORT/zklock
/// assert_eq!(db.root_sql("SELECT GET_LOCK('x', 0)")?, "1");
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct MariaDbServer {
    // Field order is drop order: the process first, then the port, then the files.
    daemon: Daemon,
    lease: PortLease,
    log: Log,
    dir: tempfile::TempDir,
    flush: Flush,
    /// TLS required on TCP, when set (its files copied into the server's directory, `tls/`).
    tls: Option<ServerTls>,
}

/// Options for a [`MariaDbServer`]; made by [`MariaDbServer::builder`].
///
/// # Examples
///
/// ```no_run
/// let mut db = zklock_testkit::MariaDbServer::builder().durable().start()?;
/// db.root_sql("CREATE TABLE zklock.kept (id INT PRIMARY KEY); INSERT INTO zklock.kept VALUES (1)")?;
/// db.stop()?; // a crash
/// db.restart()?;
/// assert_eq!(db.root_sql("SELECT id FROM zklock.kept")?, "1");
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct MariaDbServerBuilder {
    flush: Flush,
    tls: Option<(Certs, ClientAuth)>,
    server_cert: Option<ServerCert>,
}

impl MariaDbServerBuilder {
    /// The redo log written and flushed to disk at every commit
    /// (`innodb_flush_log_at_trx_commit=1`, and the doublewrite buffer on), as production servers
    /// run and [`MariaDbServer::start_durable`] starts: not even a crash of the machine loses a
    /// commit. Replaces [`lose_last_commits`](Self::lose_last_commits).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let db = zklock_testkit::MariaDbServer::builder().durable().start()?;
    /// assert_eq!(db.root_sql("SELECT @@innodb_flush_log_at_trx_commit")?, "1");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn durable(mut self) -> Self {
        self.flush = Flush::EveryCommit;
        self
    }

    /// The redo log written and flushed only once a second, not at commit
    /// (`innodb_flush_log_at_trx_commit=0`): a [`stop`](MariaDbServer::stop) (a crash of the
    /// server) loses the commits of the last second, for crash tests of a server that loses
    /// acknowledged writes. Replaces [`durable`](Self::durable).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut db = zklock_testkit::MariaDbServer::builder().lose_last_commits().start()?;
    /// db.root_sql("CREATE TABLE zklock.t (id INT PRIMARY KEY)")?;
    /// std::thread::sleep(std::time::Duration::from_secs(2)); // the table is on disk
    /// db.root_sql("INSERT INTO zklock.t VALUES (1)")?; // acknowledged, in memory only
    /// db.stop()?; // a crash within the second
    /// db.restart()?;
    /// println!("{}", db.root_sql("SELECT COUNT(*) FROM zklock.t")?); // 0, most likely
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn lose_last_commits(mut self) -> Self {
        self.flush = Flush::EverySecond;
        self
    }

    /// Makes a data directory, starts a server on it, waits until it answers a query, and makes
    /// the database and accounts ([`MariaDbServer`] says which).
    ///
    /// # Errors
    ///
    /// As [`MariaDbServer::start`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let db = zklock_testkit::MariaDbServer::builder().start()?;
    /// # drop(db);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start(self) -> io::Result<MariaDbServer> {
        let tls = ServerTls::from_options(self.tls, self.server_cert)?;
        MariaDbServer::start_with(self.flush, tls)
    }

    /// TLS required of every TCP client (`require_secure_transport`), with the server's
    /// certificate from `certs` (signed by their CA, for `127.0.0.1` and `localhost`); with
    /// [`ClientAuth::Required`], the `zklock` and `zklock_narrow` accounts are made
    /// `REQUIRE X509`: they log in only with a client certificate the CA signed. The kit's own
    /// client (`root_sql`) reaches it through its Unix socket.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use zklock_testkit::{Certs, ClientAuth, MariaDbServer};
    ///
    /// let certs = Certs::mint()?;
    /// let db = MariaDbServer::builder().tls(&certs, ClientAuth::NotRequired).start()?;
    /// assert_eq!(db.root_sql("SELECT @@require_secure_transport")?, "1");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn tls(mut self, certs: &Certs, client_auth: ClientAuth) -> Self {
        self.tls = Some((certs.clone(), client_auth));
        self
    }

    /// Which of the certificates given to [`tls`](Self::tls) the server presents (the valid one
    /// by default; one for another name, an expired one: for tests of what a client refuses).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use zklock_testkit::{Certs, ClientAuth, MariaDbServer, ServerCert};
    ///
    /// let certs = Certs::mint()?;
    /// let db = MariaDbServer::builder()
    ///     .tls(&certs, ClientAuth::NotRequired)
    ///     .server_cert(ServerCert::WrongName)
    ///     .start()?;
    /// # drop(db);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn server_cert(mut self, which: ServerCert) -> Self {
        self.server_cert = Some(which);
        self
    }
}

impl MariaDbServer {
    /// Makes a data directory and starts a server on it, with the redo log flushed to disk once
    /// a second (fast; a crash of the machine would lose commits, a crash of the server does
    /// not), waits until it answers a query, and makes the `zklock` database and accounts.
    ///
    /// # Errors
    ///
    /// When the binaries are missing, `mariadb-install-db` fails, the server exits or stays
    /// silent during startup (the error carries the end of its log), or the accounts cannot be
    /// made.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let db = zklock_testkit::MariaDbServer::start()?;
    /// assert!(db.url().starts_with("mysql://zklock:zklock@127.0.0.1:"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start() -> io::Result<MariaDbServer> {
        MariaDbServer::builder().start()
    }

    /// Options for a server: how it flushes its redo log.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let db = zklock_testkit::MariaDbServer::builder().durable().start()?;
    /// # drop(db);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn builder() -> MariaDbServerBuilder {
        MariaDbServerBuilder::default()
    }

    /// As [`start`](Self::start), with the redo log flushed at every commit, as production
    /// servers run ([`MariaDbServerBuilder::durable`]).
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut db = zklock_testkit::MariaDbServer::start_durable()?;
    /// db.restart()?; // same port, same data
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start_durable() -> io::Result<MariaDbServer> {
        MariaDbServer::builder().durable().start()
    }

    fn start_with(flush: Flush, tls: Option<ServerTls>) -> io::Result<MariaDbServer> {
        let dir = workdir::create("mariadb")?;
        let user = run_as()?;
        // A temporary directory of its own: a starting server deletes every `#sql*` file in
        // its temporary directory, those of the servers sharing it included.
        let tmp = dir.path().join("tmp");
        std::fs::create_dir(&tmp)?;
        if let Some(user) = &user {
            std::os::unix::fs::chown(dir.path(), Some(user.uid), Some(user.gid))?;
            std::os::unix::fs::chown(&tmp, Some(user.uid), Some(user.gid))?;
        }
        install_db(dir.path(), user.as_ref())?;
        if let Some(tls) = &tls {
            install_tls_files(dir.path(), tls, user.as_ref())?;
        }
        let requires_cert = tls.as_ref().is_some_and(ServerTls::requires_client_cert);
        let server = Self::serve(dir, flush, tls)?;
        server.root_sql(ACCOUNTS)?;
        if requires_cert {
            server.root_sql(REQUIRE_X509)?;
        }
        Ok(server)
    }

    /// A server on the data directory `dir/data`, on a free port.
    fn serve(
        dir: tempfile::TempDir,
        flush: Flush,
        tls: Option<ServerTls>,
    ) -> io::Result<MariaDbServer> {
        // One data directory for every port tried.
        let mut dir = Some(dir);
        on_free_ports(1, PORT_ATTEMPTS, "mariadbd", |mut leases| {
            let dir_now = dir.take().expect("kept");
            let mut server = MariaDbServer {
                daemon: Daemon::new("mariadbd", io::ErrorKind::NotFound),
                lease: leases.remove(0),
                log: Log::new(dir_now.path().join("mariadbd.log")),
                dir: dir_now,
                flush,
                tls: tls.clone(),
            };
            match server.spawn() {
                Ok(()) => Ok(server),
                Err(e) => {
                    if e.kind() == io::ErrorKind::AddrInUse {
                        dir = Some(std::mem::replace(&mut server.dir, tempfile::tempdir()?));
                    }
                    Err(e)
                }
            }
        })
    }

    /// The port it listens on (127.0.0.1).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let db = zklock_testkit::MariaDbServer::start()?;
    /// assert!(db.port() > 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn port(&self) -> u16 {
        self.lease.port()
    }

    /// `mysql://zklock:zklock@127.0.0.1:PORT/zklock`: the `zklock` account, which may do
    /// anything in the `zklock` database and see every session ([`MariaDbServer`] lists its
    /// grants), for a MySQL client or `LockManager::connect`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let db = zklock_testkit::MariaDbServer::start()?;
    /// assert_eq!(db.url(), format!("mysql://zklock:zklock@127.0.0.1:{}/zklock", db.port()));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn url(&self) -> String {
        format!("mysql://zklock:zklock@127.0.0.1:{}/zklock", self.port())
    }

    /// `mysql://zklock_narrow:zklock@127.0.0.1:PORT/zklock`: the `zklock_narrow` account, which
    /// may only select, insert, update and delete rows of the tables in `zklock` (no `CREATE`),
    /// for least-privilege tests.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let db = zklock_testkit::MariaDbServer::start()?;
    /// assert!(db.narrow_url().starts_with("mysql://zklock_narrow:zklock@127.0.0.1:"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn narrow_url(&self) -> String {
        format!(
            "mysql://zklock_narrow:zklock@127.0.0.1:{}/zklock",
            self.port()
        )
    }

    /// The server's log file (`--log-error`, with anything it wrote to stdout and stderr).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let db = zklock_testkit::MariaDbServer::start()?;
    /// let log = std::fs::read_to_string(db.log_path())?;
    /// # let _ = log;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn log_path(&self) -> PathBuf {
        self.log.path().to_path_buf()
    }

    /// The server's process id, while it runs.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let db = zklock_testkit::MariaDbServer::start()?;
    /// assert!(db.pid().is_some());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn pid(&self) -> Option<u32> {
        self.daemon.pid()
    }

    /// Runs `sql` (one statement or several, each ended by `;`) with the `mariadb` client as
    /// `root` over TCP, in batch mode without column names (`-N -B`), and returns its output
    /// without the last newline: one line a row, columns separated by tabs, special characters
    /// escaped (`\n`, `\t`, `\\`), `NULL` as `NULL`. The first failing statement ends the run.
    ///
    /// # Errors
    ///
    /// When `mariadb` cannot run or a statement fails (with the client's message);
    /// [`io::ErrorKind::TimedOut`] when the server does not greet within 5 s (a
    /// [`pause`](Self::pause)d server).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let db = zklock_testkit::MariaDbServer::start()?;
    /// assert_eq!(db.root_sql("SELECT 1 + 1")?, "2");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn root_sql(&self, sql: &str) -> io::Result<String> {
        let out = client(self.port(), "root", None, self.tls_socket().as_deref())
            .arg("-e")
            .arg(sql)
            .stdin(Stdio::null())
            .output()?;
        if out.status.success() {
            let text = String::from_utf8_lossy(&out.stdout);
            return Ok(text.strip_suffix('\n').unwrap_or(&text).to_string());
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        // ETIMEDOUT (110), in "system error: 110" (no greeting) or "(110)" (no connection).
        let kind = if stderr.contains("system error: 110") || stderr.contains("(110)") {
            io::ErrorKind::TimedOut
        } else {
            io::ErrorKind::Other
        };
        Err(io::Error::new(
            kind,
            format!("mariadb failed ({}): {}", out.status, stderr.trim_end()),
        ))
    }

    /// Ends the session (connection) `id` as `root` (`KILL id`): its client's next request
    /// fails, its transaction rolls back and its `GET_LOCK` locks are released. A session's
    /// id is `CONNECTION_ID()`, or the `ID` of `information_schema.PROCESSLIST`.
    ///
    /// # Errors
    ///
    /// As [`root_sql`](Self::root_sql): when no session has that id, among others.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let db = zklock_testkit::MariaDbServer::start()?;
    /// let ids = db.root_sql("SELECT ID FROM information_schema.PROCESSLIST WHERE USER = 'zklock'")?;
    /// for id in ids.lines() {
    ///     db.kill_connection(id.parse().unwrap())?;
    /// }
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn kill_connection(&self, id: u64) -> io::Result<()> {
        self.root_sql(&format!("KILL CONNECTION {id}")).map(drop)
    }

    /// Whether it requires TLS of TCP clients ([`MariaDbServerBuilder::tls`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let db = zklock_testkit::MariaDbServer::start()?;
    /// assert!(!db.is_tls());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The Unix socket the kit's own client takes, on a TLS server.
    fn tls_socket(&self) -> Option<PathBuf> {
        self.tls.as_ref().map(|_| self.dir.path().join(SOCKET))
    }

    /// Kills the server (SIGKILL), as in a crash: connections break and every session's locks
    /// are gone. The data stays; a [`restart`](Self::restart) recovers it, with every commit
    /// unless it was started with [`lose_last_commits`](MariaDbServerBuilder::lose_last_commits).
    /// Does nothing when already stopped.
    ///
    /// # Errors
    ///
    /// When the process cannot be killed or reaped.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut db = zklock_testkit::MariaDbServer::start()?;
    /// db.stop()?;
    /// db.restart()?; // same port, same data
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn stop(&mut self) -> io::Result<()> {
        self.daemon.kill()
    }

    /// Starts the server again on the same port and data (stopping it first if it runs), and
    /// waits until it answers a query (InnoDB has recovered by then).
    ///
    /// # Errors
    ///
    /// When the server does not start within the startup timeout, with the tail of its log.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut db = zklock_testkit::MariaDbServer::start()?;
    /// let port = db.port();
    /// db.restart()?;
    /// assert_eq!(db.port(), port);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn restart(&mut self) -> io::Result<()> {
        self.stop()?;
        restart(|| self.spawn())
    }

    /// Freezes the server with SIGSTOP: connections stay open (and new ones are accepted by the
    /// kernel) but nothing answers, as in a long pause or a partition.
    ///
    /// # Errors
    ///
    /// When the server is stopped or `kill -STOP` fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let db = zklock_testkit::MariaDbServer::start()?;
    /// db.pause()?;
    /// assert!(db.root_sql("SELECT 1").is_err()); // after 5 s
    /// db.resume()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn pause(&self) -> io::Result<()> {
        self.daemon.pause(self.port())
    }

    /// Lets a [`pause`](Self::pause)d server run again (SIGCONT).
    ///
    /// # Errors
    ///
    /// When the server is stopped or `kill -CONT` fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let db = zklock_testkit::MariaDbServer::start()?;
    /// db.pause()?;
    /// db.resume()?;
    /// assert!(!db.is_paused());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn resume(&self) -> io::Result<()> {
        self.daemon.resume(self.port())
    }

    /// Whether the server is paused.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let db = zklock_testkit::MariaDbServer::start()?;
    /// assert!(!db.is_paused());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_paused(&self) -> bool {
        self.daemon.is_paused()
    }

    /// Starts `mariadbd` (killing a running one first) and waits until it answers a query.
    fn spawn(&mut self) -> io::Result<()> {
        let user = run_as()?;
        let dir = self.dir.path();
        // A socket lock file of a killed server names its pid, which another process may have
        // by now: the server would refuse the socket.
        for stale in [SOCKET.to_string(), format!("{SOCKET}.lock")] {
            match std::fs::remove_file(dir.join(stale)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        // The log file is opened here, as root: hand it to the server's user.
        let file = self.log.start_run()?;
        if let Some(user) = &user {
            std::os::unix::fs::chown(self.log.path(), Some(user.uid), Some(user.gid))?;
        }
        let program = mariadbd();
        let mut cmd = Command::new(&program);
        // --no-defaults first: nothing of /etc/mysql or ~/.my.cnf.
        cmd.arg("--no-defaults");
        if let Some(user) = &user {
            cmd.arg(format!("--user={}", user.name));
        }
        cmd.arg(path_setting("--datadir", &dir.join("data")))
            .arg(format!("--port={}", self.port()))
            .args(["--bind-address=127.0.0.1", "--skip-name-resolve"])
            .arg(path_setting("--socket", &dir.join(SOCKET)))
            .arg(path_setting("--pid-file", &dir.join("mariadbd.pid")))
            .arg(path_setting("--tmpdir", &dir.join("tmp")))
            .arg(path_setting("--log-error", self.log.path()))
            .arg("--max-connections=200")
            .args(SMALL)
            .args(self.flush.settings())
            .args(
                self.tls
                    .as_ref()
                    .map(|_| tls_settings(dir))
                    .unwrap_or_default(),
            )
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        self.daemon.spawn(
            &mut cmd,
            true,
            &program,
            "install Debian's mariadb-server package (scripts/setup does)",
        )?;
        let port = self.port();
        let ready = Readiness {
            port,
            log: &self.log,
            tail_lines: 20,
            ready_when: "answer SELECT 1",
            deadline: Instant::now() + STARTUP_TIMEOUT,
            poll: Duration::from_millis(25),
            kill_on_timeout: true,
        };
        let socket = self.tls_socket();
        self.daemon.wait_ready(
            ready,
            |_| Ok(answers(port, socket.as_deref()).then_some(())),
        )
    }
}

impl Drop for MariaDbServer {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Whether the server on `port` takes a TCP connection and answers `SELECT 1` to `root`.
fn answers(port: u16, socket: Option<&Path>) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    // A connection first: no client is run while nothing listens.
    if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        return false;
    }
    client(port, "root", Some(1), socket)
        .args(["-e", "SELECT 1"])
        .stdin(Stdio::null())
        .output()
        .is_ok_and(|out| out.status.success() && out.stdout.starts_with(b"1"))
}

/// The `mariadb` client logged in as `user` (no password) over TCP to `port`, in batch mode
/// without column names, reading no option file; waiting `connect_timeout` seconds for the
/// server (the kit's default when `None`).
fn client(port: u16, user: &str, connect_timeout: Option<u32>, socket: Option<&Path>) -> Command {
    let mut cmd = Command::new(binary("ZKLOCK_MARIADB", "mariadb"));
    cmd.arg("--no-defaults");
    match socket {
        // A TLS server requires TLS of TCP clients only: the kit's client, which must reach a
        // server whatever certificate it presents, takes its Unix socket.
        Some(socket) => cmd
            .arg("--protocol=SOCKET")
            .arg(path_setting("--socket", socket)),
        None => cmd
            .args(["--protocol=TCP", "-h", "127.0.0.1", "-P"])
            .arg(port.to_string()),
    };
    cmd.args(["-u", user, "-N", "-B", "--default-character-set=utf8mb4"])
        .arg(format!(
            "--connect-timeout={}",
            connect_timeout.unwrap_or(CONNECT_TIMEOUT_SECS)
        ));
    cmd
}

/// Where a TLS server's files are, under its directory.
const TLS_DIR: &str = "tls";

/// The accounts' client certificates required ([`ClientAuth::Required`]).
const REQUIRE_X509: &str = "\
    ALTER USER 'zklock'@'127.0.0.1' REQUIRE X509; ALTER USER 'zklock'@'localhost' REQUIRE X509;\n\
    ALTER USER 'zklock_narrow'@'127.0.0.1' REQUIRE X509;\n\
    ALTER USER 'zklock_narrow'@'localhost' REQUIRE X509;";

/// The server's TLS settings, its files under `dir`'s `tls/`: TLS required of TCP clients.
fn tls_settings(dir: &Path) -> Vec<std::ffi::OsString> {
    let tls = dir.join(TLS_DIR);
    vec![
        path_setting("--ssl-ca", &tls.join("ca.pem")),
        path_setting("--ssl-cert", &tls.join("server.pem")),
        path_setting("--ssl-key", &tls.join("server.key")),
        "--require-secure-transport=ON".into(),
    ]
}

/// Copies the server's certificate, key and CA into `dir`'s `tls/`, readable by `user` (the
/// server's), the key by it alone.
fn install_tls_files(dir: &Path, tls: &ServerTls, user: Option<&RunAs>) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let to = dir.join(TLS_DIR);
    std::fs::create_dir_all(&to)?;
    let files: [(&Path, &str, u32); 3] = [
        (tls.cert_path(), "server.pem", 0o644),
        (tls.key_path(), "server.key", 0o600),
        (tls.certs.ca_path(), "ca.pem", 0o644),
    ];
    for (from, name, mode) in files {
        let path = to.join(name);
        std::fs::copy(from, &path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
        if let Some(user) = user {
            std::os::unix::fs::chown(&path, Some(user.uid), Some(user.gid))?;
        }
    }
    if let Some(user) = user {
        std::os::unix::fs::chown(&to, Some(user.uid), Some(user.gid))?;
    }
    Ok(())
}

/// `mariadb-install-db` into `dir/data` (with `dir/tmp` for its temporary files): the system
/// tables, no test database, `root` without a password; run so that `user` owns the files, when
/// given.
fn install_db(dir: &Path, user: Option<&RunAs>) -> io::Result<()> {
    let program = binary("ZKLOCK_MARIADB_INSTALL_DB", "mariadb-install-db");
    let mut cmd = Command::new(&program);
    cmd.arg("--no-defaults");
    if let Some(user) = user {
        cmd.arg(format!("--user={}", user.name));
    }
    if let Some(server) = std::env::var_os("ZKLOCK_MARIADBD") {
        // The variable the script takes for the server it bootstraps with.
        cmd.env("MYSQLD_BOOTSTRAP", server);
    }
    let out = cmd
        .arg(path_setting("--datadir", &dir.join("data")))
        .arg(path_setting("--tmpdir", &dir.join("tmp")))
        .args([
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            "--skip-name-resolve",
        ])
        .args(SMALL)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot run {} ({e}); install Debian's mariadb-server package (scripts/setup \
                     does)",
                    program.display()
                ),
            )
        })?;
    if out.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "mariadb-install-db failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )))
}

/// `--name=path`.
fn path_setting(name: &str, path: &Path) -> std::ffi::OsString {
    let mut setting = std::ffi::OsString::from(format!("{name}="));
    setting.push(path);
    setting
}

/// The server binary: `$ZKLOCK_MARIADBD` if set, else Debian's `/usr/sbin/mariadbd`, else
/// `mariadbd` from `PATH`.
fn mariadbd() -> PathBuf {
    if let Some(path) = std::env::var_os("ZKLOCK_MARIADBD") {
        return PathBuf::from(path);
    }
    let debian = Path::new("/usr/sbin/mariadbd");
    if debian.exists() {
        debian.to_path_buf()
    } else {
        PathBuf::from("mariadbd")
    }
}

/// A user the server runs as.
struct RunAs {
    name: &'static str,
    uid: u32,
    gid: u32,
}

/// The user the server runs as when the tests run as root: `mysql` (Debian's package makes it),
/// else `nobody`. `None` when not root (the server runs as the caller).
fn run_as() -> io::Result<Option<RunAs>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    for name in ["mysql", "nobody"] {
        let c = CString::new(name).expect("no NUL");
        // SAFETY: a valid C string; the result is read at once, before any other getpw call
        // of this thread.
        let pw = unsafe { libc::getpwnam(c.as_ptr()) };
        if !pw.is_null() {
            // SAFETY: non-null, as returned by getpwnam.
            let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
            return Ok(Some(RunAs { name, uid, gid }));
        }
    }
    Err(io::Error::other(
        "running as root, and there is no mysql or nobody user to run MariaDB as",
    ))
}
