//! Curator and kazoo on the same ZooKeeper lock paths; etcdctl lock and elect on etcd's.
//!
//! One test binary, `cargo test --test interop`: each file of `tests/interop/` is a module of it,
//! so its tests are named `<file>::<test>` (`cargo test --test interop -- curator_interop::`). The
//! helpers of `tests/common/` are included once, here, and the files use them through `crate::`.

#[path = "../common/mod.rs"]
mod common;

mod curator_interop;
mod etcd_interop;
mod kazoo_interop;
