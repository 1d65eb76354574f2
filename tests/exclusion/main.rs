//! One holder at a time, in order, with increasing tokens: ZooKeeper's queue, re-entry, the
//! in-process table.
//!
//! One test binary, `cargo test --test exclusion`: each file of `tests/exclusion/` is a module of
//! it, so its tests are named `<file>::<test>` (`cargo test --test exclusion --
//! confirm_free_handoff::`). The helpers of `tests/common/` are included once, here, and the files
//! use them through `crate::`.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/faults.rs"]
mod faults;

mod confirm_free_handoff;
mod fifo_and_herd;
mod linger;
mod local_queue;
mod mutex_exclusion;
mod reentrancy;
mod safety_downgrade_token;
mod safety_reaped_path;
