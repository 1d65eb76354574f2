//! Holder frames: reentrancy scoped to the code that holds a lock, not to threads or tasks.
//!
//! `with_lock`, `#[distributed_lock]` and `LockGuard::scope` run their body in a frame (a tokio
//! task-local). Acquiring a key that an enclosing frame holds re-enters: no request to the server,
//! the hold kept until the outermost hold ends. Concurrent branches inside one frame that
//! re-enter the same key wait for each other at the frame's gate, so re-entry never lets two
//! concurrent code paths into one critical section. Spawned tasks start with no frame.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

use super::Grant;
use crate::types::error::{Deadlock, Error, Result};
use crate::types::mode::HoldMode;
use crate::types::token::FencingToken;

tokio::task_local! {
    static FRAME: Arc<Frame>;
}

struct Frame {
    parent: Option<Arc<Frame>>,
    grant: Arc<Grant>,
    /// Serializes the re-entries made directly inside this frame.
    gate: Arc<AsyncMutex<()>>,
}

/// Runs `body` in a new frame holding `grant`.
pub(crate) async fn run_in<F: Future>(grant: Arc<Grant>, body: F) -> F::Output {
    let parent = FRAME.try_with(Arc::clone).ok();
    let frame = Arc::new(Frame {
        parent,
        grant,
        gate: Arc::new(AsyncMutex::new(())),
    });
    FRAME.scope(frame, body).await
}

/// The hold of the innermost enclosing frame on `path`, if any, and its gate.
fn find(table: u64, path: &str) -> Option<(Arc<Grant>, Arc<AsyncMutex<()>>)> {
    FRAME
        .try_with(|frame| {
            let mut cursor = Some(frame);
            while let Some(f) = cursor {
                // The same lock of the same manager: another manager's hold on an equal path
                // (another backend, another cluster) is another lock.
                if f.grant.table == table && &*f.grant.path == path {
                    return Some((f.grant.clone(), f.gate.clone()));
                }
                cursor = f.parent.as_ref();
            }
            None
        })
        .ok()
        .flatten()
}

/// The outcome of looking for an enclosing frame's hold.
pub(crate) enum Reentry {
    /// No enclosing frame holds the path: acquire it for real.
    NotHeld,
    /// Re-entered: the shared grant, and this frame's gate, held until the re-entry ends.
    Entered(Arc<Grant>, OwnedMutexGuard<()>),
    /// Held by an enclosing frame, but a concurrent branch is inside (only for `try_only`).
    Busy,
}

/// Re-enters the hold an enclosing frame has on `path`, waiting at that frame's gate for
/// concurrent branches.
///
/// # Errors
/// [`Error::WouldDeadlock`] when a read hold asks for the write lock of its own key;
/// [`Error::LockLost`] when the enclosing hold was lost.
pub(crate) async fn reenter(
    table: u64,
    path: &str,
    want: HoldMode,
    key: &str,
    try_only: bool,
) -> Result<Reentry> {
    let Some((grant, gate)) = find(table, path) else {
        return Ok(Reentry::NotHeld);
    };
    if let Some(reason) = grant.loss_reason() {
        // The enclosing hold is gone: re-entering it would protect nothing, and a fresh
        // acquire could wait for the enclosing hold itself.
        return Err(Error::LockLost {
            key: key.to_string(),
            reason,
        });
    }
    if grant.mode == HoldMode::Read && want == HoldMode::Write {
        return Err(Error::WouldDeadlock {
            key: key.to_string(),
            cause: Deadlock::WriteInsideRead,
        });
    }
    if try_only {
        return Ok(match gate.try_lock_owned() {
            Ok(entered) => Reentry::Entered(grant, entered),
            Err(_) => Reentry::Busy,
        });
    }
    let entered = gate.lock_owned().await;
    Ok(Reentry::Entered(grant, entered))
}

/// The fencing token of the innermost lock held by the current frame, if any: what a body run
/// by `with_lock` or `#[distributed_lock]` sends with its writes. `fence::current(&store)`
/// gives a writer that carries it (see [`fence`](crate::fence)). The lock's token is
/// [`FencingToken::NONE`] when its manager issues none
/// ([`fencing_tokens(false)`](crate::Builder::fencing_tokens)).
///
/// # Examples
///
/// ```no_run
/// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
/// m.with_lock("sku_7", async {
///     let token = zklock_core::current_fencing_token().expect("inside with_lock");
///     // store.write_if_newer(token, ...)
/// }).await?;
/// assert!(zklock_core::current_fencing_token().is_none());
/// # Ok(()) }
/// ```
pub fn current_fencing_token() -> Option<FencingToken> {
    FRAME.try_with(|f| f.grant.token).ok()
}

/// The token and lock path of the innermost lock held by the current frame, if any (what
/// `fence::current` fences with).
pub(crate) fn current_hold() -> Option<(FencingToken, Arc<str>)> {
    FRAME
        .try_with(|f| (f.grant.token, f.grant.path.clone()))
        .ok()
}
