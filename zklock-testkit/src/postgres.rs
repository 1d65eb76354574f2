//! A real PostgreSQL for tests and demos: Debian's `postgresql` on a free loopback port with a
//! throwaway data directory, run as an unprivileged user (PostgreSQL refuses to run as root);
//! stopped (as in a crash), restarted, paused (SIGSTOP) and resumed like
//! [`RedisServer`](crate::RedisServer); plaintext, or TLS only on TCP.

use std::ffi::{CString, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::certs::{Certs, ClientAuth, ServerCert, ServerTls};
use crate::daemon::{on_free_ports, restart, Daemon, Log, Readiness};
use crate::ports::PortLease;
use crate::workdir;

/// How long a fresh server gets to accept connections.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Ports tried before giving up (a port claimed by no test may still be taken by another program).
const PORT_ATTEMPTS: usize = 5;

/// A PostgreSQL server (`postgres`) on a free loopback port with a temporary data directory.
///
/// `initdb` makes a cluster with `trust` authentication for the superuser `postgres`, listening
/// on 127.0.0.1 only, with `fsync=off` unless [`start_durable`](Self::start_durable) is used.
/// When the tests run as root, the server runs as the `postgres` user of Debian's package (or
/// `nobody`), which owns the data directory. Dropping it kills the server (every backend
/// with it) and removes the directory; so does the death of the test process (a watchdog
/// kills the server's process group then).
///
/// The binaries are those of `$ZKLOCK_POSTGRES_BIN` if set, else of the newest
/// `/usr/lib/postgresql/<version>/bin` (Debian's `postgresql` package, which `scripts/setup`
/// installs).
///
/// [`PostgresServer::builder`] starts it in TLS mode too ([`PostgresServerBuilder::tls`]).
///
/// # Examples
///
/// ```no_run
/// use zklock_testkit::PostgresServer;
///
/// let pg = PostgresServer::start()?;
/// println!("PostgreSQL at {}", pg.url()); // postgres://postgres@127.0.0.1:PORT/postgres
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct PostgresServer {
    // Field order is drop order: the process first, then the port, then the files.
    daemon: Daemon,
    lease: PortLease,
    log: Log,
    dir: tempfile::TempDir,
    bin: PathBuf,
    durable: bool,
    /// Variables the server runs with (a [`ServerClock`](crate::ServerClock)'s).
    env: Vec<(OsString, OsString)>,
    /// TLS only on TCP, when set (its files copied into the server's directory, `tls/`).
    tls: Option<ServerTls>,
}

/// Options for a [`PostgresServer`]; made by [`PostgresServer::builder`].
///
/// # Examples
///
/// ```no_run
/// use zklock_testkit::{Certs, ClientAuth, PostgresServer};
///
/// let certs = Certs::mint()?;
/// let pg = PostgresServer::builder()
///     .tls(&certs, ClientAuth::Required)
///     .start()?;
/// assert_eq!(pg.psql("SHOW ssl")?.trim(), "on");
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct PostgresServerBuilder {
    durable: bool,
    env: Vec<(OsString, OsString)>,
    tls: Option<(Certs, ClientAuth)>,
    server_cert: Option<ServerCert>,
}

impl PostgresServerBuilder {
    /// `fsync` on, as [`PostgresServer::start_durable`] starts.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let pg = zklock_testkit::PostgresServer::builder().durable().start()?;
    /// assert_eq!(pg.psql("SHOW fsync")?.trim(), "on");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn durable(mut self) -> Self {
        self.durable = true;
        self
    }

    /// The wall clock of `clock`, as [`PostgresServer::start_with_clock`] starts.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let clock = zklock_testkit::ServerClock::new()?;
    /// let pg = zklock_testkit::PostgresServer::builder().clock(&clock).start()?;
    /// # drop(pg);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn clock(mut self, clock: &crate::ServerClock) -> Self {
        self.env = clock.env();
        self
    }

    /// Serves TLS, and only TLS on TCP: `ssl = on` with [`Certs::server_cert_path`] (or the
    /// certificate [`server_cert`](Self::server_cert) picks) and `ssl_ca_file`
    /// [`Certs::ca_path`] (a client certificate from another CA is refused), and a
    /// `pg_hba.conf` that rejects every TCP connection without TLS (`hostnossl ... reject`).
    ///
    /// With [`ClientAuth::Required`], a TCP client must present a certificate of the CA's
    /// (`hostssl ... cert map=zklock`): the certificate's common name is the role it logs in
    /// as, and [`Certs::client_name`]'s certificate may log in as `postgres` too, so
    /// [`PostgresServer::url`] works with it. With [`ClientAuth::NotRequired`], TLS clients
    /// are trusted as before (`hostssl ... trust`).
    ///
    /// The kit's own `psql`, `pg_isready` and `pg_basebackup` runs use the server's Unix
    /// socket, which stays open to the `postgres` superuser without TLS.
    ///
    /// A client connects as libpq users write it:
    /// `postgres://postgres@127.0.0.1:PORT/postgres?sslmode=verify-full&sslrootcert=CA&sslcert=CERT&sslkey=KEY`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use zklock_testkit::{Certs, ClientAuth, PostgresServer};
    ///
    /// let certs = Certs::mint()?;
    /// let pg = PostgresServer::builder().tls(&certs, ClientAuth::NotRequired).start()?;
    /// let url = format!("{}?sslmode=verify-full&sslrootcert={}", pg.url(), certs.ca_path().display());
    /// # let _ = url;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn tls(mut self, certs: &Certs, client_auth: ClientAuth) -> Self {
        self.tls = Some((certs.clone(), client_auth));
        self
    }

    /// Which of the certificates given to [`tls`](Self::tls) the server presents (the valid one
    /// unless told): the wrong name's or the expired one, which `sslmode=verify-full` refuses
    /// (and `verify-ca` too, for the expired one).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use zklock_testkit::{Certs, ClientAuth, PostgresServer, ServerCert};
    ///
    /// let certs = Certs::mint()?;
    /// let pg = PostgresServer::builder()
    ///     .tls(&certs, ClientAuth::NotRequired)
    ///     .server_cert(ServerCert::WrongName)
    ///     .start()?;
    /// # drop(pg);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn server_cert(mut self, which: ServerCert) -> Self {
        self.server_cert = Some(which);
        self
    }

    /// Makes a cluster and starts a server on it, and waits until it accepts connections.
    ///
    /// # Errors
    ///
    /// As [`PostgresServer::start`]; [`io::ErrorKind::InvalidInput`] when
    /// [`server_cert`](Self::server_cert) was given without [`tls`](Self::tls).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let pg = zklock_testkit::PostgresServer::builder().start()?;
    /// # drop(pg);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start(self) -> io::Result<PostgresServer> {
        let tls = ServerTls::from_options(self.tls, self.server_cert)?;
        PostgresServer::start_with(self.durable, self.env, tls)
    }
}

