//! Faults from outside: partitions, pauses, restarts, expiries, failovers, resets, cancellations.
//!
//! `fault_redis_sentinel` and `fault_redis_cluster` take turns within their module (one Sentinel
//! setup, one Cluster at a time), and their timing must not depend on how busy the cores are with
//! other tests' servers: `scripts/test` runs each of them in a process of its own with nothing
//! beside it (`cargo test --test faults -- fault_redis_sentinel::`). The etcd faults
//! (`tests/faults/fault_etcd/`) are a binary of their own, `fault_etcd`: its frozen holder runs
//! that executable again for one of its tests.
//!
//! One test binary, `cargo test --test faults`: each file of `tests/faults/` is a module of it, so
//! its tests are named `<file>::<test>` (`cargo test --test faults -- cancel_safety::`); the
//! Sentinel and Cluster faults are folders of one file per fault
//! (`fault_redis_cluster::slot_migration::…`). The helpers of `tests/common/` are included once,
//! here, and the files use them through `crate::`.

#[path = "../common/cluster.rs"]
mod cluster;
#[path = "../common/mod.rs"]
mod common;
#[path = "../common/failover.rs"]
mod failover;
#[path = "../common/faults.rs"]
mod faults;

mod cancel_safety;
mod fault_cancel_storm;
mod fault_leader_failover;
mod fault_lost_create_reply;
mod fault_partition;
mod fault_pause_holder;
mod fault_postgres_failover;
mod fault_redis_cluster;
mod fault_redis_sentinel;
mod fault_server_restart;
mod fault_session_expiry;
mod regression_connection_faults;
mod safety_deadlines;
mod safety_release_cancel;
