//! One ZooKeeper JVM: its configuration, directories, log, process and readiness checks. Shared by
//! [`ZkServer`](crate::ZkServer) (a standalone member) and [`ZkCluster`](crate::ZkCluster).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::daemon::{restart, Daemon, Log, Readiness};
use crate::four_letter::{four_letter, mode_of};
use crate::install::{classpath, java};

/// How often readiness is polled.
const POLL: Duration = Duration::from_millis(50);
/// Timeout of one four-letter probe while waiting for readiness.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How often the kit's servers look for empty CONTAINER nodes to delete, in milliseconds.
///
/// ZooKeeper's `ContainerManager` reads the JVM system property `znode.container.checkIntervalMs`
/// (default one minute; it is not a `zoo.cfg` key). zklock's lock paths are containers: once the last
/// contender leaves, the server deletes the path, and the next contender re-creates it with sequence
/// numbers starting again at 0. In production that happens about a minute after a path empties; tests
/// need it within a fraction of a second to exercise it (a lock path reaped and re-created under a
/// holder whose session expired), so every server and ensemble member the kit starts checks every
/// 100 ms unless told otherwise. `znode.container.maxPerMinute` keeps ZooKeeper's default (10 000
/// deletions a minute, one every 6 ms), which is no limit at the rates tests create paths.
pub(crate) const DEFAULT_CONTAINER_CHECK_INTERVAL_MS: u32 = 100;

/// Settings shared by standalone servers and ensembles.
#[derive(Clone, Debug)]
pub(crate) struct Options {
    pub(crate) tick_time_ms: u32,
    pub(crate) min_session_timeout_ms: Option<u32>,
    pub(crate) max_session_timeout_ms: u32,
    pub(crate) startup_timeout: Duration,
    pub(crate) heap_mb: u32,
    /// `-Dznode.container.checkIntervalMs`: see [`DEFAULT_CONTAINER_CHECK_INTERVAL_MS`].
    pub(crate) container_check_interval_ms: u32,
    pub(crate) extra: Vec<(String, String)>,
    /// Variables the JVMs run with (a [`ServerClock`](crate::ServerClock)'s).
    pub(crate) env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            tick_time_ms: 200,
            min_session_timeout_ms: None,
            max_session_timeout_ms: 60_000,
            startup_timeout: Duration::from_secs(60),
            heap_mb: 128,
            container_check_interval_ms: DEFAULT_CONTAINER_CHECK_INTERVAL_MS,
            extra: Vec::new(),
            env: Vec::new(),
        }
    }
}

