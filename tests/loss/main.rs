//! A lost hold is reported, never hidden.
//!
//! One test binary, `cargo test --test loss`: each file of `tests/loss/` is a module of it, so its
//! tests are named `<file>::<test>` (`cargo test --test loss -- held_node_watch::`). The helpers of
//! `tests/common/` are included once, here, and the files use them through `crate::`.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/faults.rs"]
mod faults;

mod held_node_watch;
mod hold_loss;
mod safety_downgrade;
mod safety_is_held;
mod safety_negotiated_timeout;
