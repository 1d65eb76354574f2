//! Finding (and if need be installing) ZooKeeper and Java.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// The jar whose presence means Debian's `zookeeper` package is installed.
const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";

/// Installs Debian's `zookeeper` package if `/usr/share/java/zookeeper.jar` is missing.
///
/// Runs `apt-get update && apt-get install -y zookeeper` under `flock` on
/// `$TMPDIR/zklock-peers-apt.lock` — the lock `peers/run` takes too — so tests and peers running in
/// parallel, in any number of processes, install at most once and never fight over apt's own lock. Does
/// nothing when the jar is there, or when `ZKLOCK_ZK_CLASSPATH` names the jars to use instead.
///
/// [`ZkServer::start`](crate::ZkServer::start) and [`ZkCluster::start`](crate::ZkCluster::start) call it;
/// call it yourself only to fail early.
///
/// # Errors
///
/// An error saying what to install by hand when `apt-get` is missing or fails (e.g. without root, or
/// without network), with the tail of its output.
///
/// # Examples
///
/// ```no_run
/// zklock_testkit::ensure_zookeeper_installed().expect("ZooKeeper is needed for these tests");
/// ```
pub fn ensure_zookeeper_installed() -> io::Result<()> {
    static IN_PROCESS: Mutex<()> = Mutex::new(());
    if std::env::var_os("ZKLOCK_ZK_CLASSPATH").is_some() || Path::new(ZOOKEEPER_JAR).exists() {
        return Ok(());
    }
    let _serial = IN_PROCESS.lock().unwrap_or_else(|e| e.into_inner());
    if Path::new(ZOOKEEPER_JAR).exists() {
        return Ok(());
    }
    let script = format!(
        "test -e {ZOOKEEPER_JAR} || {{ apt-get update -qq && \
         DEBIAN_FRONTEND=noninteractive apt-get install -y -qq zookeeper; }}"
    );
    let lock = std::env::temp_dir().join("zklock-peers-apt.lock");
    let mut cmd = if which("flock").is_some() {
        let mut c = Command::new("flock");
        c.arg(&lock).arg("sh").arg("-c").arg(&script);
        c
    } else {
        let mut c = Command::new("sh");
        c.arg("-c").arg(&script);
        c
    };
    let hint = "install Debian's `zookeeper` package (apt-get install zookeeper), \
                or set ZKLOCK_ZK_CLASSPATH to ZooKeeper's jars";
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("could not run apt-get: {e}; {hint}")))?;
    if out.status.success() && Path::new(ZOOKEEPER_JAR).exists() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "ZooKeeper is not installed and installing it failed ({}); {hint}. apt output:\n{}",
            out.status,
            tail(&text, 20)
        ),
    ))
}

/// Netty jars that `zookeeper.jar`'s manifest does not name but its Netty connection factory (needed for
/// TLS) loads: Debian's `libnetty-java`, a dependency of the `zookeeper` package.
const NETTY_EXTRA_JARS: [&str; 3] = [
    "/usr/share/java/netty-codec.jar",
    "/usr/share/java/netty-resolver.jar",
    "/usr/share/java/netty-transport-native-unix-common.jar",
];

/// Makes sure Debian's `libnetty-java` is there (it comes with `zookeeper`; this installs it should it
/// have been removed), for servers that serve TLS through Netty.
pub(crate) fn ensure_netty_installed() -> io::Result<()> {
    ensure_zookeeper_installed()?;
    if std::env::var_os("ZKLOCK_ZK_CLASSPATH").is_some()
        || NETTY_EXTRA_JARS.iter().all(|j| Path::new(j).exists())
    {
        return Ok(());
    }
    let out = Command::new("sh")
        .arg("-c")
        .arg("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libnetty-java")
        .stdin(Stdio::null())
        .output()?;
    if out.status.success() && NETTY_EXTRA_JARS.iter().all(|j| Path::new(j).exists()) {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "Netty's jars are missing and installing libnetty-java failed ({}); install it by hand:\n{}",
            out.status,
            tail(&String::from_utf8_lossy(&out.stderr), 10)
        ),
    ))
}

/// The class path for the server: `ZKLOCK_ZK_CLASSPATH`, or Debian's jars plus an slf4j backend.
///
/// `zookeeper.jar`'s manifest names its own dependencies (jute, slf4j-api, jackson, jetty, netty, ...), so
/// only the logging backend needs adding; slf4j-simple writes to stderr, which goes to the server's log.
/// The few Netty jars the manifest misses (for TLS) are added when present.
pub(crate) fn classpath() -> String {
    if let Ok(cp) = std::env::var("ZKLOCK_ZK_CLASSPATH") {
        return cp;
    }
    let mut parts = vec![
        ZOOKEEPER_JAR,
        "/usr/share/java/zookeeper-jute.jar",
        "/usr/share/java/slf4j-api.jar",
    ];
    if let Some(backend) = [
        "/usr/share/java/slf4j-simple.jar",
        "/usr/share/java/slf4j-nop.jar",
    ]
    .into_iter()
    .find(|p| Path::new(p).exists())
    {
        parts.push(backend);
    }
    parts.extend(NETTY_EXTRA_JARS.iter().filter(|j| Path::new(j).exists()));
    parts.join(":")
}

/// `$JAVA_HOME/bin/java` when it exists, else `java` from `PATH`.
pub(crate) fn java() -> PathBuf {
    std::env::var_os("JAVA_HOME")
        .map(|home| PathBuf::from(home).join("bin/java"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("java"))
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| p.exists())
}

/// The last `n` lines of `text`.
pub(crate) fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
