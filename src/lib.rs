//! # zklock
//!
//! Distributed locks for Rust services that run as several instances and must not do the same
//! work twice: on Apache ZooKeeper (in Apache Curator's wire format), on Redis (feature
//! `redis`), on PostgreSQL (feature `postgres`), or in memory for unit tests. RAII guards,
//! reentrancy scoped to holder frames, read/write locks, semaphores, multi-locks, leader
//! election, scheduled jobs, fencing tokens, timeouts, cancel safety and a signal when a hold is
//! lost.
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
//! let token = guard.fencing_token(); // send it with every write
//! guard.release().await?;
//! # let _ = token; Ok(()) }
//! ```
//!
//! # Backends
//!
//! The connect string of [`LockManager::connect`] picks the backend; everything else is the
//! same on each:
//!
//! | backend | connect string | a hold is |
//! | --- | --- | --- |
//! | ZooKeeper | `zk1:2181,zk2:2181[/chroot]` | an ephemeral node of the session, Curator's layout |
//! | Redis (feature `redis`) | `redis://host:6379[/db]` | a key with a lease, renewed while held |
//! | PostgreSQL (feature `postgres`) | `postgres://user@host/db` | a session-level advisory lock |
//! | in memory | [`LockManager::in_memory`] | an entry in this process's table, for unit tests |
//!
//! A fencing token is only safe if the store refuses stale ones: [`fence`] does that check in
//! PostgreSQL, Redis, ZooKeeper or memory, in the same atomic step as the write. [`metrics`]
//! lists what zklock emits through the `metrics` facade.
//!
//! # The guide
//!
//! The repository's `README.md` is the front door, with the table to choose a backend; its user
//! guide, in the `docs/` folder (`docs/README.md` is the index), has a page per topic: recipes
//! (`docs/recipes.md`), fencing (`docs/fencing.md`), each backend and what it promises under
//! each fault (`docs/backends/zookeeper.md`, `etcd.md`, `redis.md`, `postgres.md`, `memory.md`), operating
//! it: inspection, metrics, the `zklock` command (`docs/operating.md`), TLS and secrets
//! (`docs/security.md`), and performance
//! (`docs/performance.md`). The guide's and the README's examples are compiled as this crate's
//! doctests. This crate re-exports [`zklock_core`], the library, with the attribute.
#![cfg_attr(doctest, doc = include_str!("../README.md"))]
#![cfg_attr(doctest, doc = include_str!("../docs/recipes.md"))]
#![cfg_attr(doctest, doc = include_str!("../docs/fencing.md"))]
#![cfg_attr(doctest, doc = include_str!("../docs/backends/zookeeper.md"))]
#![cfg_attr(doctest, doc = include_str!("../docs/backends/redis.md"))]
#![cfg_attr(doctest, doc = include_str!("../docs/backends/postgres.md"))]
#![cfg_attr(doctest, doc = include_str!("../docs/backends/etcd.md"))]
#![cfg_attr(doctest, doc = include_str!("../docs/backends/mysql.md"))]
#![cfg_attr(doctest, doc = include_str!("../docs/backends/memory.md"))]
#![cfg_attr(doctest, doc = include_str!("../docs/operating.md"))]
#![cfg_attr(doctest, doc = include_str!("../docs/security.md"))]
#![cfg_attr(doctest, doc = include_str!("../docs/performance.md"))]
pub use zklock_core::*;
#[doc(inline)]
pub use zklock_macros::distributed_lock;
