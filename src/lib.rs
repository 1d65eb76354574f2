//! # zklock
//!
//! Distributed locks on Apache ZooKeeper, for Rust services that run as several instances and
//! must not do the same work twice: RAII guards, reentrancy, read/write locks, fencing tokens,
//! timeouts, cancel safety and a signal when a hold is lost, in Apache Curator's wire format.
//!
//! The quickest way in is the [`distributed_lock`] attribute: the body of an `async fn` runs
//! under the lock on a key built from its arguments.
//!
//! ```no_run
//! use zklock::distributed_lock;
//!
//! #[distributed_lock("user_{id}", timeout = "5s")]
//! async fn update_profile(id: u64, name: String) -> Result<(), zklock::Error> {
//!     // no other instance runs this for the same user meanwhile
//!     let token = zklock::current_fencing_token(); // fence your writes with it: zklock::fence
//!     # let _ = (name, token);
//!     Ok(())
//! }
//!
//! # async fn run() -> zklock::Result<()> {
//! // The attribute uses the global manager unless given `manager = ...`.
//! zklock::set_global(zklock::LockManager::connect("127.0.0.1:2181").await?)?;
//! update_profile(42, "Ada".into()).await?;
//! # Ok(()) }
//! ```
//!
//! The same without the attribute, with a manager of your own:
//!
//! ```no_run
//! # async fn run() -> zklock::Result<()> {
//! let manager = zklock::LockManager::connect("127.0.0.1:2181").await?;
//! manager.with_lock("user_42", async { /* critical section */ }).await?;
//! let guard = manager.lock("user_42").await?;
//! # drop(guard); Ok(()) }
//! ```
//!
//! See [`zklock_core`] for the library and the README for a tour.
pub use zklock_core::*;
#[doc(inline)]
pub use zklock_macros::distributed_lock;
