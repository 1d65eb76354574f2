//! Connecting to the lock service the global options name, and running a command against it.

use std::future::Future;
use std::time::Duration;

use zklock_core::LockManager;

use crate::args::Cli;
use crate::exit::fail;

/// A manager for `--connect`, `--namespace` and `--session-timeout` (the lease on Redis and
/// PostgreSQL).
pub(crate) async fn connect(cli: &Cli) -> zklock_core::Result<LockManager> {
    LockManager::builder(&cli.connect)
        .namespace(&cli.namespace)
        .session_timeout(cli.session_timeout)
        .lease(cli.session_timeout)
        .connect()
        .await
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
