//! What one server backend has of its own, and servers' clocks stepped. `redis_backend` and
//! `postgres_backend` each set the process's global manager (from `ZKLOCK_CONNECT`): they are
//! binaries of their own.
//!
//! One test binary, `cargo test --test backends`: each file of `tests/backends/` is a module of it,
//! so its tests are named `<file>::<test>` (`cargo test --test backends -- clock_steps::`). The
//! helpers of `tests/common/` are included once, here, and the files use them through `crate::`.

#[path = "../common/mod.rs"]
mod common;

mod clock_steps;
mod etcd_backend;
mod mysql_backend;
mod postgres_connections;
mod postgres_queue;
mod postgres_tokens;
mod redis_cluster;
mod redis_safety;
mod redis_sentinel;
