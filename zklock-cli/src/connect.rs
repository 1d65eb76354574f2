//! Connecting to the lock service the global options name, and running a command against it.

use std::future::Future;
use std::time::Duration;

use zklock_core::{BackendKind, LockManager, Tls};

use crate::args::Cli;
use crate::exit::fail;

/// A manager for `--connect`, `--namespace` and the backend's own flags (`--session-timeout`
/// on ZooKeeper, `--lease` on Redis, PostgreSQL, etcd and MySQL, `--sentinel-password` under Redis
/// Sentinel). A flag of another backend than the one
/// `--connect` names is refused: it would have no effect.
pub(crate) async fn connect(cli: &Cli) -> zklock_core::Result<LockManager> {
    let kind = BackendKind::of(&cli.connect)?;
    refuse_foreign_flags(cli, kind)?;
    let tls = tls(cli)?;
    let builder = LockManager::builder(&cli.connect).namespace(&cli.namespace);
    with_backend_flags(builder, cli, kind, tls).connect().await
}

/// Refuses a flag of another backend than `kind`: it would have no effect.
fn refuse_foreign_flags(cli: &Cli, kind: BackendKind) -> zklock_core::Result<()> {
    let foreign = match kind {
        BackendKind::ZooKeeper => cli.lease.map(|_| ("--lease", "--session-timeout")),
        _ => cli
            .session_timeout
            .map(|_| ("--session-timeout", "--lease")),
    };
    if let Some((flag, instead)) = foreign {
        return Err(zklock_core::Error::Config(format!(
            "{flag} has no effect on {}; give {instead}",
            kind.name()
        )));
    }
    if cli.sentinel_password.is_some() && kind != BackendKind::Redis {
        return Err(zklock_core::Error::Config(format!(
            "--sentinel-password has no effect on {}: it is for redis+sentinel:// addresses",
            kind.name()
        )));
    }
    Ok(())
}

/// `builder` with the flags of backend `kind`: the session timeout or lease, TLS, the
/// Sentinels' password.
fn with_backend_flags(
    builder: zklock_core::Builder,
    cli: &Cli,
    kind: BackendKind,
    tls: Option<Tls>,
) -> zklock_core::Builder {
    match (kind, cli.session_timeout, cli.lease) {
        (BackendKind::ZooKeeper, timeout, _) => builder.zookeeper(move |zk| {
            let zk = match timeout {
                Some(t) => zk.session_timeout(t),
                None => zk,
            };
            match tls {
                Some(tls) => zk.tls_settings(tls),
                None => zk,
            }
        }),
        (BackendKind::Redis, _, lease) => {
            let password = cli.sentinel_password.clone();
            builder.redis(move |r| {
                let r = match lease {
                    Some(lease) => r.lease(lease),
                    None => r,
                };
                let r = match tls {
                    Some(tls) => r.tls(tls),
                    None => r,
                };
                match password {
                    Some(p) => r.sentinel_password(p),
                    None => r,
                }
            })
        }
        (BackendKind::Postgres, _, lease) => builder.postgres(move |pg| {
            let pg = match lease {
                Some(lease) => pg.lease(lease),
                None => pg,
            };
            match tls {
                Some(tls) => pg.tls(tls),
                None => pg,
            }
        }),
        (BackendKind::Etcd, _, lease) => builder.etcd(move |e| {
            let e = match lease {
                Some(lease) => e.lease(lease),
                None => e,
            };
            match tls {
                Some(tls) => e.tls(tls),
                None => e,
            }
        }),
        (BackendKind::MySql, _, lease) => builder.mysql(move |my| {
            let my = match lease {
                Some(lease) => my.lease(lease),
                None => my,
            };
            match tls {
                Some(tls) => my.tls(tls),
                None => my,
            }
        }),
        _ => builder,
    }
}

/// The TLS settings of `--tls-ca`, `--tls-cert` and `--tls-key`, if any is given.
fn tls(cli: &Cli) -> zklock_core::Result<Option<Tls>> {
    if cli.tls_ca.is_none() && cli.tls_cert.is_none() && cli.tls_key.is_none() {
        return Ok(None);
    }
    let mut tls = Tls::new();
    if let Some(ca) = &cli.tls_ca {
        tls = tls.ca_file(ca);
    }
    match (&cli.tls_cert, &cli.tls_key) {
        (Some(cert), Some(key)) => tls = tls.client_cert_files(cert, key),
        (None, None) => {}
        _ => {
            return Err(zklock_core::Error::Config(
                "--tls-cert and --tls-key go together: give the client certificate and its key"
                    .to_string(),
            ))
        }
    }
    Ok(Some(tls))
}

/// Lets background releases and cleanups reach the server before the process exits (at most
/// 5 s: the server ends what is left with the session).
pub(crate) async fn flush(manager: &LockManager) {
    let _ = tokio::time::timeout(Duration::from_secs(5), manager.flush()).await;
}

/// Connects, runs an operator command (`ls`, `top`, `status`, `revoke`), and maps its error to
/// an exit code.
pub(crate) async fn operate<F, Fut>(cli: &Cli, op: F) -> u8
where
    F: FnOnce(LockManager) -> Fut,
    Fut: Future<Output = zklock_core::Result<u8>>,
{
    let manager = match connect(cli).await {
        Ok(m) => m,
        Err(e) => return fail(&e),
    };
    match op(manager).await {
        Ok(code) => code,
        Err(e) => fail(&e),
    }
}