impl PostgresServer {
    /// Makes a cluster and starts a server on it, with `fsync=off` (fast; a crash of the
    /// machine would lose data, a crash of the server does not), and waits until it accepts
    /// connections.
    ///
    /// # Errors
    ///
    /// When the binaries are missing, `initdb` fails, or the server exits or stays silent during
    /// startup (the error carries the end of its log).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let pg = zklock_testkit::PostgresServer::start()?;
    /// assert!(pg.url().starts_with("postgres://postgres@127.0.0.1:"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start() -> io::Result<PostgresServer> {
        PostgresServer::builder().start()
    }

    /// Options for a server: durability, a moved clock, TLS.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let pg = zklock_testkit::PostgresServer::builder().durable().start()?;
    /// # drop(pg);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn builder() -> PostgresServerBuilder {
        PostgresServerBuilder::default()
    }

    /// As [`start`](Self::start), with `fsync` on, as production servers run (for benchmarks).
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let pg = zklock_testkit::PostgresServer::start_durable()?;
    /// # let _ = pg;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start_durable() -> io::Result<PostgresServer> {
        PostgresServer::builder().durable().start()
    }

    /// As [`start`](Self::start), on a wall clock that the test moves with `clock` (its
    /// restarts too): `clock_timestamp()`, `now()` and everything the server times by the
    /// wall clock follow it.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// let clock = zklock_testkit::ServerClock::new()?;
    /// let pg = zklock_testkit::PostgresServer::start_with_clock(&clock)?;
    /// clock.step_forward(Duration::from_secs(3600));
    /// println!("{}", pg.psql("SELECT clock_timestamp()")?); // an hour ahead
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start_with_clock(clock: &crate::ServerClock) -> io::Result<PostgresServer> {
        PostgresServer::builder().clock(clock).start()
    }

    fn start_with(
        durable: bool,
        env: Vec<(OsString, OsString)>,
        tls: Option<ServerTls>,
    ) -> io::Result<PostgresServer> {
        let bin = bin_dir()?;
        let dir = workdir::create("postgres")?;
        let user = run_as()?;
        if let Some((uid, gid)) = user {
            chown(dir.path(), uid, gid)?;
        }
        let initdb = run_command(
            Command::new(bin.join("initdb"))
                .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C"])
                .arg("--no-sync")
                .arg("-D")
                .arg(dir.path().join("data")),
            user,
        )
        .output()
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot run {} ({e}); install Debian's postgresql package (scripts/setup does)",
                    bin.join("initdb").display()
                ),
            )
        })?;
        if !initdb.status.success() {
            return Err(io::Error::other(format!(
                "initdb failed ({}): {}{}",
                initdb.status,
                String::from_utf8_lossy(&initdb.stdout),
                String::from_utf8_lossy(&initdb.stderr)
            )));
        }
        if let Some(tls) = &tls {
            write_tls_hba(&dir.path().join("data"), tls, user)?;
        }
        Self::serve(dir, bin, durable, env, tls)
    }

    /// A server on the data directory `dir/data` (made by `initdb` or `pg_basebackup`), on a
    /// free port.
    fn serve(
        dir: tempfile::TempDir,
        bin: PathBuf,
        durable: bool,
        env: Vec<(OsString, OsString)>,
        tls: Option<ServerTls>,
    ) -> io::Result<PostgresServer> {
        if let Some(tls) = &tls {
            install_tls_files(dir.path(), tls, run_as()?)?;
        }
        // One data directory for every port tried.
        let mut dir = Some(dir);
        on_free_ports(1, PORT_ATTEMPTS, "postgres", |mut leases| {
            let dir_now = dir.take().expect("kept");
            let mut server = PostgresServer {
                daemon: Daemon::new("postgres", io::ErrorKind::NotFound),
                lease: leases.remove(0),
                log: Log::new(dir_now.path().join("postgres.log")),
                dir: dir_now,
                bin: bin.clone(),
                durable,
                env: env.clone(),
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
    /// let pg = zklock_testkit::PostgresServer::start()?;
    /// assert!(pg.port() > 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn port(&self) -> u16 {
        self.lease.port()
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`, for a PostgreSQL client or
    /// `LockManager::connect`; the same in TLS mode, where a client adds libpq's `sslmode`,
    /// `sslrootcert`, `sslcert` and `sslkey` (see [`PostgresServerBuilder::tls`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let pg = zklock_testkit::PostgresServer::start()?;
    /// let url = pg.url();
    /// # let _ = url;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port())
    }

    /// Whether it serves TCP clients over TLS only ([`PostgresServerBuilder::tls`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let pg = zklock_testkit::PostgresServer::start()?;
    /// assert!(!pg.is_tls());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Where the kit's own tools connect: the URL, or in TLS mode the Unix socket (which
    /// needs no certificate).
    fn local_conninfo(&self) -> OsString {
        if self.tls.is_none() {
            return self.url().into();
        }
        let mut info = OsString::from("host=");
        info.push(self.dir.path());
        info.push(format!(
            " port={} user=postgres dbname=postgres",
            self.port()
        ));
        info
    }

    /// The server's log file.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let pg = zklock_testkit::PostgresServer::start()?;
    /// let log = std::fs::read_to_string(pg.log_path())?;
    /// # let _ = log;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn log_path(&self) -> PathBuf {
        self.log.path().to_path_buf()
    }

    /// The postmaster's process id, while it runs.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let pg = zklock_testkit::PostgresServer::start()?;
    /// assert!(pg.pid().is_some());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn pid(&self) -> Option<u32> {
        self.daemon.pid()
    }

    /// Runs `sql` with `psql` as the superuser and returns its output (unaligned, tuples only),
    /// e.g. to end a session with `pg_terminate_backend`. In TLS mode it goes through the Unix
    /// socket.
    ///
    /// # Errors
    ///
    /// When `psql` cannot run or the statement fails (with psql's message).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let pg = zklock_testkit::PostgresServer::start()?;
    /// assert_eq!(pg.psql("SELECT 1 + 1")?.trim(), "2");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn psql(&self, sql: &str) -> io::Result<String> {
        let out = Command::new(self.bin.join("psql"))
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d"])
            .arg(self.local_conninfo())
            .arg("-c")
            .arg(sql)
            .stdin(Stdio::null())
            .output()?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(io::Error::other(format!(
                "psql failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )))
        }
    }

    /// Kills the server and every backend (SIGKILL to its process group), as in a crash:
    /// connections break and every session's locks are gone. The data stays; a
    /// [`restart`](Self::restart) recovers it. Does nothing when already stopped.
    ///
    /// # Errors
    ///
    /// When the processes cannot be killed or reaped.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut pg = zklock_testkit::PostgresServer::start()?;
    /// pg.stop()?;
    /// pg.restart()?; // same port, same data
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn stop(&mut self) -> io::Result<()> {
        let Some(mut postmaster) = self.daemon.take() else {
            return Ok(());
        };
        // Each backend leads a session of its own (PostgreSQL's children call setsid), so a
        // signal to the postmaster's process group misses them: freeze the postmaster (no new
        // children), kill its children, then it.
        let _ = signal(postmaster.id(), libc::SIGSTOP);
        let backends = children(postmaster.id());
        for child in &backends {
            let _ = signal(*child, libc::SIGKILL);
        }
        postmaster.kill()?;
        // A killed backend lets go of the server's shared memory only once it has exited; a
        // server started on the same data before then refuses to start ("pre-existing shared
        // memory block is still in use").
        wait_gone(&backends, Duration::from_secs(10));
        Ok(())
    }

    /// Starts the server again on the same port and data (stopping it first if it runs), and
    /// waits until it accepts connections.
    ///
    /// # Errors
    ///
    /// When the server does not start within the startup timeout, with the tail of its log.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut pg = zklock_testkit::PostgresServer::start()?;
    /// let port = pg.port();
    /// pg.restart()?;
    /// assert_eq!(pg.port(), port);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn restart(&mut self) -> io::Result<()> {
        self.stop()?;
        restart(|| self.spawn())
    }

    /// Starts the server again as a standby: `standby.signal` in its data directory and no
    /// primary to follow, so it stays in recovery, read-only, as a hot standby is (its
    /// `pg_is_in_recovery()` is true). For tests of what a client does when its URL reaches
    /// a standby.
    ///
    /// # Errors
    ///
    /// When the file cannot be written or the server does not start again.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut pg = zklock_testkit::PostgresServer::start()?;
    /// pg.restart_as_standby()?;
    /// assert_eq!(pg.psql("SELECT pg_is_in_recovery()")?.trim(), "t");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn restart_as_standby(&mut self) -> io::Result<()> {
        self.stop()?;
        let signal = self.dir.path().join("data").join("standby.signal");
        std::fs::write(&signal, b"")?;
        if let Some((uid, gid)) = run_as()? {
            chown(&signal, uid, gid)?;
        }
        restart(|| self.spawn())
    }

    /// Starts a streaming standby of this server: `pg_basebackup -R` copies its data over a
    /// replication connection and the copy starts, on a free port of its own, following this
    /// server asynchronously (as a replica set up by hand does), hot (read-only queries
    /// answer). [`promote`](Self::promote) makes it a primary. With `through` (a port, e.g. a
    /// [`Relay`](crate::Relay)'s in front of this server), the standby copies and follows
    /// through it, so a test can cut replication off.
    ///
    /// # Errors
    ///
    /// When `pg_basebackup` fails or the standby does not start.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let primary = zklock_testkit::PostgresServer::start()?;
    /// let standby = primary.start_standby(None)?;
    /// assert_eq!(standby.psql("SELECT pg_is_in_recovery()")?.trim(), "t");
    /// standby.promote()?;
    /// assert_eq!(standby.psql("SELECT pg_is_in_recovery()")?.trim(), "f");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start_standby(&self, through: Option<u16>) -> io::Result<PostgresServer> {
        let dir = self.base_backup_dir("postgres-standby", through, true)?;
        Self::serve(
            dir,
            self.bin.clone(),
            self.durable,
            self.env.clone(),
            self.tls.clone(),
        )
    }

    /// Promotes a standby to a primary (`pg_promote()`, waiting until it is done): it stops
    /// following its primary and takes writes; what it had not received is lost.
    ///
    /// # Errors
    ///
    /// When the server is not a standby or does not finish promoting within a minute.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let primary = zklock_testkit::PostgresServer::start()?;
    /// let standby = primary.start_standby(None)?;
    /// standby.promote()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn promote(&self) -> io::Result<()> {
        let done = self.psql("SELECT pg_promote(true, 60)")?;
        if done.trim() == "t" {
            Ok(())
        } else {
            Err(io::Error::other(format!("pg_promote() answered {done:?}")))
        }
    }

    /// Takes a base backup of this server (`pg_basebackup`, with the WAL it needs): a copy of
    /// its data as of now, which [`restore`](Self::restore) puts back later, as an operator
    /// restoring last night's backup does.
    ///
    /// # Errors
    ///
    /// When `pg_basebackup` fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut pg = zklock_testkit::PostgresServer::start()?;
    /// let backup = pg.base_backup()?;
    /// pg.psql("CREATE TABLE later ()")?;
    /// pg.restore(&backup)?;
    /// assert!(pg.psql("SELECT 'later'::regclass").is_err()); // gone with the restore
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn base_backup(&self) -> io::Result<BaseBackup> {
        Ok(BaseBackup {
            dir: self.base_backup_dir("postgres-backup", None, false)?,
        })
    }

    /// Stops the server (as a crash), replaces its data with a copy of `backup`, and starts it
    /// again on the same port: every write since the backup is gone.
    ///
    /// # Errors
    ///
    /// When the data cannot be copied or the server does not start.
    ///
    /// # Examples
    ///
    /// See [`base_backup`](Self::base_backup).
    pub fn restore(&mut self, backup: &BaseBackup) -> io::Result<()> {
        self.stop()?;
        let data = self.dir.path().join("data");
        std::fs::remove_dir_all(&data)?;
        let copied = Command::new("cp")
            .arg("-a")
            .arg(backup.dir.path().join("data"))
            .arg(&data)
            .status()?;
        if !copied.success() {
            return Err(io::Error::other(format!(
                "cp -a of the backup failed: {copied}"
            )));
        }
        restart(|| self.spawn())
    }

    /// `pg_basebackup` of this server through `port` into a new directory's `data`, run as the
    /// server's user; with `follow`, the copy is set up to follow (`-R`).
    fn base_backup_dir(
        &self,
        name: &str,
        through: Option<u16>,
        follow: bool,
    ) -> io::Result<tempfile::TempDir> {
        let dir = workdir::create(name)?;
        let user = run_as()?;
        if let Some((uid, gid)) = user {
            chown(dir.path(), uid, gid)?;
        }
        let port = through.unwrap_or(self.port());
        let mut cmd = Command::new(self.bin.join("pg_basebackup"));
        match (&self.tls, through) {
            (None, _) => cmd
                .args(["-h", "127.0.0.1", "-U", "postgres", "-p"])
                .arg(port.to_string()),
            // TLS mode: the Unix socket, which needs no certificate...
            (Some(_), None) => cmd.arg("-d").arg(self.local_conninfo()),
            // ... or TLS through the given port, with the kit's certificate.
            (Some(_), Some(_)) => {
                let tls = self.dir.path().join(TLS_DIR);
                cmd.arg("-d").arg(format!(
                    "host=127.0.0.1 port={port} user=postgres sslmode=require \
                     sslcert={} sslkey={}",
                    tls.join("kit.pem").display(),
                    tls.join("kit.key").display()
                ))
            }
        };
        cmd.args(["-X", "stream", "--no-sync"])
            .arg("-D")
            .arg(dir.path().join("data"));
        if follow {
            cmd.arg("-R");
        }
        let out = run_command(&mut cmd, user).stdin(Stdio::null()).output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "pg_basebackup failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(dir)
    }

    /// Freezes the server and every backend with SIGSTOP: connections stay open but nothing
    /// answers, as in a long pause or a partition.
    ///
    /// # Errors
    ///
    /// When the server is stopped or `kill -STOP` fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let pg = zklock_testkit::PostgresServer::start()?;
    /// pg.pause()?;
    /// pg.resume()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn pause(&self) -> io::Result<()> {
        // The postmaster first (no new children), then every backend (each in a session of
        // its own, out of the postmaster's process group).
        let postmaster = self.daemon.running(self.port())?;
        postmaster.pause()?;
        for child in children(postmaster.id()) {
            signal(child, libc::SIGSTOP)?;
        }
        Ok(())
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
    /// let pg = zklock_testkit::PostgresServer::start()?;
    /// pg.pause()?;
    /// pg.resume()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn resume(&self) -> io::Result<()> {
        let postmaster = self.daemon.running(self.port())?;
        for child in children(postmaster.id()) {
            signal(child, libc::SIGCONT)?;
        }
        postmaster.resume()
    }

    /// Freezes the server's WAL writer (SIGSTOP) until the next [`stop`](Self::stop): from
    /// then on, commits made with `synchronous_commit = off` stay in the server's memory, and
    /// a following `stop` (a crash) loses them, as a failover to an asynchronous replica loses
    /// what the replica had not received. A commit that waits for its flush still writes the
    /// log itself (and everything before it). Returns the WAL writer's process id.
    ///
    /// # Errors
    ///
    /// When the server is stopped, `psql` cannot find the WAL writer, or `kill -STOP` fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut pg = zklock_testkit::PostgresServer::start()?;
    /// pg.psql("ALTER SYSTEM SET synchronous_commit = off")?;
    /// pg.psql("SELECT pg_reload_conf()")?;
    /// pg.freeze_wal_writer()?;
    /// pg.psql("CREATE TABLE lost (); INSERT INTO lost DEFAULT VALUES")?; // in memory only
    /// pg.restart()?; // a crash: the table is gone
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn freeze_wal_writer(&self) -> io::Result<u32> {
        self.daemon.running(self.port())?;
        let pid: u32 = self
            .psql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'")?
            .trim()
            .parse()
            .map_err(|e| io::Error::other(format!("no WAL writer found: {e}")))?;
        signal(pid, libc::SIGSTOP)?;
        Ok(pid)
    }

    /// Starts the postmaster (killing a running one first) and waits until it accepts
    /// connections.
    fn spawn(&mut self) -> io::Result<()> {
        let user = run_as()?;
        // The log file is opened here, as root: hand it to the server's user.
        let file = self.log.start_run()?;
        if let Some((uid, gid)) = user {
            chown(self.log.path(), uid, gid)?;
        }
        let mut cmd = run_command(
            Command::new(self.bin.join("postgres"))
                .arg("-D")
                .arg(self.dir.path().join("data"))
                .arg("-p")
                .arg(self.port().to_string())
                .args(["-c", "listen_addresses=127.0.0.1"])
                .arg("-c")
                .arg(format!(
                    "unix_socket_directories={}",
                    self.dir.path().display()
                ))
                .args(["-c", "max_connections=200", "-c", "shared_buffers=16MB"])
                .args(
                    self.tls
                        .as_ref()
                        .map(|_| tls_settings(self.dir.path()))
                        .unwrap_or_default(),
                )
                .args([
                    "-c",
                    if self.durable {
                        "fsync=on"
                    } else {
                        "fsync=off"
                    },
                ]),
            user,
        );
        cmd.envs(self.env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        self.daemon.spawn(
            &mut cmd,
            true,
            &self.bin.join("postgres"),
            "install Debian's postgresql package (scripts/setup does)",
        )?;
        let ready = Readiness {
            port: self.port(),
            log: &self.log,
            tail_lines: 20,
            ready_when: "accept connections",
            deadline: Instant::now() + STARTUP_TIMEOUT,
            poll: Duration::from_millis(50),
            // The backends must go too: see `stop`.
            kill_on_timeout: false,
        };
        let (bin, port) = (&self.bin, self.port());
        // In TLS mode the Unix socket, which takes the kit without a certificate.
        let host = match self.tls {
            Some(_) => self.dir.path().as_os_str().to_owned(),
            None => OsString::from("127.0.0.1"),
        };
        let ready = self.daemon.wait_ready(ready, |_| {
            let ready = Command::new(bin.join("pg_isready"))
                .args(["-q", "-U", "postgres", "-h"])
                .arg(&host)
                .arg("-p")
                .arg(port.to_string())
                .status()?;
            Ok(ready.success().then_some(()))
        });
        if ready
            .as_ref()
            .is_err_and(|e| e.kind() == io::ErrorKind::TimedOut)
        {
            let _ = self.stop();
        }
        ready
    }
}

/// A base backup of a [`PostgresServer`] ([`base_backup`](PostgresServer::base_backup)), for
/// [`restore`](PostgresServer::restore); its files are removed when it is dropped.
///
/// # Examples
///
/// ```no_run
/// let pg = zklock_testkit::PostgresServer::start()?;
/// let backup: zklock_testkit::BaseBackup = pg.base_backup()?;
/// # let _ = backup;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct BaseBackup {
    dir: tempfile::TempDir,
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// The folder of a server's directory that holds its TLS files.
const TLS_DIR: &str = "tls";

/// The `-c` settings that turn TLS on with the files in `dir`'s [`TLS_DIR`].
fn tls_settings(dir: &Path) -> Vec<String> {
    let tls = dir.join(TLS_DIR);
    [
        "ssl=on".to_string(),
        format!("ssl_cert_file={}", tls.join("server.pem").display()),
        format!("ssl_key_file={}", tls.join("server.key").display()),
        format!("ssl_ca_file={}", tls.join("ca.pem").display()),
    ]
    .into_iter()
    .flat_map(|setting| ["-c".to_string(), setting])
    .collect()
}

/// Copies the server's certificate and key, the CA and the kit's own client certificate and
/// key into `dir`'s [`TLS_DIR`], owned by the server's `user` (PostgreSQL reads keys only
/// when they are the server user's and private to it; libpq its client key likewise).
fn install_tls_files(dir: &Path, tls: &ServerTls, user: Option<(u32, u32)>) -> io::Result<()> {
    let to = dir.join(TLS_DIR);
    std::fs::create_dir_all(&to)?;
    let kit = tls.certs.kit_identity();
    let files: [(&Path, &str, u32); 5] = [
        (tls.cert_path(), "server.pem", 0o644),
        (tls.key_path(), "server.key", 0o600),
        (tls.certs.ca_path(), "ca.pem", 0o644),
        (&kit.cert_path, "kit.pem", 0o644),
        (&kit.key_path, "kit.key", 0o600),
    ];
    for (from, name, mode) in files {
        let path = to.join(name);
        std::fs::copy(from, &path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
        if let Some((uid, gid)) = user {
            chown(&path, uid, gid)?;
        }
    }
    if let Some((uid, gid)) = user {
        chown(&to, uid, gid)?;
    }
    Ok(())
}

/// Rewrites `data`'s `pg_hba.conf` (and `pg_ident.conf`) for TLS mode: the Unix socket as
/// before, TCP without TLS rejected, TCP with TLS trusted or, when client certificates are
/// required, authenticated by them (`cert`), their common name mapped to a role of that name,
/// and the client's and the kit's also to `postgres`.
fn write_tls_hba(data: &Path, tls: &ServerTls, user: Option<(u32, u32)>) -> io::Result<()> {
    let method = if tls.requires_client_cert() {
        "cert map=zklock"
    } else {
        "trust"
    };
    let hba = format!(
        "# Written by zklock-testkit: TLS only on TCP.\n\
         local all all trust\n\
         local replication all trust\n\
         hostnossl all all all reject\n\
         hostnossl replication all all reject\n\
         hostssl all all 127.0.0.1/32 {method}\n\
         hostssl replication all 127.0.0.1/32 {method}\n"
    );
    let ident = format!(
        "# Written by zklock-testkit: a certificate's common name is the role of that name; the\n\
         # client's and the kit's may be postgres too.\n\
         zklock {} postgres\n\
         zklock {} postgres\n\
         zklock /^(.*)$ \\1\n",
        tls.certs.client_name(),
        crate::certs::KIT_NAME,
    );
    for (name, text) in [("pg_hba.conf", hba), ("pg_ident.conf", ident)] {
        let path = data.join(name);
        std::fs::write(&path, text)?;
        if let Some((uid, gid)) = user {
            chown(&path, uid, gid)?;
        }
    }
    Ok(())
}

/// The processes whose parent is `pid`.
fn children(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    entries
        .flatten()
        .filter_map(|e| {
            let child: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // pid (comm) state ppid ...: comm may hold spaces and parentheses.
            let ppid: u32 = stat
                .rsplit(')')
                .next()?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == pid).then_some(child)
        })
        .collect()
}

/// Waits, at most `within`, until none of `pids` runs any more (gone, or a zombie: it has
/// exited and released its memory, and only waits to be reaped by its new parent).
fn wait_gone(pids: &[u32], within: Duration) {
    let until = std::time::Instant::now() + within;
    let running = |pid: &u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next());
            !matches!(state, Some("Z") | Some("X"))
        })
    };
    while pids.iter().any(running) && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn signal(pid: u32, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: kill(2) has no memory effects.
    if unsafe { libc::kill(pid as libc::pid_t, sig) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The directory of PostgreSQL's server binaries.
fn bin_dir() -> io::Result<PathBuf> {
    if let Some(path) = std::env::var_os("ZKLOCK_POSTGRES_BIN") {
        return Ok(PathBuf::from(path));
    }
    let newest = std::fs::read_dir("/usr/lib/postgresql")
        .ok()
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").exists().then_some((version, bin))
        })
        .max();
    newest.map(|(_, bin)| bin).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "no PostgreSQL server under /usr/lib/postgresql/<version>/bin; install Debian's \
             postgresql package (scripts/setup does) or set ZKLOCK_POSTGRES_BIN",
        )
    })
}

