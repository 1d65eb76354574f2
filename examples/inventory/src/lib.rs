//! # zklock-inventory: the anti-oversell demo
//!
//! The classic case for a distributed lock: stock for an item is 1, two orders arrive at once
//! on two instances of a service, both read 1, both sell. This crate is that service and a load
//! driver that shows it happen, and shows zklock stop it.
//!
//! - [`service`]: an axum HTTP service that places orders against stock kept in Redis, read
//!   and written in separate commands. With a [`LockManager`](zklock::LockManager) every order
//!   runs under the lock `sku_{sku}`, and its write goes through zklock's fence
//!   (`zklock::fence::current`, a `RedisFence` in [`store`]), which Redis checks in the same
//!   script as the write: a holder that lost its lock while paused cannot write stale stock.
//! - [`backends`]: the lock services compared (ZooKeeper, Redis, PostgreSQL): the service takes a connect
//!   string for any of them; the demo starts a throwaway server of each.
//! - [`driver`]: starts several instances as separate processes, sends them many concurrent
//!   orders for a few SKUs with demand well above stock, and reports per mode (without lock,
//!   with the lock on each backend) what was sold and oversold; its pause scenario freezes a
//!   lock holder (SIGSTOP) past its session timeout or lease and shows whether the next holder
//!   gets in and its stale write refused.
//! - Redis itself: the test kit's [`RedisServer`](zklock_testkit::RedisServer), a real
//!   `redis-server` on a free loopback port, stopped on drop.
//!
//! The `zklock-inventory` executable has the subcommands `serve` (one instance) and `demo`
//! (everything, with its own ZooKeeper, Redis and PostgreSQL servers); `scripts/demo` runs the latter.
#![warn(missing_docs)]

pub mod backends;
pub mod driver;
pub mod instances;
pub mod report;
pub mod scrape;
pub mod service;
pub mod store;