/// The setters of the options every ZooKeeper server the kit starts takes, for the builders of
/// one server and of an ensemble: `$builder` is the expression that makes the builder, for the
/// examples.
macro_rules! server_options {
    ($builder:literal) => {
        /// ZooKeeper's `tickTime` in milliseconds (default 200). The shortest session timeout the server
        /// grants is two ticks, and leader/follower timeouts are counted in ticks.
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = concat!("let zk = ", $builder, ".tick_time(100).start()?;")]
        /// # drop(zk);
        /// # Ok::<(), std::io::Error>(())
        /// ```
        pub fn tick_time(mut self, ms: u32) -> Self {
            self.opts.tick_time_ms = ms;
            self
        }

        /// `minSessionTimeout` in milliseconds (default: two ticks).
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = concat!("let zk = ", $builder, ".min_session_timeout(1_000).start()?;")]
        /// # drop(zk);
        /// # Ok::<(), std::io::Error>(())
        /// ```
        pub fn min_session_timeout(mut self, ms: u32) -> Self {
            self.opts.min_session_timeout_ms = Some(ms);
            self
        }

        /// `maxSessionTimeout` in milliseconds (default 60 000); longer requested timeouts are cut to it.
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = concat!("let zk = ", $builder, ".max_session_timeout(10_000).start()?;")]
        /// # drop(zk);
        /// # Ok::<(), std::io::Error>(())
        /// ```
        pub fn max_session_timeout(mut self, ms: u32) -> Self {
            self.opts.max_session_timeout_ms = ms;
            self
        }

        /// Adds a `key=value` line to the `zoo.cfg` of every server it starts, replacing the kit's default for that key.
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = concat!("let zk = ", $builder, ".config(\"syncLimit\", \"20\").start()?;")]
        /// # drop(zk);
        /// # Ok::<(), std::io::Error>(())
        /// ```
        pub fn config(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
            self.opts.extra.push((key.into(), value.into()));
            self
        }

        /// Adds several `zoo.cfg` lines, as [`config`](Self::config) does for one.
        ///
        /// # Examples
        ///
        /// ```no_run
        /// let lines = vec![("initLimit".to_string(), "50".to_string())];
        #[doc = concat!("let zk = ", $builder, ".extra_config(lines).start()?;")]
        /// # drop(zk);
        /// # Ok::<(), std::io::Error>(())
        /// ```
        pub fn extra_config(mut self, lines: impl IntoIterator<Item = (String, String)>) -> Self {
            self.opts.extra.extend(lines);
            self
        }

        /// How long to wait for the servers it starts (or restarts) to serve (default 60 s).
        ///
        /// # Examples
        ///
        /// ```no_run
        /// use std::time::Duration;
        ///
        #[doc = concat!("let zk = ", $builder, "")]
        ///     .startup_timeout(Duration::from_secs(120))
        ///     .start()?;
        /// # drop(zk);
        /// # Ok::<(), std::io::Error>(())
        /// ```
        pub fn startup_timeout(mut self, timeout: Duration) -> Self {
            self.opts.startup_timeout = timeout;
            self
        }

        /// The maximum heap of each server's JVM in MiB (default 128).
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = concat!("let zk = ", $builder, ".heap_mb(96).start()?;")]
        /// # drop(zk);
        /// # Ok::<(), std::io::Error>(())
        /// ```
        pub fn heap_mb(mut self, mb: u32) -> Self {
            self.opts.heap_mb = mb;
            self
        }

        /// How often the server deletes empty CONTAINER nodes, in milliseconds (default 100; ZooKeeper's
        /// own default is 60 000). Passed as the JVM property `znode.container.checkIntervalMs`, which
        /// ZooKeeper does not read from `zoo.cfg`.
        ///
        /// zklock's lock paths are containers: the server deletes a path once its last contender is gone,
        /// and the next contender re-creates it with sequence numbers starting again at 0. The kit's short
        /// default makes that happen in tests within a fraction of a second, as it happens in production
        /// after about a minute, so that tests can exercise a lock path that is reaped and re-created.
        ///
        /// # Examples
        ///
        /// ```no_run
        /// // Production's pace: empty lock paths stay for up to a minute.
        #[doc = concat!("let zk = ", $builder, ".container_check_interval(60_000).start()?;")]
        /// # drop(zk);
        /// # Ok::<(), std::io::Error>(())
        /// ```
        pub fn container_check_interval(mut self, ms: u32) -> Self {
            self.opts.container_check_interval_ms = ms;
            self
        }

        /// Runs the servers on a wall clock that the test moves with `clock` (their restarts
        /// too): nodes' `ctime` and `mtime` follow it; sessions, timed by the servers' elapsed
        /// time, do not.
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # use std::time::Duration;
        /// let clock = zklock_testkit::ServerClock::new()?;
        #[doc = concat!("let zk = ", $builder, ".clock(&clock).start()?;")]
        /// clock.step_forward(Duration::from_secs(3600));
        /// # drop(zk);
        /// # Ok::<(), std::io::Error>(())
        /// ```
        pub fn clock(mut self, clock: &crate::ServerClock) -> Self {
            self.opts.env = clock.env();
            self
        }
    };
}
pub(crate) use server_options;

/// Peer and election ports of one ensemble member.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QuorumPorts {
    pub(crate) peer: u16,
    pub(crate) election: u16,
}

/// Which `Mode:` counts as serving.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    Standalone,
    Ensemble,
}

impl Role {
    fn accepts(self, mode: &str) -> bool {
        match self {
            Role::Standalone => mode == "standalone",
            Role::Ensemble => matches!(mode, "leader" | "follower" | "observer"),
        }
    }
}

