//! The adversary: each protocol cut at every request it sends (`ZKLOCK_CUTS=all`: every kind of cut
//! at every request, as `scripts/cut-sweep` runs it).
//!
//! One test binary, `cargo test --test cuts`: each file of `tests/cuts/` is a module of it, so its
//! tests are named `<file>::<test>` (`cargo test --test cuts -- cut_every_request::`). The helpers
//! of `tests/common/` are included once, here, and the files use them through `crate::`.

#[path = "../common/cluster.rs"]
mod cluster;
#[path = "../common/mod.rs"]
mod common;
#[path = "../common/cuts.rs"]
mod cuts;

mod cut_every_request;
mod cut_every_request_etcd;
mod cut_every_request_mysql;
mod cut_every_request_postgres;
mod cut_every_request_redis;
mod cut_every_request_redis_cluster;
mod cut_every_request_redis_sentinel;
mod safety_job_window;
