//! The writer that carries a hold's token and resource, so the right token cannot be
//! forgotten or swapped for another lock's.

use std::sync::Arc;

use super::error::FenceError;
use super::{Fence, Outcome};
use crate::local::frame;
use crate::types::token::FencingToken;

/// Fenced writes to one store with one hold's token, on the hold's resource.
///
/// Made by [`LockGuard::fenced`](crate::LockGuard::fenced) or [`current`]: the resource name is
/// then the lock's path (`LockManager::path_of(key)`) and the token the hold's, so a write can
/// carry neither a token of another lock nor none at all. [`Fenced::new`] makes one by hand.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use zklock_core::fence::MemoryFence;
///
/// let manager = zklock_core::LockManager::in_memory();
/// let balances = MemoryFence::new();
/// let guard = manager.lock("account_9").await?;
/// let writer = guard.fenced(&balances);
/// assert_eq!(writer.token(), guard.fencing_token());
/// assert_eq!(writer.resource(), manager.path_of("account_9")?);
/// assert!(writer.write(120).await?.is_accepted());
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Fenced<'f, F> {
    fence: &'f F,
    resource: Arc<str>,
    token: FencingToken,
}

impl<F> Clone for Fenced<'_, F> {
    fn clone(&self) -> Self {
        Fenced {
            fence: self.fence,
            resource: self.resource.clone(),
            token: self.token,
        }
    }
}

impl<'f, F: Fence> Fenced<'f, F> {
    /// A writer for `resource` with `token`, for tokens that came some other way (a message
    /// from the holder, a column). Keep one resource name per lock (see the
    /// [module docs](super#one-resource-one-lock)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), zklock_core::fence::FenceError> {
    /// use zklock_core::fence::{Fenced, MemoryFence};
    /// use zklock_core::FencingToken;
    ///
    /// let store = MemoryFence::new();
    /// let from_job_message = FencingToken::new(88, 0);
    /// let writer = Fenced::new(&store, "report_2024", from_job_message);
    /// assert!(writer.write("done").await?.is_accepted());
    /// # Ok(()) }
    /// ```
    pub fn new(fence: &'f F, resource: impl Into<Arc<str>>, token: FencingToken) -> Self {
        Fenced {
            fence,
            resource: resource.into(),
            token,
        }
    }

    /// The token every write of this writer carries.
    ///
    /// ```
    /// # let store = zklock_core::fence::MemoryFence::<u8>::new();
    /// let t = zklock_core::FencingToken::new(3, 1);
    /// assert_eq!(zklock_core::fence::Fenced::new(&store, "r", t).token(), t);
    /// ```
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The resource name the store keeps the last token under.
    ///
    /// ```
    /// # let store = zklock_core::fence::MemoryFence::<u8>::new();
    /// let w = zklock_core::fence::Fenced::new(&store, "r", zklock_core::FencingToken::new(3, 0));
    /// assert_eq!(w.resource(), "r");
    /// ```
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// Applies `write` unless the store accepted a newer token for the resource; see
    /// [`Fence::fenced_write`].
    ///
    /// # Errors
    /// As [`Fence::fenced_write`], which refuses [`FencingToken::NONE`] (a hold of a manager
    /// without tokens) with [`FenceError::NoToken`] before the store is asked.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), zklock_core::fence::FenceError> {
    /// use zklock_core::fence::{Fenced, MemoryFence, Outcome};
    /// use zklock_core::FencingToken;
    ///
    /// let store = MemoryFence::new();
    /// let newer = Fenced::new(&store, "r", FencingToken::new(9, 0));
    /// let older = Fenced::new(&store, "r", FencingToken::new(8, 4));
    /// assert_eq!(newer.write(1).await?, Outcome::Accepted(()));
    /// assert_eq!(older.write(2).await?, Outcome::Stale { last: newer.token() });
    /// # Ok(()) }
    /// ```
    pub async fn write(&self, write: F::Write) -> Result<Outcome<F::Applied>, FenceError> {
        self.fence
            .fenced_write(&self.resource, self.token, write)
            .await
    }

    /// The last token the store accepted for the resource.
    ///
    /// # Errors
    /// As [`Fence::last_token`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), zklock_core::fence::FenceError> {
    /// # use zklock_core::fence::{Fenced, MemoryFence};
    /// let store = MemoryFence::new();
    /// let w = Fenced::new(&store, "r", zklock_core::FencingToken::new(9, 0));
    /// assert_eq!(w.last().await?, None);
    /// let _ = w.write(1).await?;
    /// assert_eq!(w.last().await?, Some(w.token()));
    /// # Ok(()) }
    /// ```
    pub async fn last(&self) -> Result<Option<FencingToken>, FenceError> {
        self.fence.last_token(&self.resource).await
    }
}

/// A writer with the token and resource of the innermost lock held by the current holder
/// frame (a body run by `with_lock`, `#[distributed_lock]` or `LockGuard::scope`); `None`
/// outside one. The frame-side twin of [`LockGuard::fenced`](crate::LockGuard::fenced), as
/// [`current_fencing_token`](crate::current_fencing_token) is of `fencing_token`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use zklock_core::fence::{self, MemoryFence};
///
/// let manager = zklock_core::LockManager::in_memory();
/// let store = MemoryFence::new();
/// assert!(fence::current(&store).is_none()); // no lock held here
/// manager
///     .with_lock("sku_3", async {
///         let writer = fence::current(&store).expect("inside with_lock");
///         assert_eq!(Some(writer.token()), zklock_core::current_fencing_token());
///         writer.write("sold").await
///     })
///     .await??;
/// # Ok(()) }
/// ```
pub fn current<F: Fence>(fence: &F) -> Option<Fenced<'_, F>> {
    let (token, path) = frame::current_hold()?;
    Some(Fenced::new(fence, path, token))
}
