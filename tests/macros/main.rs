//! `#[distributed_lock]` at run time. One test,
//! `macro_exclusion::the_default_manager_is_the_global_one`, sets the process's global manager; no
//! other test here uses it. The compile-time cases are zklock-macros' `macro_ui`.
//!
//! One test binary, `cargo test --test macros`: each file of `tests/macros/` is a module of it, so
//! its tests are named `<file>::<test>` (`cargo test --test macros -- macro_exclusion::`). The
//! helpers of `tests/common/` are included once, here, and the files use them through `crate::`.

#[path = "../common/mod.rs"]
mod common;

mod macro_exclusion;
mod macro_hold_loss;
mod macro_jobs;
mod macro_read_write;
mod macro_reentry;
mod macro_release;
