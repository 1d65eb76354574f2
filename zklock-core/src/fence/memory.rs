//! The fence in memory: for users' tests of code that writes through a [`Fence`].

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use super::error::FenceError;
use super::{check_write, Fence, Outcome};
use crate::types::token::FencingToken;

/// A fenced map from resource name to a value, in this process: a stand-in for a real store
/// in unit tests, with the same rule (see the [module docs](super)). Cheap to clone; clones
/// share the map.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), zklock_core::fence::FenceError> {
/// use zklock_core::fence::{Fence, MemoryFence, Outcome};
/// use zklock_core::FencingToken;
///
/// let store = MemoryFence::new();
/// let (a, b) = (FencingToken::new(7, 0), FencingToken::new(7, 1)); // b: a local handoff
/// assert_eq!(store.fenced_write("cart_1", b, "b's").await?, Outcome::Accepted(()));
/// assert_eq!(store.fenced_write("cart_1", a, "a's").await?, Outcome::Stale { last: b });
/// assert_eq!(store.value("cart_1"), Some("b's"));
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct MemoryFence<V> {
    entries: Arc<Mutex<HashMap<String, (FencingToken, V)>>>,
}

impl<V> Clone for MemoryFence<V> {
    fn clone(&self) -> Self {
        MemoryFence {
            entries: self.entries.clone(),
        }
    }
}

impl<V> Default for MemoryFence<V> {
    fn default() -> Self {
        MemoryFence {
            entries: Arc::new(Mutex::new(HashMap::new())),
        }
    }
}

impl<V: Clone> MemoryFence<V> {
    /// An empty store.
    ///
    /// ```
    /// let store = zklock_core::fence::MemoryFence::<String>::new();
    /// assert_eq!(store.value("anything"), None);
    /// ```
    pub fn new() -> MemoryFence<V> {
        MemoryFence::default()
    }

    /// The value last written to `resource`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), zklock_core::fence::FenceError> {
    /// use zklock_core::fence::{Fence, MemoryFence};
    /// let store = MemoryFence::new();
    /// let _ = store.fenced_write("r", zklock_core::FencingToken::new(1, 0), 10u32).await?;
    /// assert_eq!(store.value("r"), Some(10));
    /// # Ok(()) }
    /// ```
    pub fn value(&self, resource: &str) -> Option<V> {
        self.lock().get(resource).map(|(_, v)| v.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (FencingToken, V)>> {
        // A panic elsewhere while holding it leaves the map whole (each write is one insert).
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<V: Clone + Send> Fence for MemoryFence<V> {
    type Write = V;
    type Applied = ();

    fn fenced_write(
        &self,
        resource: &str,
        token: FencingToken,
        write: V,
    ) -> impl Future<Output = Result<Outcome, FenceError>> + Send {
        let result = check_write(resource, token).map(|()| {
            let mut entries = self.lock();
            match entries.get(resource) {
                Some((last, _)) if token < *last => Outcome::Stale { last: *last },
                _ => {
                    entries.insert(resource.to_string(), (token, write));
                    Outcome::Accepted(())
                }
            }
        });
        std::future::ready(result)
    }

    fn last_token(
        &self,
        resource: &str,
    ) -> impl Future<Output = Result<Option<FencingToken>, FenceError>> + Send {
        std::future::ready(Ok(self.lock().get(resource).map(|(t, _)| *t)))
    }
}
