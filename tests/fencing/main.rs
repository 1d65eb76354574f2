//! Fences: stores refuse a late holder's writes.
//!
//! One test binary, `cargo test --test fencing`: each file of `tests/fencing/` is a module of it,
//! so its tests are named `<file>::<test>` (`cargo test --test fencing -- fence_encoding::`). The
//! helpers of `tests/common/` are included once, here, and the files use them through `crate::`.

#[path = "../common/cluster.rs"]
mod cluster;
#[path = "../common/mod.rs"]
mod common;
#[path = "../common/fence.rs"]
mod fence;

mod fence_encoding;
mod fence_etcd;
mod fence_postgres;
mod fence_postgres_example;
mod fence_redis;
mod fence_redis_cluster;
mod fence_zookeeper;
