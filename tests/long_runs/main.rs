//! Soaks: long mixed runs with random faults.
//!
//! One test binary, `cargo test --test long_runs`: each file of `tests/long_runs/` is a module of
//! it, so its tests are named `<file>::<test>` (`cargo test --test long_runs -- soak::`). The
//! helpers of `tests/common/` are included once, here, and the files use them through `crate::`.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/faults.rs"]
mod faults;

mod soak;
mod soak_backends;