/// The user the server runs as when the tests run as root: `postgres` (Debian's package makes
/// it), else `nobody`. `None` when not root (the server runs as the caller).
fn run_as() -> io::Result<Option<(u32, u32)>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    for name in ["postgres", "nobody"] {
        let c = CString::new(name).expect("no NUL");
        // SAFETY: a valid C string; the result is read at once, before any other getpw call
        // of this thread.
        let pw = unsafe { libc::getpwnam(c.as_ptr()) };
        if !pw.is_null() {
            // SAFETY: non-null, as returned by getpwnam.
            let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
            return Ok(Some((uid, gid)));
        }
    }
    Err(io::Error::other(
        "running as root, and there is no postgres or nobody user to run PostgreSQL as",
    ))
}

/// `cmd`, run as `user` (uid, gid) through `setpriv` when given.
fn run_command(cmd: &mut Command, user: Option<(u32, u32)>) -> Command {
    let Some((uid, gid)) = user else {
        let mut c = Command::new(cmd.get_program());
        c.args(cmd.get_args());
        return c;
    };
    let mut c = Command::new("setpriv");
    c.arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .arg("--clear-groups")
        .arg("--")
        .arg(cmd.get_program())
        .args(cmd.get_args());
    // HOME of root is not the server's.
    c.env("HOME", "/tmp");
    c
}

fn chown(path: &Path, uid: u32, gid: u32) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::other("a NUL in a path"))?;
    // SAFETY: a valid C string.
    if unsafe { libc::chown(c.as_ptr(), uid, gid) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