/// The text of `zoo.cfg`. Extra lines replace defaults with the same key.
pub(crate) fn render_config(
    opts: &Options,
    data_dir: &Path,
    client_port: u16,
    ensemble: &[QuorumPorts],
) -> String {
    let mut kv: Vec<(String, String)> = Vec::new();
    let mut set = |k: &str, v: String| match kv.iter_mut().find(|(key, _)| key == k) {
        Some(entry) => entry.1 = v,
        None => kv.push((k.to_string(), v)),
    };
    set("tickTime", opts.tick_time_ms.to_string());
    set("initLimit", "20".into());
    set("syncLimit", "10".into());
    set("dataDir", data_dir.display().to_string());
    set("clientPort", client_port.to_string());
    set("clientPortAddress", "127.0.0.1".into());
    if let Some(min) = opts.min_session_timeout_ms {
        set("minSessionTimeout", min.to_string());
    }
    set("maxSessionTimeout", opts.max_session_timeout_ms.to_string());
    set("4lw.commands.whitelist", "*".into());
    set("admin.enableServer", "false".into());
    set("maxClientCnxns", "0".into());
    set("preAllocSize", "1024".into());
    set("snapCount", "10000".into());
    set("forceSync", "no".into());
    set("standaloneEnabled", ensemble.is_empty().to_string());
    for (k, v) in &opts.extra {
        set(k, v.clone());
    }
    let mut text = String::new();
    for (k, v) in &kv {
        text.push_str(&format!("{k}={v}\n"));
    }
    for (i, q) in ensemble.iter().enumerate() {
        text.push_str(&format!(
            "server.{}=127.0.0.1:{}:{}\n",
            i + 1,
            q.peer,
            q.election
        ));
    }
    text
}

/// One server process and its files, under `root`: `zoo.cfg`, `data/` (with `myid`), `server.log`.
#[derive(Debug)]
pub(crate) struct Member {
    root: PathBuf,
    data_dir: PathBuf,
    cfg: PathBuf,
    log: Log,
    client_port: u16,
    role: Role,
    heap_mb: u32,
    container_check_interval_ms: u32,
    startup_timeout: Duration,
    env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    daemon: Daemon,
}

impl Member {
    /// Lays out the member's files; `myid` is written for ensemble members.
    pub(crate) fn create(
        root: PathBuf,
        opts: &Options,
        client_port: u16,
        ensemble: &[QuorumPorts],
        myid: usize,
    ) -> io::Result<Member> {
        let data_dir = root.join("data");
        fs::create_dir_all(&data_dir)?;
        let cfg = root.join("zoo.cfg");
        let log = Log::new(root.join("server.log"));
        let role = if ensemble.is_empty() {
            Role::Standalone
        } else {
            fs::write(data_dir.join("myid"), format!("{myid}\n"))?;
            Role::Ensemble
        };
        let member = Member {
            root,
            data_dir,
            cfg,
            log,
            client_port,
            role,
            heap_mb: opts.heap_mb,
            env: opts.env.clone(),
            container_check_interval_ms: opts.container_check_interval_ms,
            startup_timeout: opts.startup_timeout,
            daemon: Daemon::new("ZooKeeper", io::ErrorKind::NotConnected),
        };
        member.write_config(opts, client_port, ensemble)?;
        Ok(member)
    }

    fn write_config(
        &self,
        opts: &Options,
        client_port: u16,
        ensemble: &[QuorumPorts],
    ) -> io::Result<()> {
        fs::write(
            &self.cfg,
            render_config(opts, &self.data_dir, client_port, ensemble),
        )
    }

    pub(crate) fn client_port(&self) -> u16 {
        self.client_port
    }

