//! A throwaway certificate for a TLS-serving ZooKeeper, made with the JDK's `keytool`.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use tempfile::TempDir;

use crate::install::{ensure_netty_installed, java, tail};
use crate::workdir;

/// The keystore's password: the keystore is throwaway and lives in a private temp directory.
const PASSWORD: &str = "zklock-testkit";

/// A PKCS#12 keystore with a self-signed certificate for `127.0.0.1` and `localhost`, and that
/// certificate in PEM for clients to trust.
#[derive(Debug)]
pub(crate) struct TlsMaterial {
    _dir: TempDir,
    keystore: PathBuf,
    ca_pem: String,
}

impl TlsMaterial {
    pub(crate) fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The `zoo.cfg` lines that make a server serve TLS on `secure_port` with this certificate.
    pub(crate) fn config_lines(&self, secure_port: u16) -> Vec<(String, String)> {
        [
            ("secureClientPort", secure_port.to_string()),
            ("secureClientPortAddress", "127.0.0.1".to_string()),
            (
                "serverCnxnFactory",
                "org.apache.zookeeper.server.NettyServerCnxnFactory".to_string(),
            ),
            ("ssl.keyStore.location", self.keystore.display().to_string()),
            ("ssl.keyStore.password", PASSWORD.to_string()),
            ("ssl.keyStore.type", "PKCS12".to_string()),
            ("ssl.clientAuth", "none".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// The process's certificate, made on first use (two `keytool` runs, a few seconds).
pub(crate) fn material() -> io::Result<Arc<TlsMaterial>> {
    static MADE: Mutex<Option<Arc<TlsMaterial>>> = Mutex::new(None);
    let mut made = MADE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(m) = made.as_ref() {
        return Ok(m.clone());
    }
    ensure_netty_installed()?;
    let m = Arc::new(make()?);
    *made = Some(m.clone());
    Ok(m)
}

fn make() -> io::Result<TlsMaterial> {
    let dir = workdir::create("tls")?;
    let keystore = dir.path().join("server.p12");
    let pem = dir.path().join("server.pem");
    keytool(&[
        "-genkeypair",
        "-alias",
        "server",
        "-keyalg",
        "EC",
        "-groupname",
        "secp256r1",
        "-dname",
        "CN=localhost, O=zklock testkit",
        "-ext",
        "san=ip:127.0.0.1,dns:localhost",
        "-validity",
        "30",
        "-storetype",
        "PKCS12",
        "-keystore",
        &keystore.display().to_string(),
        "-storepass",
        PASSWORD,
        "-keypass",
        PASSWORD,
    ])?;
    keytool(&[
        "-exportcert",
        "-rfc",
        "-alias",
        "server",
        "-keystore",
        &keystore.display().to_string(),
        "-storepass",
        PASSWORD,
        "-file",
        &pem.display().to_string(),
    ])?;
    let ca_pem = fs::read_to_string(&pem)?;
    Ok(TlsMaterial {
        _dir: dir,
        keystore,
        ca_pem,
    })
}

/// `keytool` next to the JVM the servers use, else from `PATH`.
fn keytool_path() -> PathBuf {
    let java = java();
    let beside = java.with_file_name("keytool");
    if java.parent().is_some_and(|p| p != Path::new("")) && beside.exists() {
        beside
    } else {
        PathBuf::from("keytool")
    }
}

fn keytool(args: &[&str]) -> io::Result<()> {
    let tool = keytool_path();
    let out = Command::new(&tool)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "could not run {} ({e}); a JDK's keytool is needed for TLS servers",
                    tool.display()
                ),
            )
        })?;
    if out.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    Err(io::Error::other(format!(
        "keytool {} failed ({}):\n{}",
        args.first().copied().unwrap_or(""),
        out.status,
        tail(&text, 10)
    )))
}
