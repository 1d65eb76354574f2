//! The process-wide default manager.

use super::builder::Builder;
use super::LockManager;
use crate::types::error::{Error, Result};

static GLOBAL: once_cell::sync::OnceCell<LockManager> = once_cell::sync::OnceCell::new();
static GLOBAL_INIT: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Sets the process-wide default manager (used by `#[distributed_lock]` and [`global`]).
///
/// # Errors
/// [`Error::Config`] when a global manager is already set.
///
/// ```no_run
/// # async fn run() -> zklock_core::Result<()> {
/// let manager = zklock_core::LockManager::connect("127.0.0.1:2181").await?;
/// zklock_core::set_global(manager)?;
/// # Ok(()) }
/// ```
pub fn set_global(manager: LockManager) -> Result<()> {
    GLOBAL
        .set(manager)
        .map_err(|_| Error::Config("the global LockManager is already set".into()))
}

/// The process-wide default manager: the one given to [`set_global`], or else one connected on
/// first use to `ZKLOCK_CONNECT` (ZooKeeper's `host:port,...`, `redis://host:port` with the
/// `redis` feature, or `postgres://user@host/db` with the `postgres` feature; namespace from `ZKLOCK_NAMESPACE` if set).
///
/// # Errors
/// [`Error::NoGlobalManager`] when neither is available; connection errors as
/// [`LockManager::connect`](crate::LockManager::connect).
///
/// ```no_run
/// # async fn run() -> zklock_core::Result<()> {
/// std::env::set_var("ZKLOCK_CONNECT", "127.0.0.1:2181");
/// let guard = zklock_core::global().await?.lock("k").await?;
/// # drop(guard); Ok(()) }
/// ```
pub async fn global() -> Result<LockManager> {
    if let Some(m) = GLOBAL.get() {
        return Ok(m.clone());
    }
    let _init = GLOBAL_INIT.lock().await;
    if let Some(m) = GLOBAL.get() {
        return Ok(m.clone());
    }
    let connect = std::env::var("ZKLOCK_CONNECT").map_err(|_| Error::NoGlobalManager)?;
    let mut builder = Builder::new(connect);
    if let Ok(ns) = std::env::var("ZKLOCK_NAMESPACE") {
        builder = builder.namespace(ns);
    }
    let manager = builder.connect().await?;
    let _ = GLOBAL.set(manager.clone());
    Ok(GLOBAL.get().cloned().unwrap_or(manager))
}
