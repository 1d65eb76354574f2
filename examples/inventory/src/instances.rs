//! Instances of the service as separate processes: this executable's `serve` subcommand.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The line a `serve` process prints on stdout once it accepts connections.
pub const LISTENING: &str = "listening on ";

/// How long an instance gets to start (connect to the lock service and Redis, bind).
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// How to start instances.
#[derive(Debug, Clone)]
pub struct InstanceConfig {
    /// The executable (one with the `serve` subcommand).
    pub exe: PathBuf,
    /// Redis URL.
    pub redis: String,
    /// The lock service's connect string (ZooKeeper's `host:port,...` or `redis://...`);
    /// `None` runs the instances without locks.
    pub lock: Option<String>,
    /// Session timeout asked of ZooKeeper, lease asked of Redis and PostgreSQL.
    pub session_timeout: Duration,
    /// Simulated work between read and write.
    pub work: Duration,
    /// Honour debug holds (the pause scenario).
    pub debug_hold: bool,
    /// Where each instance's stderr goes (`instance-N.log`).
    pub log_dir: PathBuf,
}

/// One running `serve` process; killed on drop.
#[derive(Debug)]
pub struct Instance {
    /// Its number (1-based).
    pub number: u32,
    /// Its HTTP address.
    pub addr: SocketAddr,
    /// Its stderr log.
    pub log: PathBuf,
    child: Child,
}

impl Instance {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }

    /// Asks the process to stop (SIGTERM), waits up to 5 s, then kills it.
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            signal(pid, libc::SIGCONT);
            signal(pid, libc::SIGTERM);
        }
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// Sends `sig` to `pid`.
pub fn signal(pid: u32, sig: libc::c_int) -> bool {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(pid as libc::pid_t, sig) == 0 }
}

/// Starts `count` instances in parallel and waits until all of them listen.
///
/// # Errors
/// When one cannot be started or does not come up in time (with the end of its log).
pub async fn start_all(config: &InstanceConfig, count: u32) -> io::Result<Vec<Instance>> {
    let handles: Vec<_> = (1..=count)
        .map(|n| tokio::spawn(start(config, n)))
        .collect();
    let mut instances = Vec::new();
    let mut first_err = None;
    for handle in handles {
        match handle.await {
            Ok(Ok(i)) => instances.push(i),
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(e) => {
                first_err.get_or_insert(io::Error::other(format!("instance start: {e}")));
            }
        }
    }
    match first_err {
        None => Ok(instances),
        Some(e) => {
            for i in instances {
                i.stop().await;
            }
            Err(e)
        }
    }
}

/// Starts instance `number` and waits until it listens.
///
/// # Errors
/// As [`start_all`].
pub fn start(
    config: &InstanceConfig,
    number: u32,
) -> impl std::future::Future<Output = io::Result<Instance>> + Send + 'static {
    let config = config.clone();
    async move {
        let log = config.log_dir.join(format!("instance-{number}.log"));
        let stderr = std::fs::File::create(&log)?;
        let mut cmd = Command::new(&config.exe);
        cmd.arg("serve")
            .arg("--instance")
            .arg(number.to_string())
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--redis")
            .arg(&config.redis)
            .arg("--session-timeout")
            .arg(humantime::format_duration(config.session_timeout).to_string())
            .arg("--work")
            .arg(humantime::format_duration(config.work).to_string());
        match &config.lock {
            Some(lock) => cmd.arg("--lock").arg(lock),
            None => cmd.arg("--no-lock"),
        };
        if config.debug_hold {
            cmd.arg("--debug-hold");
        }
        cmd.env_remove("ZKLOCK_CONNECT")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .kill_on_drop(true);
        let mut child = cmd.spawn()?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut lines = BufReader::new(stdout).lines();
        let addr = tokio::time::timeout(STARTUP_TIMEOUT, async {
            while let Some(line) = lines.next_line().await? {
                if let Some(addr) = line.split(LISTENING).nth(1) {
                    return addr
                        .trim()
                        .parse::<SocketAddr>()
                        .map_err(|e| io::Error::other(format!("bad address {addr:?}: {e}")));
                }
            }
            Err(io::Error::other("exited before listening"))
        })
        .await
        .unwrap_or_else(|_| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("not listening after {STARTUP_TIMEOUT:?}"),
            ))
        });
        let addr = match addr {
            Ok(addr) => addr,
            Err(e) => {
                let _ = child.kill().await;
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "instance {number}: {e}; its log {}:\n{}",
                        log.display(),
                        tail(&log)
                    ),
                ));
            }
        };
        // Keep reading stdout so that the instance never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Instance {
            number,
            addr,
            log,
            child,
        })
    }
}

/// The last lines of a log file.
pub fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