    pub(crate) fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.daemon.pid()
    }

    pub(crate) fn is_running(&self) -> bool {
        self.daemon.is_running()
    }

    pub(crate) fn is_paused(&self) -> bool {
        self.daemon.is_paused()
    }

    /// Starts the JVM (no waiting). Stops a running one first.
    pub(crate) fn spawn(&mut self) -> io::Result<()> {
        self.stop()?;
        let log = self.log.start_run()?;
        let mut cmd = Command::new(java());
        cmd.arg(format!("-Xmx{}m", self.heap_mb))
            .args([
                "-Xms16m",
                "-Xss256k",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-XX:-UsePerfData",
                "-XX:+ExitOnOutOfMemoryError",
                "-Djava.net.preferIPv4Stack=true",
                "-Djava.awt.headless=true",
                "-Dzookeeper.admin.enableServer=false",
                "-Dzookeeper.jmx.log4j.disable=true",
                // Election over loopback: don't let a dead or paused peer stall it for long.
                "-Dzookeeper.cnxTimeout=2000",
                "-Dzookeeper.fastleader.maxNotificationInterval=2000",
                "-Dorg.slf4j.simpleLogger.showDateTime=true",
                "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
            ])
            // Empty lock paths (CONTAINER nodes) are reaped within this interval, not a minute.
            .arg(format!(
                "-Dznode.container.checkIntervalMs={}",
                self.container_check_interval_ms
            ))
            .arg("-cp")
            .arg(classpath())
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(&self.cfg)
            .current_dir(&self.root)
            .envs(self.env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        self.daemon.spawn(
            &mut cmd,
            false,
            &java(),
            "is a JRE installed? (JAVA_HOME picks one)",
        )
    }

    /// SIGKILLs the JVM (even when paused) and reaps it. Does nothing when not running.
    pub(crate) fn stop(&mut self) -> io::Result<()> {
        self.daemon.kill()
    }

    pub(crate) fn pause(&self) -> io::Result<()> {
        self.daemon.pause(self.client_port)
    }

    pub(crate) fn resume(&self) -> io::Result<()> {
        self.daemon.resume(self.client_port)
    }

    pub(crate) fn four_letter(&self, cmd: &str, timeout: Duration) -> io::Result<String> {
        four_letter(self.client_port, cmd, timeout)
    }

    /// The `Mode:` the member reports now, if it is running, not paused, and serving.
    pub(crate) fn mode(&self) -> Option<String> {
        if !self.is_running() || self.is_paused() {
            return None;
        }
        let srvr = self.four_letter("srvr", PROBE_TIMEOUT).ok()?;
        mode_of(&srvr).map(str::to_string)
    }

    /// Waits until `ruok` says `imok` and `srvr` reports a serving mode; returns the mode.
    ///
    /// Fails early when the JVM exits — with [`io::ErrorKind::AddrInUse`] if it could not bind a port —
    /// and with [`io::ErrorKind::TimedOut`] after the startup timeout; both with the log's tail.
    pub(crate) fn wait_serving(&mut self, deadline: Option<Instant>) -> io::Result<String> {
        let ready = Readiness {
            port: self.client_port,
            log: &self.log,
            tail_lines: 30,
            ready_when: "serve",
            deadline: deadline.unwrap_or_else(|| Instant::now() + self.startup_timeout),
            poll: POLL,
            kill_on_timeout: false,
        };
        let (port, role) = (self.client_port, self.role);
        self.daemon.wait_ready(ready, |process| {
            if process.is_paused() {
                return Ok(None);
            }
            let ok = four_letter(port, "ruok", PROBE_TIMEOUT).is_ok_and(|a| a.trim() == "imok");
            let srvr = if ok {
                four_letter(port, "srvr", PROBE_TIMEOUT).ok()
            } else {
                None
            };
            Ok(srvr
                .as_deref()
                .and_then(mode_of)
                .filter(|m| role.accepts(m))
                .map(str::to_string))
        })
    }

    /// Starts the JVM again and waits until it serves, retrying while its port is still taken.
    pub(crate) fn restart(&mut self) -> io::Result<()> {
        restart(|| {
            self.spawn()?;
            self.wait_serving(None)
        })
        .map(drop)
    }

    /// The log written by the current (or last) run.
    pub(crate) fn log_since_start(&self) -> String {
        self.log.since_start()
    }

    /// The path of the member's log file.
    pub(crate) fn log_path(&self) -> &Path {
        self.log.path()
    }
}
